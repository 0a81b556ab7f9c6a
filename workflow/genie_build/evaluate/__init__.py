"""Quality beside size: each variant's binaries against the float model on held-out text (:mod:`.evaluate`), the
bundle's perplexity by Genie itself (:mod:`.genie_accuracy`), and the evaluation table that puts them beside each
variant's size (:mod:`.evaluation_table`).
"""
