"""check-bundle's checks by the vendor's own libraries, where the ``onnxruntime-qnn`` wheel is installed
(docs/genie-checks.md).

- ``genie_config.json`` by Genie itself (:mod:`genie_build.qnn_wheel.genie`): ``GenieDialogConfig_createFromJson``
  reads it with Genie's JSON parser and validates it against the schemas libGenie embeds -- what a phone's Genie of
  the same version does before it loads anything.
- The backend extension config by the HTP extensions library (:mod:`genie_build.qnn_wheel.backend_extensions`),
  which Genie hands it to when it loads a bundle: an error it logs there is a warning on the phone after which Genie
  runs without the extensions (device, performance and share-resources settings silently dropped), so each is an
  error here.

The libraries run in a child process (:mod:`genie_build.qnn_wheel.judge`): the extensions library crashes on some
files, which is then a finding like any other. genie-build's own key table (:mod:`genie_build.genie_config`,
:mod:`genie_build.htp_extensions`) runs in every case. Without the wheel (not installed, or not x86-64 Linux) the
libraries' checks are skipped, and :func:`checkers` says so and why: check-bundle prints it and records it in
``bundle_check.json``. A wheel that is installed but whose library does not load is an error, never a skip.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path

from genie_build.bundle.bundle_files import MAX_DOCUMENT_BYTES, Finding, load_bundle_json
from genie_build.errors import GenieBuildError
from genie_build.genie_config import GENIE_CONFIG_NAME, HTP_EXT_CONFIG_NAME
from genie_build.qnn_wheel import DISTRIBUTION, WheelInfo, backend_extensions, genie, locate_wheel
from genie_build.qnn_wheel.judge import judge

__all__ = ["Checker", "EXTENSIONS_RULE", "GENIE_RULE", "KEY_TABLE", "RULES", "check_vendor", "checkers"]

GENIE_RULE, EXTENSIONS_RULE = "genie-library", "htp-extensions-library"
RULES = {
    GENIE_RULE: f"Genie itself ({genie.LIBRARY} of the onnxruntime-qnn wheel, where installed) accepts "
                "genie_config.json: its JSON parser and the schemas it embeds (GenieDialogConfig_createFromJson)",
    EXTENSIONS_RULE: f"the HTP extensions library ({backend_extensions.LIBRARY} of the wheel, where installed) reads "
                     "the backend extension config without an error (after one, Genie runs without the extensions)",
}
KEY_TABLE = "genie-build's key table"
_WHAT = "the vendor's config checks"


@dataclass(frozen=True)
class Checker:
    """Who checks one of the bundle's configs: ``by``, the vendor's library first when it runs; ``skipped``, why it
    does not (None: it runs)."""

    rule: str
    library: str
    by: tuple[str, ...]
    skipped: str | None = None

    def line(self, name: str) -> str:
        """What the check-bundle log says about ``name``."""
        if self.skipped is None:
            return f"{name}: checked by {' and '.join(self.by)}"
        return f"{name}: checked by {KEY_TABLE} only; {self.library} skipped: {self.skipped}"

    def to_dict(self) -> dict:
        return {"by": list(self.by), **({"skipped": self.skipped} if self.skipped else {})}


def checkers() -> dict[str, Checker]:
    """The checker of each config: ``genie_config.json`` and ``htp_backend_ext_config.json``."""
    return {GENIE_CONFIG_NAME: _checker(GENIE_RULE, genie.LIBRARY, None, _describe_genie),
            HTP_EXT_CONFIG_NAME: _checker(EXTENSIONS_RULE, backend_extensions.LIBRARY,
                                          backend_extensions.layout_problem, _describe_extensions)}


def check_vendor(bundle: Path, extensions: str | None) -> list[Finding]:
    """The vendor's libraries' findings on ``genie_config.json`` and on the extension config ``extensions`` (a
    regular file of the bundle; None: no extension config to check). Nothing when the wheel is missing
    (:func:`checkers` says so).

    Only called on a bundle whose ``genie_config.json`` is a readable JSON object, and the extension config is
    handed on only when it parses too: the libraries get documents no deeper than Python's reader takes, read again
    (bounded) and handed to them as they are, so that their line and column numbers are the file's.
    """
    found = checkers()
    files = {}
    if found[GENIE_CONFIG_NAME].skipped is None:
        files["genie"] = GENIE_CONFIG_NAME
    if extensions is not None and found[HTP_EXT_CONFIG_NAME].skipped is None \
            and load_bundle_json(bundle, extensions)[0] is not None:
        files["extensions"] = extensions
    if not files:
        return []
    findings = []
    for kind, verdict in judge(bundle, files, MAX_DOCUMENT_BYTES).items():
        rule, library = ((GENIE_RULE, genie.LIBRARY) if kind == "genie"
                         else (EXTENSIONS_RULE, backend_extensions.LIBRARY))
        if verdict.failed is not None:
            findings.append(Finding(rule, "error", f"{files[kind]}: {library} could not judge it: {verdict.failed}"))
        elif kind == "genie":
            findings += [Finding(rule, "error", f"Genie refuses {GENIE_CONFIG_NAME} {problem}")
                         for problem in verdict.problems]
        elif verdict.problems:
            findings.append(Finding(rule, "error", f"{files[kind]}: {library} logs errors reading it, after which "
                                                   f"Genie runs without the extensions: {'; '.join(verdict.problems)}"))
    return findings


def _checker(rule: str, library: str, layout_problem: Callable[[WheelInfo], str | None] | None,
             describe: Callable[[WheelInfo], str]) -> Checker:
    try:
        wheel = locate_wheel(_WHAT)
    except GenieBuildError as exc:
        return Checker(rule, library, (KEY_TABLE,), exc.problem)
    problem = layout_problem(wheel) if layout_problem is not None else None
    if problem is not None:
        return Checker(rule, library, (KEY_TABLE,), problem)
    return Checker(rule, library, (describe(wheel), KEY_TABLE))


def _describe_genie(wheel: WheelInfo) -> str:
    try:
        return genie.load_genie(_WHAT).describe()
    except GenieBuildError as exc:  # installed but broken: the check itself then fails (check_vendor)
        return f"{genie.LIBRARY} (does not load: {exc.problem})"


def _describe_extensions(wheel: WheelInfo) -> str:
    return f"{backend_extensions.LIBRARY} ({DISTRIBUTION} {wheel.version}, QNN SDK {wheel.qnn_version})"
