"""The built-in demo model, the source when the config names no other: its prompt and token graphs and
``config.json`` (:mod:`.demo`) and a tokenizer trained for it on a shipped corpus (:mod:`.train_tokenizer`).
"""
