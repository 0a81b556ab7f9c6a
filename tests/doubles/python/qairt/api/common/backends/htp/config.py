"""Double of ``qairt.api.common.backends.htp.config`` (fields and defaults as qairt's sources)."""

from qairt._config import Config


class HtpGraphConfig(Config):
    FIELDS = {"name": Config.REQUIRED, "vtcm_size_in_mb": 0, "vtcm_size": 0, "fp16_relaxed_precision": 0,
              "hvx_threads": 0, "optimization_type": 2, "finalize_config": None, "dlbc": 0, "dlbc_weights": 0,
              "weights_packing": False, "num_cores": None}

    def validate(self) -> None:
        if not 1 <= self.optimization_type <= 3:
            raise ValueError(f"optimization_type {self.optimization_type} outside 1..3")


class HtpDeviceCoreConfig(Config):
    FIELDS = {"id": 0, "perf_profile": "burst", "rpc_control_latency": 100, "rpc_polling_time": 9999,
              "hmx_timeout_us": 300000, "adaptive_polling_time": 0}


class HtpDeviceConfig(Config):
    FIELDS = {"id": 0, "soc_model": 0, "dsp_arch": None, "pd_session": "unsigned", "profiling_level": "linting",
              "cores": []}

    def validate(self) -> None:
        if not isinstance(self.soc_model, int):
            raise TypeError(f"soc_model must be an int, got {self.soc_model!r}")


class HtpContextConfig(Config):
    FIELDS = {"weight_sharing_enabled": False, "file_read_memory_budget_in_mb": 0, "io_memory_estimation": False,
              "max_spill_fill_buffer_for_group": 0, "group_id": 0, "extended_udma": False}
