"""Phi-3 (Phi-3-mini-4k-instruct's config.json): fused qkv_proj and gate_up_proj; Phi-3.5-mini's longrope."""

PUBLISHED = {"architectures": ["Phi3ForCausalLM"], "rope_theta": 10000.0, "rope_scaling": None,
             "sliding_window": 2047, "original_max_position_embeddings": 4096, "pad_token_id": 0}
MODEL_KEYS = {"sliding_window": None, "rope_theta": 10000.0, "resid_pdrop": 0.0, "embd_pdrop": 0.0,
              "attention_dropout": 0.0, "pad_token_id": 0}
# Phi-3.5-mini's rope_scaling as transformers 4 wrote it, with factors for the start-up checks' head dim
LONGROPE = {"type": "longrope", "short_factor": [1.0, 1.1, 1.2, 1.3, 1.5, 2.0, 3.0, 4.0],
            "long_factor": [1.1, 1.2, 1.5, 2.0, 3.0, 5.0, 8.0, 13.0]}
# the same at the models' sizes: factors for a head dim of 16, an original context of 32 (at least the tests'
# contexts, where Genie and transformers both take short_factor) within max_position_embeddings 64, so the
# attention factor is sqrt(1 + ln 2 / ln 32)
MODEL_LONGROPE = {"rope_type": "longrope", "rope_theta": 10000.0, "original_max_position_embeddings": 32,
                  "short_factor": [1.0, 1.05, 1.1, 1.3, 1.6, 2.2, 3.1, 4.5],
                  "long_factor": [1.1, 1.2, 1.5, 2.0, 3.0, 5.0, 8.0, 13.0]}
CASES = [
    ({"rope_scaling": LONGROPE, "original_max_position_embeddings": 32}, {},
     "longrope with export.context 64 above original_max_position_embeddings 32: Genie then takes long_factor"),
    ({"rope_scaling": {**LONGROPE, "attention_factor": 1.2}}, {}, "longrope attention_factor"),
    ({"rope_scaling": {**LONGROPE, "short_factor": [1.0] * 6}}, {}, "short_factor must list 8 factors"),
    ({"rope_scaling": LONGROPE, "sliding_window": 262144}, {}, None),   # Phi-3.5-mini's
    ({"partial_rotary_factor": 0.75}, {}, "partial_rotary_factor 0.75"),
    ({}, {"context": 4096}, "sliding_window 2047 is shorter than export.context 4096"),
]
