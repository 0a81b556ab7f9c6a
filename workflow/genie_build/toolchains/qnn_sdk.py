"""What the ``qairt`` and ``qnn-cli`` toolchains share: the QAIRT SDK's layout, running its tools from argument
lists, staging a tool's output beside its final path, naming converted graphs, and reading a context binary back
through ``qnn-context-binary-utility``.

Staging: SDK tools write to paths of their own choosing, so they work in a scratch directory beside the final
output (same file system) and the finished file is renamed into place -- the same guarantee as
:mod:`genie_build.fileio`: nothing half-written ever sits at a final path.
"""

from __future__ import annotations

import contextlib
import logging
import os
import re
import shlex
import shutil
import subprocess
import tempfile
from collections.abc import Iterable, Iterator, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import onnx

from genie_build.errors import GenieBuildError
from genie_build.fileio import read_json
from genie_build.onnx_graph import external_data, load_graph, model_tensors
from genie_build.toolchains.base import SDK_ROOT_VARIABLE, BinaryInfo, CompileOptions
from genie_build.toolchains.context_binary_json import CONTEXT_BINARY_UTILITY, binary_info_from_utility_json

__all__ = ["CALIBRATION", "INPUT_LAYOUT", "IO_TENSOR_MEM_TYPE", "Sdk", "backend_extension_config", "check_graph_name",
           "graph_inputs", "inspect_with_sdk", "link_into", "locate_sdk", "publish", "publish_binary", "require_file",
           "require_output", "run_tool", "stage_onnx_as_graph", "staging_directory"]

logger = logging.getLogger(__name__)

HOST_PLATFORM = "x86_64-linux-clang"
SYSTEM_LIBRARY = "libQnnSystem.so"
STDERR_TAIL_LINES = 5

# The SDK may rewrite other characters in graph names, and a graph name must reach the binary unchanged
# (Genie and the per-graph options match on it); it also becomes a file name and a --dlc_path list item.
# What the vendor's own LLM build (qairt-dev 0.13.0: CompileConfig.set_mode("weight_sharing"),
# gen_ai_api/builders/htp_mixin.py) sets on every weight-shared compile, adopted by both SDK toolchains
# (docs/toolchains.md, "The vendor's LLM settings"): IO tensors in shared memory handles, the shared-buffer
# memory section, the core in burst mode with a 100 us RPC control latency, inputs left in their layout, and the
# calibration bitwidths.
IO_TENSOR_MEM_TYPE = "memhandle"
INPUT_LAYOUT = "NONTRIVIAL"  # every graph input, at convert (gen_ai_utils.get_input_layout): keep it as it is
# qairt.CalibrationConfig of the vendor's LLM convert (gen_ai_builder_htp.py): 16-bit activations, 32-bit biases
# where the encodings leave a tensor to the quantizer.
CALIBRATION = {"act_precision": 16, "bias_precision": 32}
MEMORY_TYPE = "shared_buffer"
DEVICE_CORE = {"core_id": 0, "perf_profile": "burst", "rpc_control_latency": 100}

_GRAPH_NAME = re.compile(r"^[A-Za-z_][A-Za-z0-9_]*$")


@dataclass(frozen=True)
class Sdk:
    """A located QAIRT SDK: its root and the tools and host libraries a toolchain asked for."""

    root: Path
    executables: dict[str, Path]
    libraries: dict[str, Path]

    def environment(self) -> dict[str, str]:
        """The environment the SDK's ``envsetup.sh`` gives its tools: host libraries and Python modules first."""
        env = dict(os.environ)
        env["LD_LIBRARY_PATH"] = _prepend(_lib_dir(self.root), env.get("LD_LIBRARY_PATH"))
        env["PYTHONPATH"] = _prepend(self.root / "lib" / "python", env.get("PYTHONPATH"))
        return env


def _bin_dir(root: Path) -> Path:
    return root / "bin" / HOST_PLATFORM


def _lib_dir(root: Path) -> Path:
    return root / "lib" / HOST_PLATFORM


