"""What ``htp_backend_ext_config.json`` may say about how the contexts load, and whether Genie's config lets it act.

The HTP backend's extension config has, beside ``devices`` and ``memory``, a ``context`` section (per-context
options) and a ``groupContext`` section (options of the contexts created together). Its keys, from Qualcomm's QNN
HTP backend manual 80-63442-10 and qairt-dev 0.13.0's ``HtpContextConfig`` / ``HtpGroupContextConfig``:

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

__all__ = ["CONTEXT_KEYS", "GROUP_CONTEXT_KEYS", "group_context", "share_resources_problems"]

GROUP_CONTEXT_KEYS = {"share_resources": bool, "reused_io_limit_mb": int}
CONTEXT_KEYS = {"weight_sharing_enabled": bool, "max_spill_fill_buffer_for_group": int, "group_id": int,
                "file_read_memory_budget_in_mb": int, "io_memory_estimation": bool, "init_acceleration": bool,
                "concurrent_deserialization_patch": bool, "lora_weight_sharing": bool,
                "lora_weight_sharing_ram_preload": bool, "reused_io_limit_mb": int, "extended_udma": bool}


def group_context() -> dict[str, Any]:
    """The ``groupContext`` section ``bundle.share_resources: true`` writes."""
    return {"share_resources": True}


def share_resources_problems(htp_config: dict, allow_async_init: object,
                             graph_switching: object = None) -> list[tuple[str, str]]:
    """(severity, message) for each problem of the extension config's ``context`` and ``groupContext`` sections,
    given Genie's ``QnnHtp.allow-async-init`` and ``QnnHtp.enable-graph-switching``."""
    problems: list[tuple[str, str]] = []
    for name, known in (("context", CONTEXT_KEYS), ("groupContext", GROUP_CONTEXT_KEYS)):
        section = htp_config.get(name)
        if section is None or isinstance(section, list) and name == "context":
            continue  # absent; or the list form qairt writes, one entry per group
        if not isinstance(section, dict):
            problems.append(("error", f"{name} must be an object, got {section!r}"))
            continue
        for key, value in section.items():
            if key not in known:
                problems.append(("error", f"{name} has key {key!r} that the HTP backend does not know "
                                          f"(known: {', '.join(known)})"))
            elif not isinstance(value, known[key]) or (known[key] is int and isinstance(value, bool)):
                problems.append(("error", f"{name}.{key} must be {known[key].__name__}, got {value!r}"))
    group = htp_config.get("groupContext")
    if isinstance(group, dict) and group.get("share_resources") is True and allow_async_init is not True:
        problems.append(("warning", "groupContext.share_resources is true but QnnHtp allow-async-init is not: "
                                    "Genie then creates the contexts one by one and the group option has no effect"))
    if isinstance(group, dict) and group.get("share_resources") is True and graph_switching is True:
        problems.append(("error", "groupContext.share_resources is true and so is QnnHtp enable-graph-switching: "
                                  "the HTP backend does not switch the graphs of contexts that share resources"))
    return problems
