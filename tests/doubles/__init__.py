"""Recording doubles of the QAIRT SDK, for testing the ``qairt`` and ``qnn-cli`` toolchains without it.

- ``python/qairt_calls.py``: ``qairt.convert``/``load``/``compile`` (the calls that need the native SDK), recording
  every call and writing small JSON placeholders instead of DLCs/binaries; tests/qairt_api puts them into a
  ``qairt`` package beside qairt-dev's real config classes.
- fake executables (``qairt-converter``, ``qairt-quantizer``, ``qnn-context-binary-generator``,
  ``qnn-context-binary-utility``):
  Python scripts installed by :func:`install_fake_sdk` with this interpreter in their shebang; they record their
  argv (and the generator the JSON of ``--config_file`` and of the backend-extension file it points to) and
  write placeholders; the utility writes JSON shaped like the real one (see ``genie_build_doubles``).

Every record is one JSON line appended to ``$GENIE_BUILD_DOUBLE_LOG``. Setting ``$GENIE_BUILD_DOUBLE_FAIL`` to a
comma-separated list of tool or call names (``qnn-context-binary-generator``, ``qairt.convert``) makes those
fail: an executable exits 1 with a few stderr lines, a Python call raises ``RuntimeError``.
"""

from __future__ import annotations

import json
import sys
from collections.abc import Sequence
from pathlib import Path

import numpy as np
import onnx
from onnx import TensorProto, helper, numpy_helper

from genie_build.chipsets import lookup
from genie_build.toolchains.base import CompileOptions

FAKE_PYTHON_PATH = Path(__file__).resolve().parent / "python"
LOG_VARIABLE = "GENIE_BUILD_DOUBLE_LOG"
FAIL_VARIABLE = "GENIE_BUILD_DOUBLE_FAIL"
HOST_PLATFORM = "x86_64-linux-clang"
FAKE_SDK_VERSION = "2.51.0.251030"  # qairt-dev 0.13.0 accepts 2.46.0 and newer
PART_VOCAB, PART_HIDDEN = 16, 8
TOOLS = ("qairt-converter", "qairt-quantizer", "qnn-context-binary-generator", "qnn-context-binary-utility")
LIBRARIES = ("libQnnHtp.so", "libQnnModelDlc.so", "libQnnHtpNetRunExtensions.so")

_WRAPPER = """#!{python}
import sys
sys.path.insert(0, {path!r})
from genie_build_doubles import tool_main
sys.exit(tool_main({tool!r}, sys.argv[1:]))
"""


def install_fake_sdk(root: Path, tools: Sequence[str] = TOOLS, libraries: Sequence[str] = LIBRARIES) -> Path:
    """Lay out a fake QAIRT SDK under ``root``: ``sdk.yaml`` (the file qairt-dev reads the version from),
    executables in ``bin/x86_64-linux-clang/``, empty host libraries in ``lib/x86_64-linux-clang/``. Returns
    ``root``."""
    bin_dir, lib_dir = root / "bin" / HOST_PLATFORM, root / "lib" / HOST_PLATFORM
    bin_dir.mkdir(parents=True, exist_ok=True)
    lib_dir.mkdir(parents=True, exist_ok=True)
    (root / "sdk.yaml").write_text(f"version: {FAKE_SDK_VERSION}\n")
    for tool in tools:
        script = bin_dir / tool
        script.write_text(_WRAPPER.format(python=sys.executable, path=str(FAKE_PYTHON_PATH), tool=tool))
        script.chmod(0o755)
    for library in libraries:
        (lib_dir / library).write_bytes(b"")
    return root


def read_log(path: Path) -> list[dict]:
    """The recorded calls, oldest first (empty when nothing was recorded)."""
    if not path.exists():
        return []
    return [json.loads(line) for line in path.read_text().splitlines() if line.strip()]


def write_tiny_part(directory: Path, ar: int) -> tuple[Path, Path]:
    """A one-Gather ONNX part ``part_1_of_2.onnx`` with its weight in ``part_1_of_2.onnx.data`` (as the split
    stage lays parts out) and an AIMET 1.0.0 encodings file beside it. Returns (onnx, encodings)."""
    directory.mkdir(parents=True, exist_ok=True)
    table = np.arange(PART_VOCAB * PART_HIDDEN, dtype=np.float32).reshape(PART_VOCAB, PART_HIDDEN) / 64
    graph = helper.make_graph(
        [helper.make_node("Gather", ["model.embed_tokens.weight", "input_ids"], ["hidden"], axis=0)],
        "part",
        [helper.make_tensor_value_info("input_ids", TensorProto.INT32, [1, ar])],
        [helper.make_tensor_value_info("hidden", TensorProto.FLOAT, [1, ar, PART_HIDDEN])],
        [numpy_helper.from_array(table, "model.embed_tokens.weight")])
    onnx_path = directory / "part_1_of_2.onnx"
    onnx.save(helper.make_model(graph), onnx_path, save_as_external_data=True, all_tensors_to_one_file=True,
              location="part_1_of_2.onnx.data", size_threshold=0)
    encodings_path = directory / "part_1_of_2.encodings.json"
    encodings_path.write_text(json.dumps({
        "version": "1.0.0", "activation_encodings": [],
        "param_encodings": [{"name": "model.embed_tokens.weight", "dtype": "INT", "enc_type": "PER_TENSOR",
                             "bw": 8, "is_sym": True, "scale": [float(table.max()) / 127], "offset": [-128]}]}))
    return onnx_path, encodings_path


def compile_options(*, packing: bool = True, o_level: int = 3, chipset: str = "SM8750",
                    vtcm_mb: int = 0) -> CompileOptions:
    """A variant's compile options for ``chipset``, as the compile command builds them."""
    device = lookup(chipset)
    return CompileOptions(weights_packing=packing, optimization_type=o_level, weight_sharing_enabled=True,
                          vtcm_mb=vtcm_mb, soc_model=device.soc_model, dsp_arch=device.dsp_arch)
