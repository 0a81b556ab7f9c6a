"""The ``qnn-cli`` toolchain: the QAIRT SDK's command-line tools, run through ``subprocess`` with argument lists.

convert: ``qairt-converter --input_network <graph>.onnx --quantization_overrides E.json [--input_layout NAME
NONTRIVIAL per input] --float_bitwidth 16 --output_path converted/<graph>.dlc``, then ``qairt-quantizer --input_dlc
converted/<graph>.dlc --output_dlc <graph>.dlc --float_fallback --act_bitwidth 16 --bias_bitwidth 32`` (the
quantizer step ``qairt.convert`` runs itself). compile: ``qnn-context-binary-generator --backend libQnnHtp.so --model
libQnnModelDlc.so --dlc_path a.dlc,b.dlc --config_file <wrapper json> --input_output_tensor_mem_type memhandle
--binary_file NAME --output_dir DIR``, with the HTP options in the backend-extension JSON the wrapper points to --
the same JSON the ``qairt`` toolchain hands qairt (``qnn_sdk.backend_extension_config``). The field report found this path silently
ignores ``weights_packing`` for multi-graph binaries; it is kept so that the A/B table can show it (the
accounting stage flags an option that had no effect). See docs/toolchains.md.
"""

from __future__ import annotations

import json
import logging
from pathlib import Path
from typing import Any

from genie_build.fileio import write_json
from genie_build.toolchains.base import BinaryInfo, CompileOptions
from genie_build.toolchains.context_binary_json import CONTEXT_BINARY_UTILITY
from genie_build.toolchains.qnn_sdk import (
    CALIBRATION,
    INPUT_LAYOUT,
    IO_TENSOR_MEM_TYPE,
    backend_extension_config,
    check_graph_name,
    graph_inputs,
    inspect_with_sdk,
    link_into,
    locate_sdk,
    publish,
    publish_binary,
    require_file,
    require_output,
    run_tool,
    stage_onnx_as_graph,
    staging_directory,
)

__all__ = ["QnnCliToolchain"]

logger = logging.getLogger(__name__)

CONVERTER = "qairt-converter"
QUANTIZER = "qairt-quantizer"
GENERATOR = "qnn-context-binary-generator"
HTP_BACKEND_LIBRARY = "libQnnHtp.so"
DLC_MODEL_LIBRARY = "libQnnModelDlc.so"
HTP_EXTENSIONS_LIBRARY = "libQnnHtpNetRunExtensions.so"
EXECUTABLES = (CONVERTER, QUANTIZER, GENERATOR, CONTEXT_BINARY_UTILITY)
LIBRARIES = (HTP_BACKEND_LIBRARY, DLC_MODEL_LIBRARY, HTP_EXTENSIONS_LIBRARY)
BACKEND_EXTENSION_FILE = "htp_backend_extensions.json"
CONFIG_FILE = "qnn_context_binary_generator_config.json"


def _converter_command(converter: Path, network: Path, encodings: Path, float_bitwidth: int,
                       output: Path) -> list[str]:
    """The ``qairt-converter`` argument list: every graph input keeps its layout (``--input_layout NAME
    NONTRIVIAL``), as the vendor's LLM build asks of ``qairt.convert``."""
    layouts = [argument for name, _ in graph_inputs(network) for argument in ("--input_layout", name, INPUT_LAYOUT)]
    return [str(converter), "--input_network", str(network), "--quantization_overrides", str(encodings),
            *layouts, "--float_bitwidth", str(float_bitwidth), "--output_path", str(output)]


def _quantizer_command(quantizer: Path, converted: Path, output: Path) -> list[str]:
    """The ``qairt-quantizer`` argument list: what ``qairt.convert`` runs after converting AIMET encodings
    (``_convert.py``: ``float_fallback``, so tensors without an encoding stay float, and the vendor's LLM
    calibration bitwidths, activations 16 and biases 32, for what the encodings leave to the quantizer)."""
    return [str(quantizer), "--input_dlc", str(converted), "--output_dlc", str(output), "--float_fallback",
            "--act_bitwidth", str(CALIBRATION["act_precision"]), "--bias_bitwidth", str(CALIBRATION["bias_precision"])]


