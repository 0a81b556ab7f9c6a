"""check-bundle's checks by the vendor's own libraries, where the ``onnxruntime-qnn`` wheel is installed
(docs/genie-checks.md).

- ``genie_config.json`` by Genie itself (:mod:`genie_build.qnn_wheel.genie`): ``GenieDialogConfig_createFromJson``
  reads it with Genie's JSON parser and validates it against the schemas libGenie embeds -- what a phone's Genie of
  the same version does before it loads anything.
- The backend extension config by the HTP extensions library (:mod:`genie_build.qnn_wheel.backend_extensions`),
  which Genie hands it to when it loads a bundle: an error it logs there is a warning on the phone after which Genie
  runs without the extensions (device, performance and share-resources settings silently dropped), so each is an
  error here.

genie-build's own key table (:mod:`genie_build.genie_config`, :mod:`genie_build.htp_extensions`) runs in every case.
Without the wheel (not installed, or not x86-64 Linux) the libraries' checks are skipped, and :func:`checkers` says
so and why: check-bundle prints it and records it in ``bundle_check.json``. A wheel that is installed but whose
library does not load is an error, never a skip.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path

from genie_build.bundle_files import MAX_DOCUMENT_BYTES, Finding, load_bundle_json
from genie_build.errors import GenieBuildError
from genie_build.fileio import read_regular
from genie_build.genie_config import GENIE_CONFIG_NAME, HTP_EXT_CONFIG_NAME
from genie_build.qnn_wheel import WheelInfo, backend_extensions, genie, locate_wheel

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
    return {GENIE_CONFIG_NAME: _checker(GENIE_RULE, genie.LIBRARY, None),
            HTP_EXT_CONFIG_NAME: _checker(EXTENSIONS_RULE, backend_extensions.LIBRARY,
                                          backend_extensions.layout_problem)}


def check_vendor(bundle: Path, extensions: str | None) -> list[Finding]:
    """The vendor's libraries' findings on ``genie_config.json`` and on the extension config ``extensions`` (a
    regular file of the bundle; None: no extension config to check). Nothing when the wheel is missing
    (:func:`checkers` says so).

    Only called on a bundle whose ``genie_config.json`` is a readable JSON object, and the extension config is
    handed on only when it parses too: the libraries get documents no deeper than Python's reader takes. The text is
    read again, bounded, and handed to them as it is, so that their line and column numbers are the file's.
    """
    found = checkers()
    findings = []
    if found[GENIE_CONFIG_NAME].skipped is None:
        findings += _genie_findings(bundle)
    if extensions is not None and found[HTP_EXT_CONFIG_NAME].skipped is None:
        findings += _extension_findings(bundle, extensions)
    return findings


def _checker(rule: str, library: str, layout_problem: Callable[[WheelInfo], str | None] | None) -> Checker:
    try:
        wheel = locate_wheel(_WHAT)
    except GenieBuildError as exc:
        return Checker(rule, library, (KEY_TABLE,), exc.problem)
    problem = layout_problem(wheel) if layout_problem is not None else None
    if problem is not None:
        return Checker(rule, library, (KEY_TABLE,), problem)
    try:
        described = _load(rule).describe()
    except GenieBuildError as exc:  # installed but broken: an error where the check runs (_genie_findings, ...)
        described = f"{library} (does not load: {exc.problem})"
    return Checker(rule, library, (described, KEY_TABLE))


def _load(rule: str) -> genie.Genie | backend_extensions.HtpExtensions:
    return genie.load_genie(_WHAT) if rule == GENIE_RULE else backend_extensions.load_htp_extensions(_WHAT)


def _genie_findings(bundle: Path) -> list[Finding]:
    try:
        library = genie.load_genie(_WHAT)
        text = read_regular(bundle / GENIE_CONFIG_NAME, inside=[bundle], max_bytes=MAX_DOCUMENT_BYTES)
    except GenieBuildError as exc:
        return [Finding(GENIE_RULE, "error", str(exc))]
    refusal = library.dialog_config_refusal(text.decode("utf-8"))
    if refusal is None:
        return []
    return [Finding(GENIE_RULE, "error", f"Genie refuses {GENIE_CONFIG_NAME} ({refusal.status_name}): {reason}")
            for reason in refusal.reasons]


def _extension_findings(bundle: Path, name: str) -> list[Finding]:
    if load_bundle_json(bundle, name)[0] is None:
        return []  # not JSON even to Python's reader (the files rule says so): nothing the library could use, and
        # the depth of what the library parses stays within what Python's reader took
    try:
        library = backend_extensions.load_htp_extensions(_WHAT)
        errors = library.extension_errors(read_regular(bundle / name, inside=[bundle], max_bytes=MAX_DOCUMENT_BYTES),
                                          name)
    except GenieBuildError as exc:  # the library unusable (a call of its interface failed), or the file unreadable
        return [Finding(EXTENSIONS_RULE, "error", str(exc))]
    if not errors:
        return []
    return [Finding(EXTENSIONS_RULE, "error", f"{name}: {backend_extensions.LIBRARY} logs errors reading it, after "
                                              f"which Genie runs without the extensions: {'; '.join(errors)}")]
