"""The plan: the model cut into parts, and each part's calibration into units, before any weight is read or written.

- :mod:`.plan`: the ``plan`` stage, a graph pair's pieces found (:mod:`.boundaries`) and weighed; :mod:`.shape_plan`:
  a checkpoint's, from its ``config.json`` alone;
- :mod:`.weight_inventory`, :mod:`.precision`, :mod:`.recipes`: each piece's weights and their bytes under a recipe;
- :mod:`.auto_split`, :mod:`.planners`: the parts chosen, where the device maps them (:mod:`.load_model`);
- :mod:`.plan_file`, :mod:`.calibration_units`: what the plan writes, ``plan.json`` and ``calibration_units.json``.
"""
