"""Qwen3 (Qwen3-0.6B's config.json): q_norm/k_norm, an explicit head_dim other than hidden / heads."""

PUBLISHED = {"architectures": ["Qwen3ForCausalLM"], "rope_theta": 1000000.0, "head_dim": 32,
             "attention_bias": False, "use_sliding_window": False, "sliding_window": None}
MODEL_KEYS = {"head_dim": "2 * hidden // heads"}
CASES = [
    ({"quantization_config": {"quant_method": "fp8", "fmt": "e4m3", "activation_scheme": "static",
                              "weight_block_size": [16, 16]}}, {}, "activation_scheme 'static'"),
]
