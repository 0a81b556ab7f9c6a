"""The chipset table: ``target.chipset`` -> the HTP device (``soc_model``, ``dsp_arch``) every compile and the
bundle's ``htp_backend_ext_config.json`` must name.

Values come from AI Hub apps' manual bundle guide, ExecuTorch's ``qc_schema.py`` and LiteRT's SoC table
(docs/toolchains.md, Chipsets). Rows no source confirms carry ``verified=False``; VTCM sizes are ExecuTorch's
(``None`` where no source gives one, in which case ``vtcm_mb: 0`` -- "the SoC's maximum" -- is the safe setting).
A wrong ``soc_model`` compiles without complaint and produces a binary that loads on the phone but may compute
garbage (the field report's "乱码"), which is why :func:`check_device` exists.
"""

from __future__ import annotations

import dataclasses
import re
from collections.abc import Mapping
from dataclasses import dataclass

from genie_build.errors import GenieBuildError
from genie_build.fileio import is_json_int
from genie_build.units import GIB, MIB

__all__ = ["ALIGNMENTS", "CHIPSETS", "Chipset", "HTP_CONTEXT_BYTES", "HTP_LOAD", "HTP_MANUAL", "HTP_MODEL_BYTES",
           "HTP_SESSION_BYTES", "LoadParams", "check_device", "load_params", "lookup"]

_DSP_ARCH = re.compile(r"^v\d{2}$")

_EXECUTORCH = "ExecuTorch qc_schema.py"
_AIHA_EXECUTORCH_LITERT = "AIHA manual_bundle.md; ExecuTorch qc_schema.py; LiteRT soc_table.h"


# How the load model (genie_build.plan.load_model) places mappings in a session: on the largest power of two not above
# the mapping's size (measured by a third party), or on a 2 MiB page alone.
ALIGNMENTS = ("power_of_two", "page")

# The device's size limits, read by the planner, the load model, the memory plan and the config's checks.
HTP_MANUAL = ("Qualcomm QNN HTP backend manual 80-63442-10 Rev AL, \"Multiple cDSP Sessions\" "
              "(https://docs.qualcomm.com/doc/80-63442-10/topic/htp_backend.html)")
# The manual: each cDSP session has a 4 GB virtual address space of which 3.75 GB is usable; "it is recommended that
# clients limit the heap required for a single context binary to be under 3 GB". Its "4 GB" is 2**32 bytes, so GiB.
HTP_SESSION_BYTES = 3840 * MIB
HTP_CONTEXT_BYTES = 3 * GIB
# qai-hub-models' LLM onboarding guide: the NPU "is a 32-bit co-processor. This restricts individual compiled models
# to approximately 1-2 GB" (the memory plan warns above the upper end).
HTP_MODEL_BYTES = 2 * GIB


@dataclass(frozen=True)
class LoadParams:
    """The device parameters of the load model, each a hypothesis with its source (docs/memory-plan.md bounds
    them by the field report's two observations)."""

    usable_bytes: int       # usable virtual address space of one cDSP session
    sessions: int           # sessions one process can use
    budget_bytes: int       # the loader moves to the next session once a context would take a session past this
    alignment: str          # one of ALIGNMENTS
    source: str


# One phone has been observed (SM8750, the field report); every chipset gets its parameters until a device
# measurement says otherwise.
HTP_LOAD = LoadParams(
    usable_bytes=HTP_SESSION_BYTES, sessions=2, budget_bytes=3_400_000_000, alignment="power_of_two",
    source="usable 3.75 GiB: Qualcomm QNN HTP backend manual 80-63442-10, \"Multiple cDSP Sessions\" (documented); "
           "budget about 3.4-3.5 GB and power-of-two alignment: TadayukiOkada/open-genie-server "
           "docs/PLATFORM_NOTES.md (measured by a third party on SA8255P); 2 sessions: the fewest under which the "
           "field report's 6-part bundle maps (inferred; the manual says the count depends on the SoC)")


@dataclass(frozen=True)
class Chipset:
    """One Snapdragon SoC as the HTP backend knows it.

    ``soc_model`` is the integer ``Qnn_SocModel_t`` id (a string there has hung a CDSP, per a public report);
    ``dsp_arch`` the Hexagon architecture ("v79"); ``vtcm_mb`` the VTCM size when a source gives it.
    """

    name: str
    soc_model: int
    dsp_arch: str
    vtcm_mb: int | None
    marketing_name: str
    source: str
    verified: bool
    load: LoadParams = HTP_LOAD


def _table(rows: tuple[Chipset, ...]) -> dict[str, Chipset]:
    """Index ``rows`` by upper-case name, refusing duplicate names or soc_models and malformed arches.

    Raises:
        ValueError: the table itself is inconsistent (a programming error, caught at import).
    """
    table: dict[str, Chipset] = {}
    soc_models: dict[int, str] = {}
    for row in rows:
        key = row.name.upper()
        if key in table:
            raise ValueError(f"chipset {row.name} listed twice")
        if row.soc_model in soc_models:
            raise ValueError(f"soc_model {row.soc_model} given to both {soc_models[row.soc_model]} and {row.name}")
        if not _DSP_ARCH.match(row.dsp_arch):
            raise ValueError(f"chipset {row.name}: dsp_arch {row.dsp_arch!r} is not like 'v79'")
        table[key] = row
        soc_models[row.soc_model] = row.name
    return table


