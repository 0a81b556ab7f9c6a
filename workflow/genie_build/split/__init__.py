"""A model's whole graphs cut into the plan's parts: their weights checked first (:mod:`.check_model`), the cut that
streams them (:mod:`.split`), and the parts chained against the whole graph (:mod:`.verify_split`).
"""
