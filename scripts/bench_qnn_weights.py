"""What the vendor's HTP compiler (QNN 2.51, the onnxruntime-qnn wheel) stores per weight: the linear weights of one
Qwen2.5-7B decoder layer (q/k/v/o, gate/up/down: 233 M weights) as a QDQ graph of MatMuls, 4-bit or 8-bit per
output channel, compiled by the qnn-htp toolchain's backend with and without ``weights_packing``; bytes of the binary
per weight, and the field report's part 2 (three such layers) predicted from them
(docs/field-report-comparison.md, "What QNN 2.51 gives").

Usage::

    .venv-test/bin/python scripts/bench_qnn_weights.py [--layers 1] [--report bench/qnn-weights.json]
"""

from __future__ import annotations

import argparse
import json
import resource
import subprocess
import sys
import tempfile
import time
from pathlib import Path

import numpy as np
import onnx
from onnx import TensorProto, helper, numpy_helper

REPO = Path(__file__).resolve().parents[1]
HIDDEN, INTERMEDIATE, KV_WIDTH, AR = 3584, 18944, 512, 128
# (name, in, out): the layer's MatMul weights, [in, out] as the exports store them
LINEARS = (("q", HIDDEN, HIDDEN), ("k", HIDDEN, KV_WIDTH), ("v", HIDDEN, KV_WIDTH), ("o", HIDDEN, HIDDEN),
           ("gate", HIDDEN, INTERMEDIATE), ("up", HIDDEN, INTERMEDIATE), ("down", INTERMEDIATE, HIDDEN))
FIELD_PART_2_LAYERS = 3
MIB = 2 ** 20


def write_layer_graph(path: Path, layers: int, bits: int) -> int:
    """The layers' MatMuls (q, k, v from the input, o from q, up and gate from o, down from up; every output used)
    with uint16 activations and ``bits``-bit symmetric per-channel weights, the data beside it. Returns the number
    of weights."""
    rng = np.random.default_rng(0)
    nodes, inits, count = [], [], 0
    act_scale, act_zero = np.float32(1e-3), np.uint16(32768)
    inits += [numpy_helper.from_array(np.array(act_scale), "s"), numpy_helper.from_array(np.array(act_zero), "z")]

    def quantized(tensor: str) -> str:
        nodes.extend([helper.make_node("QuantizeLinear", [tensor, "s", "z"], [f"{tensor}_q"]),
                      helper.make_node("DequantizeLinear", [f"{tensor}_q", "s", "z"], [f"{tensor}_dq"])])
        return f"{tensor}_dq"

    def linear(name: str, source: str, rows: int, columns: int) -> str:
        nonlocal count
        limit = 2 ** (bits - 1) - 1
        values = rng.integers(-limit, limit + 1, (rows, columns), dtype=np.int8)
        if bits == 4:
            flat = values.reshape(-1).astype(np.uint8) & 0x0F
            weight = helper.make_tensor(f"{name}_w", TensorProto.INT4, (rows, columns),
                                        (flat[0::2] | (flat[1::2] << 4)).tobytes(), raw=True)
            zero = helper.make_tensor(f"{name}_wz", TensorProto.INT4, (columns,), bytes((columns + 1) // 2), raw=True)
        else:
            weight, zero = numpy_helper.from_array(values, f"{name}_w"), numpy_helper.from_array(
                np.zeros(columns, np.int8), f"{name}_wz")
        inits.extend([weight, zero, numpy_helper.from_array(np.full(columns, 1e-3, np.float32), f"{name}_ws")])
        nodes.append(helper.make_node("DequantizeLinear", [f"{name}_w", f"{name}_ws", f"{name}_wz"], [f"{name}_wd"],
                                      axis=1))
        nodes.append(helper.make_node("MatMul", [source, f"{name}_wd"], [f"{name}_y"]))
        count += rows * columns
        return quantized(f"{name}_y")

    hidden, outputs = quantized("x"), []
    for layer in range(layers):
        query, key, value = (linear(f"l{layer}_{name}", hidden, rows, columns) for name, rows, columns in LINEARS[:3])
        attention = linear(f"l{layer}_o", query, HIDDEN, HIDDEN)
        up, gate = (linear(f"l{layer}_{name}", attention, HIDDEN, INTERMEDIATE) for name in ("up", "gate"))
        hidden = linear(f"l{layer}_down", up, INTERMEDIATE, HIDDEN)
        outputs += [(key, KV_WIDTH), (value, KV_WIDTH), (gate, INTERMEDIATE)]   # every weight stays in the graph
    outputs.append((hidden, HIDDEN))
    graph = helper.make_graph(nodes, "layer", [helper.make_tensor_value_info("x", TensorProto.FLOAT, [1, AR, HIDDEN])],
                              [helper.make_tensor_value_info(name, TensorProto.FLOAT, [1, AR, width])
                               for name, width in outputs], inits)
    model = helper.make_model(graph, opset_imports=[helper.make_opsetid("", 21)])
    onnx.save(model, path, save_as_external_data=True, location=path.name + ".data")
    return count


def compile_one(graph: Path, out: Path, packing: bool) -> tuple[int, float, float]:
    """(bytes, seconds, peak RSS GB) of the qnn-htp backend compiling ``graph`` in a process of its own."""
    code = ("import sys; from pathlib import Path; "
            "from genie_build.toolchains.qnn_htp.backend import HtpTarget, prepare_context; "
            f"prepare_context({{'layer': Path({str(graph)!r})}}, Path({str(out)!r}), HtpTarget(69, 79), "
            f"weight_sharing=True, weights_packing={packing})")
    out.mkdir(parents=True)
    started = time.perf_counter()
    done = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True)
    seconds = time.perf_counter() - started
    if done.returncode:
        raise SystemExit(f"compile failed: {done.stderr[-2000:]}")
    peak = resource.getrusage(resource.RUSAGE_CHILDREN).ru_maxrss * 1024 / 1e9
    return next(out.glob("*.bin")).stat().st_size, seconds, peak


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--layers", type=int, default=1)
    parser.add_argument("--report", type=Path)
    args = parser.parse_args(argv)
    rows = []
    with tempfile.TemporaryDirectory() as scratch:
        for bits in (4, 8):
            graph = Path(scratch) / f"w{bits}" / "layer.onnx"
            graph.parent.mkdir()
            weights = write_layer_graph(graph, args.layers, bits)
            for packing in (False, True):
                size, seconds, peak = compile_one(graph, Path(scratch) / f"w{bits}-{packing}", packing)
                rows.append({"bits": bits, "weights_packing": packing, "weights": weights, "bytes": size,
                             "bytes_per_weight": size / weights, "seconds": seconds, "peak_rss_gb_so_far": peak,
                             "field_part_2_mib": size / weights * weights / args.layers * FIELD_PART_2_LAYERS / MIB})
                print(json.dumps(rows[-1]), flush=True)
    if args.report:
        args.report.write_text(json.dumps(rows, indent=1))
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
