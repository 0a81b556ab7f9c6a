"""A Hugging Face checkpoint exported part by part into the plan's parts: a part's graphs from transformers' own
modules (:mod:`.export`, in the ops and names Genie and AIMET take: :mod:`.canonical`, :mod:`.sequence_split`), its
graphs at the other context lengths (:mod:`.export_length`), the parts run against the checkpoint's modules
(:mod:`.verify_parts`), and what the graphs take of ``config.json`` (:mod:`.graph_config`).
"""
