"""Llama (Llama-3.2-1B's config.json): Llama 3's ``llama3`` RoPE scaling."""

from family_cases.phi3 import LONGROPE

PUBLISHED = {"architectures": ["LlamaForCausalLM"], "rope_theta": 500000.0, "attention_bias": False,
             "mlp_bias": False, "rope_scaling": {"rope_type": "llama3", "factor": 32.0, "low_freq_factor": 1.0,
                                                 "high_freq_factor": 4.0, "original_max_position_embeddings": 8192}}
# a small original context, so that llama3 scaling changes the RoPE frequencies of the positions the tests use
MODEL_ROPE = {"rope_type": "llama3", "rope_theta": 500000.0, "factor": 8.0, "low_freq_factor": 1.0,
              "high_freq_factor": 4.0, "original_max_position_embeddings": 16}
MODEL_KEYS = {"rope_parameters": MODEL_ROPE}
CASES = [
    ({"rope_scaling": {"rope_type": "yarn", "factor": 4.0}}, {}, "rope type 'yarn'"),
    ({"rope_scaling": LONGROPE, "original_max_position_embeddings": 4096}, {},
     "rope type 'longrope' is not supported for llama"),
]
