"""Mistral (Mistral-7B-v0.3's config.json): no sliding window, stated as null."""

PUBLISHED = {"architectures": ["MistralForCausalLM"], "rope_theta": 1000000.0, "sliding_window": None}
MODEL_KEYS = {"sliding_window": None, "rope_theta": 1000000.0}
CASES = [
    ({"rope_scaling": {"rope_type": "linear", "factor": 2.0}}, {}, "rope type 'linear'"),
    # without the key transformers' default window is 4096: null, as Mistral-7B-v0.3 states it, passes at 4096
    ({"sliding_window": None}, {"context": 4096}, None),
]