def backend_extension_config(graph_names: Sequence[str], options: CompileOptions) -> dict[str, Any]:
    """The HTP backend-extension JSON of one compile, for both SDK toolchains (``qnn-cli`` writes it, ``qairt``
    builds its config objects from it), in the shape qairt-dev's ``HtpConfigHelper.to_backend_extension_dict``
    serializes: ``context`` a one-element list, one ``graphs`` entry per graph (so ``O``, ``weights_packing`` and
    ``vtcm_mb`` are per graph), the device with its core, the shared-buffer memory section. Only the variant's
    options vary, so an A/B between the toolchains compares the tools, not two JSON shapes."""
    return {
        "context": [{"weight_sharing_enabled": options.weight_sharing_enabled}],
        "graphs": [{"vtcm_mb": options.vtcm_mb, "O": options.optimization_type,
                    "weights_packing": options.weights_packing, "graph_names": [name]} for name in graph_names],
        "devices": [{"soc_model": options.soc_model, "dsp_arch": options.dsp_arch, "cores": [dict(DEVICE_CORE)]}],
        "memory": {"mem_type": MEMORY_TYPE},
    }


def _sdk_root(toolchain: str) -> Path:
    """``$QAIRT_SDK_ROOT`` as an absolute directory (tools run in staging directories).

    Raises:
        GenieBuildError: the variable is unset or does not name a directory.
    """
    value = os.environ.get(SDK_ROOT_VARIABLE, "")
    if not value:
        raise GenieBuildError(f"toolchain {toolchain}",
                              f"{SDK_ROOT_VARIABLE} is not set: unpack the QAIRT SDK and export "
                              f"{SDK_ROOT_VARIABLE}=<its directory> before running this toolchain")
    root = Path(value).absolute()
    if not root.is_dir():
        raise GenieBuildError(f"toolchain {toolchain}", f"{SDK_ROOT_VARIABLE}={value} is not a directory")
    return root


def locate_sdk(toolchain: str, executables: Sequence[str] = (), libraries: Sequence[str] = ()) -> Sdk:
    """Find the SDK and the named tools (``bin/x86_64-linux-clang/`` first, then ``PATH``) and host libraries
    (``lib/x86_64-linux-clang/``).

    Raises:
        GenieBuildError: the SDK root is missing, or any tool or library is; the message lists all of them.
    """
    root = _sdk_root(toolchain)
    found = {name: _find_executable(root, name) for name in executables}
    libs = {name: _lib_dir(root) / name for name in libraries}
    missing = [f"executable {name} (looked in {_bin_dir(root)} and PATH)"
               for name, path in found.items() if path is None]
    missing += [f"library {name} (looked in {_lib_dir(root)})" for name, path in libs.items() if not path.is_file()]
    if missing:
        raise GenieBuildError(f"toolchain {toolchain}", f"missing from the QAIRT SDK at {root}: {'; '.join(missing)}")
    return Sdk(root, {name: path for name, path in found.items() if path is not None}, libs)


def run_tool(argv: Sequence[str | os.PathLike[str]], *, cwd: Path, env: dict[str, str]) -> None:
    """Run one SDK tool from an argument list (never through a shell) and log what it printed.

    Raises:
        GenieBuildError: the tool could not be started or exited non-zero; the message names the tool,
            the exit code and the last lines of its stderr.
    """
    args = [os.fspath(arg) for arg in argv]
    tool = Path(args[0]).name
    logger.info("running %s", shlex.join(args))  # quoted for the log only; the call below takes the list
    try:
        completed = subprocess.run(args, cwd=cwd, env=env, capture_output=True, text=True, errors="replace",
                                   check=False)
    except OSError as exc:
        raise GenieBuildError(tool, f"cannot run {args[0]}: {exc.strerror or exc}") from exc
    for stream, text in (("stdout", completed.stdout), ("stderr", completed.stderr)):
        if text.strip():
            logger.info("%s %s:\n%s", tool, stream, text.rstrip())
    if completed.returncode != 0:
        raise GenieBuildError(tool, f"exited with code {completed.returncode}: "
                                    f"{_tail(completed.stderr or completed.stdout)}")


