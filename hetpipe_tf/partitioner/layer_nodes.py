"""The values of a layer graph (layer_graph.py): tensor references, recorded call
arguments and nodes, with the byte counts of their tensors and weights."""

from __future__ import annotations

import dataclasses
from collections.abc import Mapping, Sequence
from typing import Any

import numpy as np
import tensorflow as tf


@dataclasses.dataclass(frozen=True, order=True)
class TensorRef:
    """A tensor of the graph: output `index` of node `node`; node -1 - k = model input k."""

    node: int
    index: int = 0

    @property
    def is_model_input(self) -> bool:
        return self.node < 0

    @property
    def input_index(self) -> int:
        """k for the model input -1 - k."""
        if self.node >= 0:
            raise ValueError(f"Not a model input. Received: ref={self}; use node >= 0 refs as node outputs.")
        return -1 - self.node


@dataclasses.dataclass(frozen=True)
class CallStructure:
    """The recorded call arguments of a node, with `TensorRef`s where tensors go.

    Lists and dicts keep the layer's own argument structure (e.g. `Add` takes one list).
    """

    args: tuple
    kwargs: Mapping[str, Any]

    def fill(self, values: Mapping[TensorRef, Any]) -> tuple[tuple, dict]:
        """(args, kwargs) with every TensorRef replaced by `values[ref]`."""
        return map_refs(self.args, values), dict(map_refs(dict(self.kwargs), values))


def map_refs(structure: Any, values: Mapping[TensorRef, Any]) -> Any:
    return map_leaves(structure, lambda v: values[v] if isinstance(v, TensorRef) else v)


@dataclasses.dataclass(frozen=True)
class LayerNode:
    """One call of a layer. Bytes are per sample for activations, absolute for weights."""

    index: int
    name: str
    class_name: str
    inputs: tuple[TensorRef, ...]
    output_shapes: tuple[tuple[int, ...], ...]
    output_dtypes: tuple[str, ...]
    output_bytes_per_sample: int
    param_bytes: int
    trainable_param_bytes: int
    layer_name: str
    call_index: int
    call_structure: CallStructure = dataclasses.field(compare=False, repr=False)
    # Why a nested model is one node although it is a model ("" for every other node).
    opaque: str = ""
    # A later call of a tied layer (trainable weights only): the bytes of the borrowed copy
    # of its weights and that copy's gradient, which its stage holds when the first call is
    # in another stage (pipeline/tied.py); the cost model charges them always (an upper
    # bound when both calls share a stage).
    tied_bytes: int = 0

    def output_bytes(self, index: int) -> int:
        """Bytes per sample of output `index`."""
        return tensor_bytes(self.output_shapes[index], self.output_dtypes[index])


def dtype_name(dtype: Any) -> str:
    return tf.as_dtype(dtype).name


def tensor_bytes(shape: Sequence[int], dtype: str) -> int:
    return int(np.prod(shape, dtype=np.int64)) * tf.as_dtype(dtype).size


def per_sample_shape(tensor: Any, where: str) -> tuple[int, ...]:
    shape = tuple(tensor.shape)[1:]
    if any(dim is None for dim in shape):
        raise ValueError(
            f"The layer graph needs fully defined per-sample shapes. Received: {where} "
            f"shape={tuple(tensor.shape)}; give keras.Input a shape without None "
            "(besides the batch dimension), or, for a model you cannot rebuild (a keras_hub "
            "task), use it as a layer of one that fixes the shape: "
            "x = keras.Input((seq_len,), dtype=...); keras.Model(x, model(x))."
        )
    return tuple(int(dim) for dim in shape)


def weight_bytes(weights: Sequence[Any]) -> int:
    seen: set[int] = set()
    total = 0
    for weight in weights:
        if id(weight) in seen:
            continue
        seen.add(id(weight))
        total += tensor_bytes(tuple(weight.shape), dtype_name(weight.dtype))
    return total



def map_leaves(structure: Any, fn: Any) -> Any:
    if isinstance(structure, dict):
        return {key: map_leaves(value, fn) for key, value in structure.items()}
    if isinstance(structure, tuple) and hasattr(structure, "_fields"):  # namedtuple
        return type(structure)(*(map_leaves(value, fn) for value in structure))
    if isinstance(structure, (list, tuple)):
        return type(structure)(map_leaves(value, fn) for value in structure)
    return fn(structure)
