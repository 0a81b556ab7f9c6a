"""The onnxruntime CPU session options every check, calibration and host run uses.

Each weight's float value is computed just before its consumer and not kept: no constant folding (it would
store every weight as float32 in the session, 2x a float16 model, more for 4-bit ones), priority order (the
default order runs every weight's Cast/DequantizeLinear before the first layer, so all float32 copies are
alive at once) and no CPU arena (it keeps a session's largest buffers after a run).

Threads follow the job's share of the machine: Snakemake exports ``OMP_NUM_THREADS`` as the job's ``threads``;
onnxruntime ignores that variable and would take every core, so a ``--cores 1`` build would still run its
checks on two.

A float32 graph checked against another computation (``verify_parts``) runs with ONNX Runtime's extended fusions
(:func:`float_check_options`): torch.onnx writes ``nn.Linear`` as a MatMul of a Transposed weight, and run unfused
that Transpose copies every weight at every run (14 of the 15 s of a token step of a Qwen2.5-7B-shaped part of a
layer and the LM head, and a transposed copy of the head in memory); fused, the MatMul reads the weight as stored.
"""


from __future__ import annotations

import os
from collections.abc import Mapping

import onnxruntime as ort

__all__ = ["THREADS_VARIABLE", "cpu_session_options", "float_check_options", "job_threads"]

THREADS_VARIABLE = "OMP_NUM_THREADS"


def job_threads(environ: Mapping[str, str] = os.environ) -> int:
    """The threads this process may use: ``OMP_NUM_THREADS`` if it is a positive integer, else 0 (onnxruntime's
    default, one per core)."""
    value = environ.get(THREADS_VARIABLE, "")
    return int(value) if value.isdigit() and int(value) > 0 else 0


def cpu_session_options() -> ort.SessionOptions:
    options = ort.SessionOptions()
    options.graph_optimization_level = ort.GraphOptimizationLevel.ORT_DISABLE_ALL
    options.execution_order = ort.ExecutionOrder.PRIORITY_BASED
    options.enable_cpu_mem_arena = False
    options.intra_op_num_threads = job_threads()
    options.inter_op_num_threads = 1
    return options


def float_check_options() -> ort.SessionOptions:
    """:func:`cpu_session_options` with ONNX Runtime's extended fusions, of which the one that matters is a MatMul
    of a Transposed weight run as one FusedMatMul reading the weight as stored. Without constant folding, which
    would store each transposed weight in the session, and without prepacking, which would store a packed copy of
    every weight: each weight is read from the mapped data file as the unfused session reads it. Fusions rewrite
    nodes into kernels of the same arithmetic, so a check of what a graph computes holds: only the order of a few
    float32 sums changes (measured: docs/export.md, "The verification")."""
    options = cpu_session_options()
    options.graph_optimization_level = ort.GraphOptimizationLevel.ORT_ENABLE_EXTENDED
    options.add_session_config_entry("optimization.disable_specified_optimizers", "ConstantFolding")
    options.add_session_config_entry("session.disable_prepacking", "1")
    return options
