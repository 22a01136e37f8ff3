"""A Keras model as a straight-line program of layer calls, cut into stages.

`Program.from_model` walks the model's functional graph (Sequential models through their
functional form) and lists every layer call in topological order with the tensors it reads,
as `Ref(producer, index)` (producer = node position, or -1-k for model input k). A stage
runs the calls of a contiguous node range: it receives the tensors crossing the cut before
its first node and emits those crossing the cut after its last node (skip connections that
jump over a stage pass through it unchanged). The node order follows the plan's layer names
(the partitioner's `LayerGraph` order) when given, so node ranges mean the same thing here
and in the plan.
"""

from __future__ import annotations

import dataclasses
from typing import Any, Mapping, Sequence

import keras

from hetpipe_tf.strategy import keras_shim


@dataclasses.dataclass(frozen=True, order=True)
class Ref:
    """A tensor of the program: output `index` of node `producer` (or model input -1-k)."""

    producer: int
    index: int = 0

    @property
    def is_model_input(self) -> bool:
        return self.producer < 0


@dataclasses.dataclass(frozen=True)
class ProgramNode:
    index: int
    name: str
    layer: Any = dataclasses.field(repr=False)
    keras_node: Any = dataclasses.field(repr=False)
    inputs: tuple[Ref, ...]
    num_outputs: int


class Program:
    """Layer calls of a model in topological order (see module docstring)."""

    def __init__(self, model, nodes: Sequence[ProgramNode], input_ids: Sequence[int],
                 output_refs: Sequence[Ref], outputs_struct: Any, ref_of: Mapping[int, Ref]):
        self.model = model
        self.nodes = tuple(nodes)
        self._input_ids = tuple(input_ids)
        self.output_refs = tuple(output_refs)
        self._outputs_struct = outputs_struct
        self._ref_of = dict(ref_of)
        consumers: dict[Ref, int] = {}
        for n in self.nodes:
            for r in n.inputs:
                consumers[r] = max(consumers.get(r, -2), n.index)
        self._last_consumer = consumers

    # --- construction ----------------------------------------------------------------
    @classmethod
    def from_model(cls, model, order: Sequence[str] | None = None) -> "Program":
        fn = keras_shim.functional_graph(model)
        kt_ref: dict[int, Ref] = {id(x): Ref(-1 - k, 0) for k, x in enumerate(fn.inputs)}
        raw = []
        for depth in sorted(keras_shim.nodes_by_depth(fn), reverse=True):
            for node in keras_shim.nodes_by_depth(fn)[depth]:
                if not node.operation or node.is_input:
                    continue
                raw.append(node)
        by_name: dict[str, Any] = {}
        for node in raw:
            name = node.operation.name
            if name in by_name:
                raise ValueError(
                    "The pipeline runtime cannot run a layer that is called more than once "
                    "(shared layer): its weights would belong to several stages. "
                    f"Received: layer {name!r} called {sum(n.operation.name == name for n in raw)} "
                    "times; use separate layers (or wrap the shared part in one sub-model "
                    "layer so it is one node).")
            by_name[name] = node
        if order is not None:
            order = list(order)
            if sorted(order) != sorted(by_name):
                missing = sorted(set(by_name) - set(order))
                extra = sorted(set(order) - set(by_name))
                raise ValueError(
                    "The plan does not match the model: their layers differ. Received: plan "
                    f"layers missing from the model: {extra[:5]}, model layers missing from "
                    f"the plan: {missing[:5]}; make a new plan for this model.")
            raw = [by_name[n] for n in order]
        nodes = []
        for i, node in enumerate(raw):
            refs = []
            for x in node.input_tensors:
                if id(x) not in kt_ref:
                    raise ValueError(
                        "The plan's layer order is not a topological order of the model: "
                        f"layer {node.operation.name!r} at position {i} reads a tensor "
                        "produced later. Received: order="
                        f"{[n.operation.name for n in raw][:i + 1]}...; make a new plan.")
                refs.append(kt_ref[id(x)])
            for k, y in enumerate(node.outputs):
                kt_ref[id(y)] = Ref(i, k)
            nodes.append(ProgramNode(i, node.operation.name, node.operation, node,
                                     tuple(refs), len(node.outputs)))
        outputs = [kt_ref[id(x)] for x in fn.outputs]
        return cls(model, nodes, [id(x) for x in fn.inputs], outputs,
                   keras_shim.outputs_struct(fn), kt_ref)

    # --- structure -------------------------------------------------------------------
    @property
    def layer_names(self) -> tuple[str, ...]:
        return tuple(n.name for n in self.nodes)

    @property
    def num_inputs(self) -> int:
        return len(self._input_ids)

    def cut(self, i: int) -> tuple[Ref, ...]:
        """Tensors produced at or before node i (model inputs count as before node 0) and
        read after node i, plus model outputs produced at or before i; sorted."""
        refs = set()
        for r, last in self._last_consumer.items():
            if r.producer <= i < last:
                refs.add(r)
        for r in self.output_refs:
            if r.producer <= i:
                refs.add(r)
        if i < 0:
            refs = {r for r in refs if r.is_model_input}
        return tuple(sorted(refs))

    def stage_layers(self, first: int, last: int) -> list:
        return [n.layer for n in self.nodes[first:last + 1]]

    # --- execution -------------------------------------------------------------------
    def run(self, first: int, last: int, env: dict[Ref, Any], training: bool) -> None:
        """Call the layers of nodes first..last, reading and writing tensors in `env`."""
        for n in self.nodes[first:last + 1]:
            tensor_dict = {id(x): env[r] for x, r in zip(n.keras_node.input_tensors, n.inputs)}
            args, kwargs = n.keras_node.arguments.fill_in(tensor_dict)
            if "training" in keras_shim.call_context_args(n.layer):
                kwargs["training"] = training
            outs = keras.tree.flatten(n.layer(*args, **kwargs))
            for k, y in enumerate(outs):
                env[Ref(n.index, k)] = y

    def model_inputs(self, x) -> list:
        """The model's inputs as a flat list in the order of the model's Input layers."""
        return list(keras_shim.standardize_inputs(self.model, x))

    def pack_outputs(self, flat: Sequence[Any]):
        return keras_shim.pack_outputs(self._outputs_struct, flat)