def _generator_command(generator: Path, backend: Path, model: Path, dlc_names: list[str], config_file: Path,
                       binary_name: str, output_dir: Path) -> list[str]:
    """The ``qnn-context-binary-generator`` argument list; it writes ``output_dir/binary_name.bin``. IO tensors are
    memory handles, as the vendor's weight-sharing compile sets them (``qnn_sdk.IO_TENSOR_MEM_TYPE``).

    ``dlc_names`` are joined with commas into one ``--dlc_path`` value, so they must be comma-free:
    callers pass the graph-named links they made in the working directory.
    """
    return [str(generator), "--backend", str(backend), "--model", str(model), "--dlc_path", ",".join(dlc_names),
            "--config_file", str(config_file), "--input_output_tensor_mem_type", IO_TENSOR_MEM_TYPE,
            "--binary_file", binary_name, "--output_dir", str(output_dir)]


def _config_file_wrapper(extensions_library: Path, backend_extension_path: Path) -> dict[str, Any]:
    """The JSON passed to ``--config_file``: it only points at the extensions library and the HTP JSON."""
    return {"backend_extensions": {"shared_library_path": str(extensions_library),
                                   "config_file_path": str(backend_extension_path)}}


class QnnCliToolchain:
    """``qairt-converter`` + ``qnn-context-binary-generator`` from ``$QAIRT_SDK_ROOT``."""

    name = "qnn-cli"

    def check_available(self) -> None:
        """Raises GenieBuildError naming every missing piece (SDK root, executables, host libraries)."""
        locate_sdk(self.name, EXECUTABLES, LIBRARIES)

    def convert(self, onnx_path: Path, encodings_path: Path, out_path: Path, *, graph_name: str,
                float_bitwidth: int) -> None:
        """ONNX part + encodings -> quantized DLC whose graph is called ``graph_name``: ``qairt-converter``, then
        ``qairt-quantizer``, the two steps ``qairt.convert`` makes. The converter's DLC keeps the graph's name as
        its file name too (in its own directory), as ``qairt.convert`` names its intermediate DLC.

        Raises:
            GenieBuildError: a missing input or tool, or a tool failed or wrote nothing.
        """
        sdk = locate_sdk(self.name, (CONVERTER, QUANTIZER))
        encodings = require_file(encodings_path)
        with staging_directory(out_path) as staging:
            network = stage_onnx_as_graph(onnx_path, graph_name, staging)
            (staging / "converted").mkdir()
            converted = staging / "converted" / f"{graph_name}.dlc"
            run_tool(_converter_command(sdk.executables[CONVERTER], network, encodings, float_bitwidth, converted),
                     cwd=staging, env=sdk.environment())
            require_output(converted, CONVERTER)
            produced = staging / f"{graph_name}.dlc"
            run_tool(_quantizer_command(sdk.executables[QUANTIZER], converted, produced), cwd=staging,
                     env=sdk.environment())
            publish(produced, out_path, QUANTIZER)

    def compile(self, converted: dict[str, Path], out_path: Path, options: CompileOptions) -> None:
        """DLCs keyed by graph name -> one context binary, checked to hold exactly those graphs.

        Raises:
            GenieBuildError: a missing input or tool, the generator failed or wrote nothing, or the binary's
                graph names differ from the configured ones.
        """
        sdk = locate_sdk(self.name, (GENERATOR, CONTEXT_BINARY_UTILITY), LIBRARIES)
        graph_names = [check_graph_name(name) for name in converted]
        dlcs = {name: require_file(path) for name, path in converted.items()}
        with staging_directory(out_path) as staging:
            # Graph-named links, passed relative to the working directory: paths with commas would split the list.
            dlc_names = [link_into(staging, f"{name}.dlc", path).name for name, path in dlcs.items()]
            backend_extension_path = staging / BACKEND_EXTENSION_FILE
            config_path = staging / CONFIG_FILE
            backend_extension = backend_extension_config(graph_names, options)
            write_json(backend_extension_path, backend_extension)
            write_json(config_path, _config_file_wrapper(sdk.libraries[HTP_EXTENSIONS_LIBRARY], backend_extension_path))
            logger.info("%s: %s", BACKEND_EXTENSION_FILE, json.dumps(backend_extension))
            run_tool(_generator_command(sdk.executables[GENERATOR], sdk.libraries[HTP_BACKEND_LIBRARY],
                                        sdk.libraries[DLC_MODEL_LIBRARY], dlc_names, config_path, out_path.stem,
                                        staging),
                     cwd=staging, env=sdk.environment())
            publish_binary(staging / f"{out_path.stem}.bin", out_path, GENERATOR, sdk, self.name, graph_names)

    def inspect(self, binary_path: Path) -> BinaryInfo:
        """Read a context binary back through ``qnn-context-binary-utility``."""
        return inspect_with_sdk(self.name, binary_path)
