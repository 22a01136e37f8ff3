"""The model's `LayerGraph` as the pipeline runtime runs it: node ranges as stages.

The graph itself (node order, `TensorRef`s, calling a node with `training`) is the
partitioner's `LayerGraph`, so node ranges mean the same thing here and in plans. This
module adds only what running the graph in stages needs:

- `Program.cut(i)`: the tensors the stage ending at node i hands to the next stage. Unlike
  `LayerGraph.cut_tensors` it also carries the model outputs produced at or before node i,
  so that the last stage has every output for the loss. `cut(-1)` is what stage 0 receives
  (the model inputs the graph reads), `cut(L - 1)` is what the last stage emits (the model
  outputs). Skip connections that jump over a stage pass through it unchanged.
- Feeding the model's inputs to stage 0 and packing y_pred as Keras' Functional does.
- Keras masks (Masking, Embedding(mask_zero=True)): a tensor's mask is a tensor of the
  graph (`LayerGraph.masks`) that crosses a cut with it; a stage attaches it again to the
  tensor before its nodes read it (a tf.function's arguments carry no mask), and y_pred
  gets its outputs' masks, which Keras' losses and metrics read.
- Whether the stages compile their tasks with XLA (`jit_compile`, the model's
  `compile(jit_compile=...)` as the strategy read it: strategy/xla.py).
- Refusing a split that puts the calls of one shared layer with non-trainable state in
  different stages (tied trainable weights may be split: `tied.py`).
"""

from __future__ import annotations

from typing import Any, MutableMapping, Sequence

import keras

from hetpipe_tf._shim import keras_graph
from hetpipe_tf.partitioner.layer_graph import LayerGraph, TensorRef


def check_shared_layers_kept_together(graph: LayerGraph, bounds: Sequence[tuple[int, int]]
                                      ) -> None:
    """Raise ValueError if the calls of a shared layer with state other than trainable
    weights (BatchNorm statistics, a seed) fall in different stages (`bounds`: each stage's
    first..last node): that state exists once and each call updates it in order. Tied
    trainable weights (embeddings) may be split: a later stage borrows them (tied.py)."""
    stage_of = {}
    for j, (first, last) in enumerate(bounds):
        for i in range(first, last + 1):
            stage_of[i] = j
    for name, (first, last) in graph.shared_layers.items():
        calls = [n.index for n in graph.nodes if n.layer_name == name]
        stages = sorted({stage_of[i] for i in calls})
        if len(stages) > 1 and not all(graph.allowed_cut(c) for c in range(first, last)):
            allowed = [c for c in range(len(graph) - 1) if graph.allowed_cut(c)]
            raise ValueError(
                "A shared layer with state other than trainable weights must run its calls "
                "in one stage: that state exists once and each call updates it in order. "
                f"Received: layer {name!r} called at "
                f"nodes {calls} ({[graph.nodes[i].name for i in calls]}), placed in stages "
                f"{stages}; cut only after nodes {_ranges(allowed)} (the planner does), or "
                "untie the weights (separate layers).")


def _ranges(indices: Sequence[int]) -> str:
    if not indices:
        return "none (the model cannot be split)"
    out, start = [], indices[0]
    for a, b in zip(indices, [*indices[1:], None]):
        if b != a + 1:
            out.append(str(start) if start == a else f"{start}-{a}")
            start = b
    return ", ".join(out)


class Program:
    """A model's LayerGraph with the runtime's cuts, inputs and outputs (module docstring)."""

    def __init__(self, graph: LayerGraph, model: keras.Model, jit_compile: bool = False):
        self.graph = graph
        self.model = model
        self.jit_compile = bool(jit_compile)   # every stage's tasks compiled by XLA
        self._functional = keras_graph.functional_graph(model)
        self._input_refs = self.cut(-1)
        self._output_refs = self.cut(len(graph) - 1)

    @classmethod
    def from_model(cls, model: keras.Model, jit_compile: bool = False) -> Program:
        return cls(LayerGraph.from_model(model), model, jit_compile)

    @property
    def layer_names(self) -> tuple[str, ...]:
        return tuple(node.name for node in self.graph.nodes)

    def cut(self, i: int) -> tuple[TensorRef, ...]:
        """The tensors crossing the cut after node i (-1 <= i < L), sorted: those produced
        at or before i and read after i, plus the model outputs produced at or before i."""
        graph = self.graph
        if i < 0:  # before node 0: the model inputs that are read (or are outputs)
            crossing = {r for n in graph.nodes for r in n.inputs if r.is_model_input}
        elif i < len(graph) - 1:
            crossing = set(graph.cut_tensors(i))
        else:  # after the last node: nothing is read any more
            crossing = set()
        crossing.update(r for r in graph.outputs if r.node <= i)
        # A crossing tensor's mask goes with it if it exists by then (else a later stage
        # computes it from what crosses, as the model does).
        crossing.update(graph.masks[r] for r in list(crossing)
                        if r in graph.masks and graph.masks[r].node <= i)
        return tuple(sorted(crossing))

    def stage_layers(self, first: int, last: int) -> list:
        """The Keras layers that nodes first..last call (a shared layer once)."""
        layers, seen = [], set()
        for i in range(first, last + 1):
            layer = self.graph.layer_of(i)
            if id(layer) not in seen:
                seen.add(id(layer))
                layers.append(layer)
        return layers

    def stage_variables(self, first: int, last: int) -> tuple[list, list]:
        """(trainable, non-trainable) variables of nodes first..last, each once; a bare op
        (a keras.ops call in the graph, e.g. a slice) holds none."""
        seen: set[int] = set()
        trainable, other = [], []
        for op in self.stage_layers(first, last):
            for kind, out in (("trainable_variables", trainable),
                              ("non_trainable_variables", other)):
                for v in getattr(op, kind, ()):
                    if id(v) not in seen:
                        seen.add(id(v))
                        out.append(v)
        return trainable, other

    def run(self, first: int, last: int, env: MutableMapping[TensorRef, Any],
            training: bool) -> None:
        """Call nodes first..last, reading their inputs from and writing outputs to `env`."""
        masks = self.graph.masks
        for i in range(first, last + 1):
            for r in self.graph.nodes[i].inputs:
                if r in masks and masks[r] in env and keras_graph.keras_mask(env[r]) is None:
                    keras_graph.set_keras_mask(env[r], env[masks[r]])
            for k, y in enumerate(self.graph.call_node(i, env, training=training)):
                env[TensorRef(i, k)] = y

    def model_inputs(self, x) -> list:
        """Stage 0's inputs: the values of `cut(-1)` taken from the model input `x` (a
        tensor, list or dict, as Keras' Functional accepts it)."""
        flat = keras_graph.standardize_inputs(self._functional, x)
        return [flat[r.input_index] for r in self._input_refs]

    def pack_outputs(self, flat: Sequence[Any]) -> Any:
        """y_pred from the last stage's outputs (the values of `cut(L - 1)`), nested as the
        model's outputs and unpacked when single, as Keras' Functional returns it."""
        by_ref = dict(zip(self._output_refs, flat))
        outputs = [by_ref[r] for r in self.graph.outputs]
        masks = self.graph.masks
        for r, y in zip(self.graph.outputs, outputs):
            if r in masks and keras_graph.keras_mask(y) is None:
                keras_graph.set_keras_mask(y, by_ref[masks[r]])
        packed = keras.tree.pack_sequence_as(keras_graph.outputs_struct(self._functional),
                                             outputs)
        if isinstance(packed, (list, tuple)) and len(packed) == 1:  # Functional's unpack_singleton
            return packed[0]
        return packed
