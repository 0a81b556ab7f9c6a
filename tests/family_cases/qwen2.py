"""Qwen2 (Qwen2.5-0.5B's config.json): q/k/v biases, a sliding window it does not use."""

PUBLISHED = {"architectures": ["Qwen2ForCausalLM"], "rope_theta": 1000000.0, "use_sliding_window": False,
             "sliding_window": 32768, "max_window_layers": 21}
MODEL_KEYS: dict = {}
CASES = [
    ({"use_sliding_window": True, "sliding_window": 32}, {}, "sliding_window 32"),
]
