"""The bundle run as Genie runs it: on the host, by genie-build (:mod:`.run_bundle`, the host run, with what Genie's
runtime does of :mod:`.genie_runtime` and the comparison of :mod:`.near_ties`), and by the vendor's Genie itself
(:mod:`.genie_run`).
"""
