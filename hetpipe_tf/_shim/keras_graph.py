"""A Keras Functional model's call graph, read from its private node structure (Keras 3.15).

Keras 3 exposes a Functional model's layers (`model.layers`, `model.operations`) but
not its call graph: which call of which layer consumed which tensor, with which other
arguments. `model.get_config()` has the wiring, but it serialises non-tensor call
arguments (they would have to be deserialised again to re-call a layer) and fails for
layers whose config is not serialisable, so it is not enough to execute a node range:
the graph is read through `call_events`. The partitioner's layer graph and the stages'
program (`pipeline/program.py`) run a node range the way `Functional.call` does.
"""

from __future__ import annotations

import dataclasses
from typing import Any

import keras


@dataclasses.dataclass(frozen=True)
class CallEvent:
    """One call of an operation inside a model (a Keras `Node`, as plain data).

    `args` / `kwargs` are the recorded call arguments with the symbolic input tensors
    (KerasTensors) in place; `outputs` is the flat tuple of output KerasTensors.
    `call_index` counts the calls of `operation` (> 0 only for shared layers).
    """

    operation: Any
    call_index: int
    args: tuple
    kwargs: dict
    outputs: tuple


def functional_graph(model: keras.Model) -> keras.Model | None:
    """The Functional model that holds `model`'s graph, or None if there is none."""
    if isinstance(model, keras.Sequential):
        # Reason: Sequential has no public graph; build() keeps an internal Functional.
        return getattr(model, "_functional", None)
    if isinstance(model, keras.Model) and hasattr(model, "_nodes_by_depth"):
        return model
    return None


def call_events(functional: keras.Model) -> list[CallEvent]:
    """Every non-input call of the graph, in a topological order.

    The order is Keras' own (depth from the outputs, decreasing; ties in traversal
    order), which for graphs without shared layers equals `model.operations`.
    """
    operation_rank = {id(op): k for k, op in enumerate(functional.operations)}
    # Reason: per-call nodes of shared layers exist only in the private depth map.
    nodes_by_depth = functional._nodes_by_depth
    events = []
    for depth in sorted(nodes_by_depth, reverse=True):
        nodes = []
        for node in nodes_by_depth[depth]:
            if node.is_input:
                continue
            # A node's position among its operation's calls identifies shared calls.
            call_index = node.operation._inbound_nodes.index(node)
            nodes.append((operation_rank[id(node.operation)], call_index, node))
        nodes.sort(key=lambda item: (item[0], item[1]))
        for _, call_index, node in nodes:
            events.append(
                CallEvent(
                    operation=node.operation,
                    call_index=call_index,
                    args=tuple(node.arguments.args),
                    kwargs=dict(node.arguments.kwargs),
                    outputs=tuple(node.outputs),
                )
            )
    return events


def nested_functional(operation: Any) -> keras.Model | None:
    """The Functional graph a model used as a layer runs when called, or None when its call
    is Python code of its own (a subclassed Model, or a Functional subclass overriding call)."""
    from keras.src.models.functional import Functional

    # Reason: Functional (the class of keras.Model(inputs, outputs), of keras_hub backbones
    # and of Sequential's internal graph) is private; only its own call is a graph.
    if isinstance(operation, keras.Sequential):
        if type(operation).call is not keras.Sequential.call:
            return None
        return getattr(operation, "_functional", None)
    if isinstance(operation, Functional) and type(operation).call is Functional.call:
        return operation
    return None


def nested_inputs(functional: keras.Model, args: tuple, kwargs: dict) -> tuple[list | None, str]:
    """The recorded values a call of the nested `functional` feeds to its inputs, in the
    order of `functional.inputs`, or (None, why) when Keras' Functional.call would do more
    with them than hand them on (convert a dtype, adjust a rank, apply a mask, ...)."""
    kwargs = dict(kwargs)
    kwargs.pop("training", None)  # Functional.call passes the caller's training on, as we do
    # Layer.__call__ records the inputs' Keras masks (a structure of None when there are none).
    if all(m is None for m in keras.tree.flatten(kwargs.get("mask", None))):
        kwargs.pop("mask", None)
    if "inputs" in kwargs and not args:
        args = (kwargs.pop("inputs"),)
    if kwargs or len(args) != 1:
        extra = f"keywords {sorted(kwargs)}" if kwargs else f"{len(args)} positional arguments"
        return None, f"it is called with arguments besides its inputs ({extra})"
    inputs = args[0]
    # Reason: the mapping of a call's structure to the inputs mirrors the private
    # Functional._standardize_inputs (without its conversions, refused below).
    struct, flat_refs = functional._inputs_struct, list(functional.inputs)
    if isinstance(struct, list) and len(struct) == 1 and is_symbolic_tensor(inputs):
        inputs = [inputs]
    elif isinstance(inputs, dict) and not isinstance(struct, dict):
        names = [t.name for t in flat_refs]
        if not set(names) <= set(inputs):
            return None, f"its inputs {names} are not all in the dict given"
        inputs = [inputs[n] for n in names]
    flat = keras.tree.flatten(inputs)
    if len(flat) != len(flat_refs):
        return None, f"it gets {len(flat)} tensors for {len(flat_refs)} inputs"
    for x, ref in zip(flat, flat_refs):
        if not is_symbolic_tensor(x):
            return None, f"input {ref.name!r} is given a constant"
        if x.dtype != ref.dtype or len(x.shape) != len(ref.shape):
            return None, (f"input {ref.name!r} ({ref.dtype}, rank {len(ref.shape)}) is "
                          f"given a {x.dtype} tensor of rank {len(x.shape)} that Keras "
                          "would convert")
    return flat, ""


def output_specs(operation: Any, args: tuple, kwargs: dict) -> list:
    """The flat output specs (KerasTensors) of calling `operation` on specs, without
    recording a call in any graph (for shapes a nested model leaves undefined)."""
    return keras.tree.flatten(operation.compute_output_spec(*args, **kwargs))


def is_symbolic_tensor(value: Any) -> bool:
    """True for the symbolic tensors (KerasTensor) that wire a Functional graph."""
    return isinstance(value, keras.KerasTensor)


def keras_mask(tensor: Any) -> Any:
    """The Keras mask (Masking, Embedding(mask_zero=True), ...) a tensor carries, or None."""
    # Reason: Keras 3 keeps masks as a private tensor attribute; no public getter.
    from keras.src.backend.common.masking import get_keras_mask

    return get_keras_mask(tensor)


def set_keras_mask(tensor: Any, mask: Any) -> None:
    """Attach a Keras mask to a tensor, as a layer's call does for its outputs: a tensor that
    crossed a stage boundary (a tf.function's argument or result) has lost its mask."""
    # Reason: the private attribute's setter, as for keras_mask.
    from keras.src.backend.common.masking import set_keras_mask as _set

    _set(tensor, mask)


def outputs_struct(functional: keras.Model) -> Any:
    """The nesting of the model's outputs (list, dict, single tensor)."""
    # Reason: y_pred must be packed as Functional.call packs it; only kept privately.
    return functional._outputs_struct


def standardize_inputs(functional: keras.Model, x: Any) -> list:
    """The model's inputs as a flat list in the order of its Input layers."""
    # Reason: dict / list / single-tensor inputs map to Input layers as Functional does.
    return list(functional._standardize_inputs(x))


def all_layers(model: keras.Model) -> list:
    """Every layer of the model, nested ones included."""
    # Reason: model.layers lists only the top level.
    return list(model._flatten_layers(include_self=False))
