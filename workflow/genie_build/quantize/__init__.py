"""Each part's encodings, the quantization its convert applies: the source's own cut per part
(:mod:`.slice_encodings`, the embedding's output given its table's by :mod:`.embedding_encoding`), the demo's
calibrated (:mod:`.calibrate`), or a recipe's calibration chain on text, one unit at a time (:mod:`.calibrate_unit`,
fed by :mod:`.calibration_feeds`, with :mod:`.calibrate_tables` and :mod:`.window_stream`), merged per part
(:mod:`.part_encodings`) and held against the plan (:mod:`.check_plan`).
"""
