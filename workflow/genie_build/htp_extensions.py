"""What ``htp_backend_ext_config.json`` may say, key by key, and whether Genie's config lets it act.

The keys and their types are those of the JSON schema the HTP extensions library embeds (libQnnHtpNetRunExtensions.so
of QNN 2.51, which reads the file for Genie), and of what the library reads beyond it (three more keys in
``devices[].cores[]``, the ``perf_profile`` names); where the ``onnxruntime-qnn`` wheel is installed check-bundle also
has the library itself read the file (:mod:`genie_build.bundle.check_vendor`). The HTP backend's extension config has,
beside ``devices`` and ``memory``, a ``context`` section (per-context options) and a ``groupContext`` section
(options of the contexts created together); from Qualcomm's QNN HTP backend manual 80-63442-10 and qairt-dev
0.13.0's ``HtpContextConfig`` / ``HtpGroupContextConfig``:

- ``groupContext.share_resources``: create the contexts as one group sharing resources, which the manual calls
  "ideal for large generative AI workloads with multiple splits" (``SHARE_RESOURCES`` with
  ``SEQUENTIAL_WITH_VA_OPTIMIZATION``); the Android ChatApp of quic/ai-hub-apps sets it for the 8 Elite
  (``apps/android/ChatApp/src/main/assets/htp_config/qualcomm-snapdragon-8-elite.json``).
- ``context.io_memory_estimation``: reserve a context's IO space when it is placed (sequential init).

Genie applies the group options only on its asynchronous path: with ``allow-async-init: true`` it creates the
contexts with ``contextCreateFromBinaryListAsync`` and the backend extensions' group configs (Genie SDK
``qnn-api/QnnApi.cpp``); with ``false`` it creates them one by one, so ``share_resources`` is inert (inferred from
that source: the ChatApp pairs the option with ``allow-async-init: false``).

Graph switching (Genie's ``QnnHtp.enable-graph-switching``, loading one context's graphs at a time) "can not be used
together with QNN_HTP_CONTEXT_CONFIG_OPTION_SHARE_RESOURCES" (the HTP manual), so the two together are an error.
"""

from __future__ import annotations

from typing import Any

__all__ = ["CONTEXT_KEYS", "CORE_KEYS", "GROUP_CONTEXT_KEYS", "MEMORY_TYPES", "PERF_PROFILES", "extension_problems",
           "group_context"]

# Each key with the type the schema of the HTP extensions library (libQnnHtpNetRunExtensions.so, QNN 2.51) gives it;
# tests/test_genie_library.py compares them with the schema read from the installed library.
GROUP_CONTEXT_KEYS = {"share_resources": bool, "share_resources_optimization_type": int, "reused_io_limit_mb": int}
CONTEXT_KEYS = {"contextKey": str, "weight_sharing_enabled": bool, "max_spill_fill_buffer_for_group": int,
                "group_id": int, "concurrent_group_registration": dict, "file_read_memory_budget_in_mb": int,
                "dsp_memory_profiling_enabled": bool, "io_memory_estimation": bool, "prepare_only": bool,
                "init_acceleration": bool, "skip_validation_on_binary_section": bool, "extended_udma": bool,
                "lora_weight_sharing": bool, "detachable_buffers_enabled": bool, "hard_detach_enabled": bool,
                "lora_weight_sharing_ram_preload": bool, "lora_preload_buffer_group": list, "reused_io_limit_mb": int,
                "reference_weight_sharing_enabled": bool, "graph_splitting_enabled": bool,
                "graph_splitting_configs": dict, "concurrent_deserialization_patch": str}
# devices[].cores[]: the schema's keys, and the three the library also reads there (core_id, core_type, device_id)
CORE_KEYS = {"core_id": int, "core_type": int, "device_id": int, "perf_profile": str, "rpc_control_latency": int,
             "rpc_polling_time": int, "hmx_timeout_us": int, "adaptive_polling_time": int, "ddr_perf_mode": bool,
             "custom": (dict, list), "hmxControl": dict}