@contextlib.contextmanager
def staging_directory(out_path: Path) -> Iterator[Path]:
    """A scratch directory beside ``out_path`` (so :func:`publish` is a rename), removed afterwards.

    The path is absolute: tools run inside it, and Snakemake hands relative paths.
    """
    parent = out_path.absolute().parent
    parent.mkdir(parents=True, exist_ok=True)
    staging = Path(tempfile.mkdtemp(prefix=f".{out_path.name}.", suffix=".tmp", dir=parent))
    try:
        yield staging
    finally:
        shutil.rmtree(staging, ignore_errors=True)


def publish(produced: Path, out_path: Path, producer: str) -> None:
    """Rename a finished tool output into place.

    Raises:
        GenieBuildError: the producer reported success but the file is not there.
    """
    require_output(produced, producer)
    os.replace(produced, out_path)


def publish_binary(produced: Path, out_path: Path, producer: str, sdk: Sdk, toolchain: str,
                   graph_names: Sequence[str]) -> None:
    """Rename a finished context binary into place after checking it holds exactly ``graph_names``.

    Raises:
        GenieBuildError: no binary was written, it cannot be read back, or its graph names differ.
    """
    require_output(produced, producer)
    info = _inspect_context_binary(produced, sdk.executables[CONTEXT_BINARY_UTILITY], sdk.environment(), toolchain)
    _check_graph_names(info, graph_names, out_path)
    os.replace(produced, out_path)


def require_file(path: Path) -> Path:
    """``path`` made absolute (tools run in a staging directory), after checking it exists.

    Raises:
        GenieBuildError: ``path`` is not a file.
    """
    if not path.is_file():
        raise GenieBuildError(path, "file not found")
    return path.absolute()


def check_graph_name(graph_name: str) -> str:
    """Raises GenieBuildError when ``graph_name`` could be rewritten by the SDK or break a file name."""
    if not _GRAPH_NAME.match(graph_name):
        raise GenieBuildError(graph_name, "graph names may hold only letters, digits and '_' (and not start with "
                                          "a digit), so that the SDK keeps them unchanged")
    return graph_name


def link_into(directory: Path, name: str, target: Path) -> Path:
    """Symlink ``target`` (made absolute) as ``directory/name``; returns the link."""
    link = directory / name
    link.symlink_to(target.absolute())
    return link


def stage_onnx_as_graph(onnx_path: Path, graph_name: str, staging: Path) -> Path:
    """Copy an ONNX part into ``staging`` as ``<graph_name>.onnx``, with its external data files beside it.

    The SDK names the DLC graph after the ONNX file's stem (qairt-dev documents it: ``graph_name`` "if not
    specified, base name of model file will be used", ``converter_config.py``), and the part files are called
    ``part_NN_of_N.onnx`` -- so the converter is handed a file whose stem is the graph name. ``qairt.convert`` is
    also given ``graph_name=``; ``qairt-converter`` documents no such option, so for it the stem is the only
    way. The files are copied, not linked:
    onnx (>= 1.17; checked with 1.23) refuses external data reached through a symbolic link, through a file
    with several hard links, or outside the model's directory -- and the SDK reads ONNX with onnx.

    Raises:
        GenieBuildError: the ONNX file is missing or unreadable, or the graph name is unsafe.
    """
    source = require_file(onnx_path)
    staged = staging / f"{check_graph_name(graph_name)}.onnx"
    shutil.copyfile(source, staged)
    for location, data_file in sorted(_external_data_locations(source).items()):
        target = staging / location
        target.parent.mkdir(parents=True, exist_ok=True)
        shutil.copyfile(data_file, target)
    return staged


def _external_data_locations(onnx_path: Path) -> dict[str, Path]:
    """The external data files an ONNX model refers to, by ``location`` (read without loading the data): each
    resolved and checked by :func:`genie_build.onnx_graph.external_data` (inside the model's folder, a regular
    file, every tensor's range within it).

    Raises:
        GenieBuildError: the file is not a readable ONNX model, or a tensor's external data is not as it says.
    """
    model = load_graph(onnx_path)
    return {ref.location: ref.real_path for stored in model_tensors(model)
            if stored.tensor.data_location == onnx.TensorProto.EXTERNAL
            for ref in [external_data(stored, onnx_path)]}


