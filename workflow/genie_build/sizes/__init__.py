"""What the context binaries weigh and whether the device maps them: each compiled binary accounted and the A/B size
table (:mod:`.sizes`), the memory plan of a variant (:mod:`.memory_plan`, shown by :mod:`.load_report`), and both
predicted from shapes alone (:mod:`.estimate`).
"""
