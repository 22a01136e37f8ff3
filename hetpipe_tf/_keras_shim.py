"""The one place that reads private Keras internals.

Keras 3 exposes a Functional model's layers (`model.layers`, `model.operations`) but
not its call graph: which call of which layer consumed which tensor, with which other
arguments. `model.get_config()` has the wiring, but it serialises non-tensor call
arguments (they would have to be deserialised again to re-call a layer) and fails for
layers whose config is not serialisable, so it is not enough to execute a node range.
Everything private that the rest of the package needs goes through `call_events`.
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
        # Sequential has no public graph; build() keeps an internal Functional of it.
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
    # Per-call nodes of shared layers exist only in the private depth map.
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


def is_symbolic_tensor(value: Any) -> bool:
    """True for the symbolic tensors (KerasTensor) that wire a Functional graph."""
    return isinstance(value, keras.KerasTensor)