# The perf_profile values the library takes (another is an error after which it falls back to high_performance;
# "custom" needs voltage corners genie-build never writes); llm_decode_* need Hexagon V79 or newer.
PERF_PROFILES = ("burst", "sustained_high_performance", "high_performance", "balanced", "low_balanced",
                 "high_power_saver", "power_saver", "low_power_saver", "extreme_power_saver", "system_settings",
                 "default", *(f"llm_decode_{name}" for name in (
                     "burst", "default", "sustained_high_performance", "high_performance", "balanced",
                     "low_balanced", "high_power_saver", "power_saver", "low_power_saver", "extreme_power_saver")))
MEMORY_TYPES = ("shared_buffer",)


def group_context() -> dict[str, Any]:
    """The ``groupContext`` section ``bundle.share_resources: true`` writes."""
    return {"share_resources": True}


def extension_problems(htp_config: dict, allow_async_init: object,
                       graph_switching: object = None) -> list[tuple[str, str]]:
    """(severity, message) for each problem of the extension config's ``context``, ``groupContext``, ``memory`` and
    ``devices[].cores[]``, given Genie's ``QnnHtp.allow-async-init`` and ``QnnHtp.enable-graph-switching``."""
    problems: list[tuple[str, str]] = []
    for name, known in (("context", CONTEXT_KEYS), ("groupContext", GROUP_CONTEXT_KEYS)):
        section = htp_config.get(name)
        entries = section if isinstance(section, list) and name == "context" else [section]  # qairt: one per group
        for index, entry in enumerate(entries):
            where = f"{name}[{index}]" if entries is section else name
            if entry is not None:
                problems += _keys_problems(entry, where, known)
    memory = htp_config.get("memory")
    if isinstance(memory, dict) and "mem_type" in memory and memory["mem_type"] not in MEMORY_TYPES:
        problems.append(("error", f"memory.mem_type is {memory['mem_type']!r}; the HTP backend takes "
                                  f"{', '.join(MEMORY_TYPES)}"))
    problems += _core_problems(htp_config.get("devices"))
    group = htp_config.get("groupContext")
    if isinstance(group, dict) and group.get("share_resources") is True and allow_async_init is not True:
        problems.append(("warning", "groupContext.share_resources is true but QnnHtp allow-async-init is not: "
                                    "Genie then creates the contexts one by one and the group option has no effect"))
    if isinstance(group, dict) and group.get("share_resources") is True and graph_switching is True:
        problems.append(("error", "groupContext.share_resources is true and so is QnnHtp enable-graph-switching: "
                                  "the HTP backend does not switch the graphs of contexts that share resources"))
    return problems


def _core_problems(devices: object) -> list[tuple[str, str]]:
    """Unknown or mistyped keys of ``devices[].cores[]`` and a ``perf_profile`` the library does not take
    (the devices' own soc_model and dsp_arch are the chipset rule's)."""
    problems: list[tuple[str, str]] = []
    for index, device in enumerate(devices if isinstance(devices, list) else []):
        cores = device.get("cores") if isinstance(device, dict) else None
        for core_index, core in enumerate(cores if isinstance(cores, list) else []):
            where = f"devices[{index}].cores[{core_index}]"
            problems += _keys_problems(core, where, CORE_KEYS)
            profile = core.get("perf_profile") if isinstance(core, dict) else None
            if isinstance(profile, str) and profile not in PERF_PROFILES:
                problems.append(("error", f"{where}.perf_profile is {profile!r}, which the HTP backend does not take "
                                          f"(it falls back to high_performance; known: {', '.join(PERF_PROFILES)})"))
    return problems


def _keys_problems(section: object, where: str, known: dict[str, type | tuple[type, ...]]) -> list[tuple[str, str]]:
    if not isinstance(section, dict):
        return [("error", f"{where} must be an object, got {section!r}")]
    problems = []
    for key, value in section.items():
        kind = known.get(key)
        if kind is None:
            problems.append(("error", f"{where} has key {key!r} that the HTP backend does not know "
                                      f"(known: {', '.join(known)})"))
        elif not isinstance(value, kind) or (kind is int and isinstance(value, bool)):
            problems.append(("error", f"{where}.{key} must be {_type_name(kind)}, got {value!r}"))
    return problems


def _type_name(kind: type | tuple[type, ...]) -> str:
    return " or ".join(item.__name__ for item in kind) if isinstance(kind, tuple) else kind.__name__
