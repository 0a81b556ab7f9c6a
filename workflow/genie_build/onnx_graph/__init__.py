"""Load and check ONNX graphs without their weights.

Everything here reads the graph protobuf only (``load_external_data=False``); weight bytes are touched
only to hash them, streamed in chunks, so memory stays bounded by the graph, not the model.

The package, in import order: :mod:`~genie_build.onnx_graph.model` (loading, graph IO, initializer specs),
:mod:`~genie_build.onnx_graph.tensors` (every stored tensor, subgraphs), :mod:`~genie_build.onnx_graph.external`
(external data: resolving, opening, checking), :mod:`~genie_build.onnx_graph.values` (streamed hashes and the
finite check), :mod:`~genie_build.onnx_graph.sharing` (the prompt and token graphs' shared weights) and
:mod:`~genie_build.onnx_graph.layouts` (tensor names and AIMET's channel axes). Import from
``genie_build.onnx_graph``: every name below is re-exported here. The check-model stage is
:mod:`genie_build.split.check_model`.
"""

from __future__ import annotations

from genie_build.onnx_graph.external import (ExternalData, check_external_data, external_data, external_data_files,
                                             model_folders, open_external_data)
from genie_build.onnx_graph.layouts import (GraphTensors, WeightLayout, consumer_layouts, graph_tensors,
                                            part_tensor_names, read_graph_tensors)
from genie_build.onnx_graph.model import (Dim, EmbeddingGather, GraphIO, InitializerSpec, Shape, TensorSpec,
                                          ar_and_context_length, dtype_name, embedding_gather, graph_io,
                                          initializer_specs, load_graph, tensor_shapes)
from genie_build.onnx_graph.sharing import check_same_weight_names, check_same_weights, check_shared_initializers
from genie_build.onnx_graph.tensors import StoredTensor, model_tensors, subgraphs
from genie_build.onnx_graph.values import FLOAT_TYPES, require_finite, scan_tensor, tensor_sha256

__all__ = ["Dim", "EmbeddingGather", "ExternalData", "FLOAT_TYPES", "GraphIO", "GraphTensors", "InitializerSpec",
           "Shape", "StoredTensor", "TensorSpec", "WeightLayout", "ar_and_context_length", "check_external_data",
           "check_same_weight_names", "check_same_weights", "check_shared_initializers", "consumer_layouts",
           "dtype_name", "embedding_gather", "external_data", "external_data_files", "graph_io", "graph_tensors",
           "initializer_specs", "load_graph", "model_folders", "model_tensors", "open_external_data",
           "part_tensor_names", "read_graph_tensors", "require_finite", "scan_tensor", "subgraphs",
           "tensor_sha256", "tensor_shapes"]