def graph_inputs(onnx_path: Path) -> list[tuple[str, str]]:
    """``(name, datatype)`` of every graph input, the datatype spelled as the vendor's LLM build gives it to the
    converter (the ONNX type name lower-cased: ``"float"``, ``"int32"``; qairt-dev ``gen_ai_utils.get_input_layout``).

    Raises:
        GenieBuildError: the file is not a readable ONNX model.
    """
    model = load_graph(onnx_path)
    return [(value.name, onnx.TensorProto.DataType.Name(value.type.tensor_type.elem_type).lower())
            for value in model.graph.input]


def inspect_with_sdk(toolchain: str, binary_path: Path) -> BinaryInfo:
    """Read a context binary back through the SDK's own ``libQnnSystem.so`` where the SDK has it (in a child process:
    graphs, IO, spill-fill, the SoC; :func:`genie_build.toolchains.qnn_htp.toolchain.qnn_binary_info`), else
    through its ``qnn-context-binary-utility``."""
    sdk = locate_sdk(toolchain, (CONTEXT_BINARY_UTILITY,))
    library = _lib_dir(sdk.root) / SYSTEM_LIBRARY
    if library.is_file():
        from genie_build.toolchains.qnn_htp.toolchain import qnn_binary_info
        return qnn_binary_info(require_file(binary_path), toolchain, library)
    return _inspect_context_binary(require_file(binary_path), sdk.executables[CONTEXT_BINARY_UTILITY],
                                   sdk.environment(), toolchain)


def _inspect_context_binary(binary_path: Path, utility: Path, env: dict[str, str], toolchain: str) -> BinaryInfo:
    """Run ``qnn-context-binary-utility --context_binary X --json_file J`` and parse ``J``.

    Raises:
        GenieBuildError: the utility failed, wrote no JSON, or wrote JSON of an unexpected shape.
    """
    with tempfile.TemporaryDirectory(prefix="genie-build-inspect-") as scratch:
        json_path = Path(scratch) / "context_binary.json"
        run_tool([utility, "--context_binary", binary_path, "--json_file", json_path], cwd=Path(scratch), env=env)
        if not json_path.is_file():
            raise GenieBuildError(CONTEXT_BINARY_UTILITY, f"reported success but wrote no JSON for {binary_path}")
        document = read_json(json_path)
    return binary_info_from_utility_json(document, binary_path, binary_path.stat().st_size, toolchain)


def _check_graph_names(info: BinaryInfo, expected: Iterable[str], where: Path) -> None:
    """Raises GenieBuildError unless the binary holds exactly the graphs that were compiled into it.

    A graph whose name differs from its per-graph config silently loses that config (O, weights_packing,
    vtcm_mb fall back to defaults), so this is checked on every compile.
    """
    found, wanted = sorted(graph.name for graph in info.graphs), sorted(expected)
    if found != wanted:
        raise GenieBuildError(where, f"the compiled binary holds graphs {found} but {wanted} were configured: "
                                     "the DLC graph names differ from the configured names, so their per-graph "
                                     "options would not have been applied")


def require_output(produced: Path, producer: str) -> None:
    if not produced.is_file():
        found = sorted(path.name for path in produced.parent.iterdir())
        raise GenieBuildError(producer, f"reported success but wrote no {produced.name} "
                                        f"(its directory holds: {', '.join(found) or 'nothing'})")


def _find_executable(root: Path, name: str) -> Path | None:
    candidate = _bin_dir(root) / name
    if candidate.is_file() and os.access(candidate, os.X_OK):
        return candidate
    on_path = shutil.which(name)
    return Path(on_path) if on_path else None


def _prepend(path: Path, current: str | None) -> str:
    return os.pathsep.join([os.fspath(path), *([current] if current else [])])


def _tail(text: str) -> str:
    lines = [line.strip() for line in text.splitlines() if line.strip()]
    return " | ".join(lines[-STDERR_TAIL_LINES:]) or "(no output)"