CHIPSETS: dict[str, Chipset] = _table((
    Chipset("SM8550", 43, "v73", 8, "Snapdragon 8 Gen 2", _AIHA_EXECUTORCH_LITERT, True),
    Chipset("SM8650", 57, "v75", 8, "Snapdragon 8 Gen 3",
            f"{_AIHA_EXECUTORCH_LITERT}; AIHM test_llm_export_cli.py", True),
    Chipset("SM8750", 69, "v79", 8, "Snapdragon 8 Elite", _AIHA_EXECUTORCH_LITERT, True),
    Chipset("SM8850", 87, "v81", 8, "Snapdragon 8 Elite Gen 5", f"{_EXECUTORCH} (PR #15987); LiteRT", True),
    Chipset("SM8845", 97, "v81", 8, "Snapdragon 8 Gen 5", _EXECUTORCH, True),
    Chipset("SC8380XP", 60, "v73", None, "Snapdragon X Elite / X Plus",
            "AIHA manual_bundle.md; AIHM test; LiteRT", True),
    Chipset("SA8295P", 39, "v68", 8, "Snapdragon SA8295P (automotive)", _EXECUTORCH, True),
    Chipset("SA8255", 52, "v73", 8, "Snapdragon SA8255P (automotive)", _EXECUTORCH, True),
    Chipset("QCS9100", 77, "v73", 8, "Qualcomm QCS9100 (IoT)", _EXECUTORCH, True),
    Chipset("SM8450", 36, "v69", 8, "Snapdragon 8 Gen 1", _EXECUTORCH, True),
    Chipset("SM8475", 42, "v69", 8, "Snapdragon 8+ Gen 1", _EXECUTORCH, True),
    Chipset("SM8350", 30, "v68", 4, "Snapdragon 888", _EXECUTORCH, True),
    Chipset("QCM6490", 93, "v68", 2, "Qualcomm QCM6490 (IoT)", _EXECUTORCH, True),
    Chipset("QCS8550", 66, "v73", None, "Qualcomm QCS8550 (IoT)",
            "third-party note citing the QAIRT 2.50 table; AI Hub's proxy compiles it as SM8550 (43)", False),
    Chipset("SM8635", 68, "v73", None, "Snapdragon 8s Gen 3", "ExecuTorch draft PR #19216", False),
    Chipset("SM8735", 85, "v79", None, "Snapdragon 8s Gen 4", "ExecuTorch draft PR #19216", False),
))


def lookup(name: str) -> Chipset:
    """The chipset called ``name``, ignoring case (``"sm8750"`` finds SM8750).

    Raises:
        GenieBuildError: ``name`` is not in :data:`CHIPSETS`.
    """
    chipset = CHIPSETS.get(str(name).strip().upper())
    if chipset is None:
        raise GenieBuildError("target.chipset", f"unknown chipset {name!r}; known: {', '.join(CHIPSETS)}")
    return chipset


# report.load's keys -> LoadParams fields and the factor to bytes (None: a name)
_LOAD_KEYS = {"usable_mb": ("usable_bytes", MIB), "sessions": ("sessions", 1), "budget_mb": ("budget_bytes", MIB),
              "alignment": ("alignment", None)}


def load_params(chipset: str, overrides: Mapping[str, object]) -> LoadParams:
    """The chipset's load parameters with ``overrides`` (``report.load``: usable_mb, sessions, budget_mb,
    alignment; None keeps the chipset's).

    Raises:
        GenieBuildError: an unknown chipset, key or alignment, or a size that is not positive.
    """
    params = lookup(chipset).load
    given = {key: value for key, value in overrides.items() if value is not None}
    changes: dict[str, object] = {}
    for key, value in given.items():
        if key not in _LOAD_KEYS:
            raise GenieBuildError("report.load", f"unknown key {key!r}; known: {', '.join(_LOAD_KEYS)}")
        field, factor = _LOAD_KEYS[key]
        if factor is None:
            if value not in ALIGNMENTS:
                raise GenieBuildError("report.load", f"alignment {value!r} is not one of {ALIGNMENTS}")
            changes[field] = value
        elif isinstance(value, bool) or not isinstance(value, (int, float)) or value <= 0:
            raise GenieBuildError("report.load", f"{key} is {value!r}; expected a positive number")
        else:
            changes[field] = round(value * factor)
    if not changes:
        return params
    return dataclasses.replace(params, **changes, source=f"{params.source}; overridden by report.load {given}")


def check_device(soc_model: object, dsp_arch: object, chipset: str | Chipset) -> list[str]:
    """Compare a device section (as found in a config file or a bundle) with the chipset it should target.

    Args:
        soc_model: the ``soc_model`` value as read (any type: a string there is itself a problem).
        dsp_arch: the ``dsp_arch`` value as read.
        chipset: the intended chipset, by name or as a :class:`Chipset`.

    Returns:
        One sentence per problem (empty when the device matches), naming the chipset a swapped
        ``soc_model`` belongs to.

    Raises:
        GenieBuildError: ``chipset`` is an unknown name.
    """
    target = chipset if isinstance(chipset, Chipset) else lookup(chipset)
    problems = []
    if not is_json_int(soc_model):
        problems.append(f"soc_model {soc_model!r} is not an integer; {target.name} is {target.soc_model}")
    elif soc_model != target.soc_model:
        owner = _chipset_with_soc_model(soc_model)
        belongs = f" (that is {owner.name}'s, {owner.marketing_name})" if owner else ""
        problems.append(f"soc_model {soc_model}{belongs} does not match {target.name}'s {target.soc_model}")
    if not isinstance(dsp_arch, str) or dsp_arch.lower() != target.dsp_arch:
        problems.append(f"dsp_arch {dsp_arch!r} does not match {target.name}'s {target.dsp_arch!r}")
    return problems


def _chipset_with_soc_model(soc_model: int) -> Chipset | None:
    return next((row for row in CHIPSETS.values() if row.soc_model == soc_model), None)
