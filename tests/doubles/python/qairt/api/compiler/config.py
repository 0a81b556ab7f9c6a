"""Double of ``qairt.api.compiler.config``."""

from qairt._config import Config


class CompileConfig(Config):
    FIELDS = {"backend": Config.REQUIRED, "context_custom_configs": None, "debug": False,
              "device_custom_configs": None, "graph_custom_configs": None, "memory_custom_config": None,
              "group_context_config": None, "soc_details": None, "io_tensor_mem_type": "raw",
              "data_format_config": None, "log_level": None, "backend_binary_path": None}
