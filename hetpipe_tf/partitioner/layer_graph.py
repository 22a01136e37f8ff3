"""The layer graph of a Keras model: nodes in topological order and the cuts between them.

Conventions (the partitioner, the profiler and the pipeline runtime rely on them):

- A node is one call of a Keras operation (normally a layer) inside the model.
  `InputLayer`s are not nodes: model input k is referred to as `TensorRef(-1 - k, 0)`.
- A nested model (a Functional or Sequential model used as a layer, at any depth: a
  keras_hub backbone, a keras.applications base) is inlined: each of its layer calls is a
  node named "<model>/<layer>" (one prefix per level), so plans can cut inside it. The
  model is read, never rebuilt: its variables, names and weight order stay the user's.
  A nested model whose call is Python code of its own (a subclassed Model) stays one node,
  and so does a call Keras would convert on the way in (another dtype or rank, a mask);
  `LayerGraph.notes` says which and why.
- A shared layer (called n times, e.g. tied input/output embeddings) gives n nodes. The
  first call's node is named after the layer and carries its parameter bytes; call c >= 1
  is named "<layer>@<c>" and has `param_bytes == 0`, so that summing over nodes counts each
  weight once. Its weights exist once, so its calls must run in one stage: the cuts between
  its first and last call are not allowed (`allowed_cut`).
- Shapes are per sample (batch dimension dropped) and must be fully defined (a nested
  model's open dimensions are derived from the outer model's inputs).
- The cut after node i (between nodes i and i+1) carries every tensor produced at or
  before i (model inputs count as produced before node 0) that some node after i
  consumes. A model output that no later node consumes does not cross the cut; the
  runtime delivers model outputs (`LayerGraph.outputs`) to the loss separately.
"""

from __future__ import annotations

import dataclasses
from collections.abc import Mapping, Sequence
from typing import Any

import keras

from hetpipe_tf import _shim as _keras_shim
from hetpipe_tf.partitioner.input_shapes import fixed_input, input_shapes_set
from hetpipe_tf.partitioner.layer_nodes import (
    CallStructure,
    LayerNode,
    TensorRef,
    dtype_name,
    map_leaves,
    per_sample_shape,
    tensor_bytes,
    weight_bytes,
)


class _Builder:
    """Flattens a Functional graph into nodes, inlining nested Functional and Sequential
    models (any depth), so that every inner layer call is a node the planner can cut after."""

    def __init__(self) -> None:
        self.nodes: list[LayerNode] = []
        self.layers: list[Any] = []
        self.specs: dict[TensorRef, tuple[tuple[int, ...], str]] = {}  # per-sample shape, dtype
        self._calls: dict[int, int] = {}       # id(layer) -> its calls so far
        self._first: dict[int, str] = {}       # id(layer) -> the name of its first call
        # Keras masks: a tensor's mask is another tensor of the graph (Keras records the ops
        # that compute it, e.g. `not_equal`, as nodes), often made after the tensor itself.
        self._mask_tensor: dict[TensorRef, Any] = {}   # ref -> its mask's KerasTensor
        self._ref_of: dict[int, TensorRef] = {}        # id(KerasTensor) -> ref, every level
        self.masks: dict[TensorRef, TensorRef] = {}     # ref -> its mask's ref

    def inline(self, functional: Any, input_refs: Sequence[TensorRef], prefix: str
               ) -> list[TensorRef]:
        """Add the calls of `functional` whose inputs are `input_refs`; its output refs."""
        refs = {id(t): r for t, r in zip(functional.inputs, input_refs)}
        self._ref_of.update(refs)
        for event in _keras_shim.call_events(functional):
            op = event.operation
            opaque = ""
            inner = _keras_shim.nested_functional(op)
            if inner is not None:
                values, why = _keras_shim.nested_inputs(inner, event.args, event.kwargs)
                if values is not None:
                    outs = self.inline(inner, [refs[id(v)] for v in values],
                                       f"{prefix}{op.name}/")
                    refs.update((id(t), r) for t, r in zip(event.outputs, outs))
                    self._ref_of.update((id(t), r) for t, r in zip(event.outputs, outs))
                    for t, r in zip(event.outputs, outs):
                        self._note_mask(r, t)
                    continue
                opaque = f"nested model {prefix}{op.name} stays one node: {why}"
            elif isinstance(op, keras.Model):
                opaque = (f"nested model {prefix}{op.name} stays one node: it is a subclassed "
                          f"{type(op).__name__} whose call() is Python code, not a layer graph")
            self._add(event, op, refs, prefix, opaque)
        return [refs[id(t)] for t in functional.outputs]

    def _add(self, event: Any, op: Any, refs: dict[int, TensorRef], prefix: str,
             opaque: str) -> None:
        index = len(self.nodes)
        call = self._calls.get(id(op), 0)
        self._calls[id(op)] = call + 1
        base = f"{prefix}{op.name}"
        self._first.setdefault(id(op), base)
        name = base if call == 0 else f"{base}@{call}"
        inputs: list[TensorRef] = []

        def to_ref(value: Any) -> Any:
            if _keras_shim.is_symbolic_tensor(value):
                ref = refs[id(value)]
                if ref not in inputs:
                    inputs.append(ref)
                return ref
            return value

        structure = CallStructure(
            args=map_leaves(event.args, to_ref), kwargs=map_leaves(event.kwargs, to_ref))
        # A layer reads its inputs' masks from the tensors themselves (Dense, Dropout...
        # pass them on): the masks are inputs of the node too, so that they cross a cut
        # with the tensor (`pipeline/program.py` attaches them again on the other side).
        for ref in list(inputs):
            mask = self.mask_of(ref, name)
            if mask is not None and mask not in inputs:
                inputs.append(mask)
        shapes, dtypes = self._output_specs(event, op, structure, inputs, name)
        weights = list(getattr(op, "weights", ()))
        trainable = list(getattr(op, "trainable_weights", ()))
        self.nodes.append(LayerNode(
            index=index, name=name, class_name=type(op).__name__, inputs=tuple(inputs),
            output_shapes=shapes, output_dtypes=dtypes,
            output_bytes_per_sample=sum(map(tensor_bytes, shapes, dtypes)),
            param_bytes=weight_bytes(weights) if call == 0 else 0,
            trainable_param_bytes=weight_bytes(trainable) if call == 0 else 0,
            layer_name=self._first[id(op)], call_index=call, call_structure=structure,
            opaque=opaque,
            tied_bytes=(2 * weight_bytes(trainable) if call > 0
                        and not list(getattr(op, "non_trainable_weights", ())) else 0)))
        self.layers.append(op)
        for k, (shape, dtype) in enumerate(zip(shapes, dtypes)):
            self.specs[TensorRef(index, k)] = (shape, dtype)
            refs[id(event.outputs[k])] = TensorRef(index, k)
            self._ref_of[id(event.outputs[k])] = TensorRef(index, k)
            self._note_mask(TensorRef(index, k), event.outputs[k])

    def _note_mask(self, ref: TensorRef, tensor: Any) -> None:
        mask = _keras_shim.keras_mask(tensor)
        if mask is not None:
            self._mask_tensor[ref] = mask

    def mask_of(self, ref: TensorRef, where: str) -> TensorRef | None:
        """The ref of `ref`'s Keras mask (None: it has none); its KerasTensor must be a
        tensor of the graph by the time a node (`where`) or the loss reads `ref`."""
        if ref in self.masks:
            return self.masks[ref]
        tensor = self._mask_tensor.get(ref)
        if tensor is None:
            return None
        mask = self._ref_of.get(id(tensor))
        if mask is None:
            raise ValueError(
                "A Keras mask must be computed by the model's graph for the pipeline to carry "
                f"it between stages. Received: the mask of a tensor {where} reads, made by "
                "no recorded call; compute the mask with layers of the model (e.g. "
                "Embedding(mask_zero=True) or Masking) or pass the padding as sample_weight.")
        self.masks[ref] = mask
        return mask

    def _output_specs(self, event: Any, op: Any, structure: CallStructure,
                      inputs: Sequence[TensorRef], name: str
                      ) -> tuple[tuple[tuple[int, ...], ...], tuple[str, ...]]:
        recorded = [tuple(t.shape)[1:] for t in event.outputs]
        outputs = event.outputs
        if any(None in shape for shape in recorded):
            # A nested model's Input may leave a dimension open (keras_hub backbones: the
            # sequence length) that the outer model's inputs define: derive the call's
            # output specs from its inputs' specs, without recording a call anywhere.
            specs = {r: keras.KerasTensor((None, *self.specs[r][0]), dtype=self.specs[r][1])
                     for r in inputs}
            args, kwargs = structure.fill(specs)
            outputs = _keras_shim.output_specs(op, args, kwargs)
        where = f"output of {name!r}"
        return (tuple(per_sample_shape(t, where) for t in outputs),
                tuple(dtype_name(t.dtype) for t in outputs))


@dataclasses.dataclass(frozen=True)
class LayerGraph:
    """Nodes of a Keras model in topological order, with the tensors between them."""

    model_name: str
    nodes: tuple[LayerNode, ...]
    input_shapes: tuple[tuple[int, ...], ...]
    input_dtypes: tuple[str, ...]
    outputs: tuple[TensorRef, ...]
    _layers: tuple[Any, ...] = dataclasses.field(compare=False, repr=False)
    # Tensor -> the tensor holding its Keras mask (Masking, Embedding(mask_zero=True));
    # a node that reads a masked tensor reads its mask too (it is in `inputs`).
    masks: Mapping[TensorRef, TensorRef] = dataclasses.field(default_factory=dict,
                                                             compare=False, repr=False)

    def __post_init__(self) -> None:
        # Last consumer of each tensor: every cut query below is answered from it.
        last_use: dict[TensorRef, int] = {}
        for node in self.nodes:
            for ref in node.inputs:
                last_use[ref] = node.index
        object.__setattr__(self, "_last_use", last_use)
        object.__setattr__(self, "_by_name", {node.name: node for node in self.nodes})
        calls: dict[str, list[int]] = {}
        for node in self.nodes:
            calls.setdefault(node.layer_name, []).append(node.index)
        shared = {name: (ix[0], ix[-1]) for name, ix in calls.items() if len(ix) > 1}
        object.__setattr__(self, "_shared", shared)
        # A shared layer whose only state is trainable weights (tied embeddings) may be
        # split: a later stage borrows the weights (pipeline/tied.py). Other state (BatchNorm
        # statistics, a seed) exists once and is updated call by call: kept in one stage.
        object.__setattr__(self, "_forbidden", frozenset(
            c for first, last in shared.values() if not self._tieable(first)
            for c in range(first, last)))

    @classmethod
    def from_model(cls, model: keras.Model) -> LayerGraph:
        """The graph of a built Keras 3 Sequential or Functional model."""
        _check_model(model)
        functional = _keras_shim.functional_graph(model)
        if functional is None:
            raise ValueError(
                "The model has no layer graph. Received: "
                f"model={model.name!r} ({type(model).__name__}); build a Sequential "
                "model with keras.Input or model.build(input_shape), or use a "
                "Functional model (subclassed models are not supported)."
            )
        builder = _Builder()
        input_refs = []
        input_shapes, input_dtypes = [], []
        given = input_shapes_set(model)
        for k, tensor in enumerate(functional.inputs):
            tensor = fixed_input(tensor, given[k] if given and k < len(given) else None)
            input_refs.append(TensorRef(-1 - k, 0))
            input_shapes.append(per_sample_shape(tensor, f"model input {k}"))
            input_dtypes.append(dtype_name(tensor.dtype))
            builder.specs[TensorRef(-1 - k, 0)] = (input_shapes[-1], input_dtypes[-1])
        outputs = builder.inline(functional, input_refs, prefix="")
        for ref in outputs:   # the loss and metrics read the outputs' masks
            builder.mask_of(ref, "the loss")
        return cls(
            model_name=model.name,
            nodes=tuple(builder.nodes),
            input_shapes=tuple(input_shapes),
            input_dtypes=tuple(input_dtypes),
            outputs=tuple(outputs),
            _layers=tuple(builder.layers),
            masks=dict(builder.masks),
        )

    def __len__(self) -> int:
        return len(self.nodes)

    @property
    def notes(self) -> tuple[str, ...]:
        """Why nested models stayed single nodes (the plan table prints these)."""
        return tuple(node.opaque for node in self.nodes if node.opaque)

    def _tieable(self, node: int) -> bool:
        layer = self._layers[node] if node < len(self._layers) else None
        return layer is not None and not list(getattr(layer, "non_trainable_weights", ()))

    @property
    def shared_layers(self) -> Mapping[str, tuple[int, int]]:
        """Layer name -> (first, last) node calling it, for layers called more than once."""
        return dict(self._shared)

    def allowed_cut(self, i: int) -> bool:
        """False for a cut between two calls of one shared layer (its weights exist once)."""
        self._check_cut(i)
        return i not in self._forbidden

    def forbidden_cuts(self) -> frozenset[int]:
        """The cuts `allowed_cut` refuses."""
        return self._forbidden

    def layer(self, name: str) -> LayerNode:
        """The node called `name` ("<layer>" or "<layer>@<call>" for shared layers)."""
        try:
            return self._by_name[name]
        except KeyError:
            raise ValueError(
                f"No node of that name in model {self.model_name!r}. Received: "
                f"name={name!r}; use one of graph.nodes[i].name."
            ) from None

    def layer_of(self, i: int) -> Any:
        """The Keras layer (operation) that node i calls."""
        return self._layers[self._check_index(i)]

    def tensor_bytes_per_sample(self, ref: TensorRef) -> int:
        if ref.is_model_input:
            k = ref.input_index
            return tensor_bytes(self.input_shapes[k], self.input_dtypes[k])
        return self.nodes[ref.node].output_bytes(ref.index)

    def tensor_shape(self, ref: TensorRef) -> tuple[int, ...]:
        if ref.is_model_input:
            return self.input_shapes[ref.input_index]
        return self.nodes[ref.node].output_shapes[ref.index]

    def tensor_dtype(self, ref: TensorRef) -> str:
        if ref.is_model_input:
            return self.input_dtypes[ref.input_index]
        return self.nodes[ref.node].output_dtypes[ref.index]

    def cut_tensors(self, i: int) -> frozenset[TensorRef]:
        """Tensors produced at or before node i and consumed by a node after i."""
        self._check_cut(i)
        return frozenset(
            ref for ref, last in self._last_use.items() if ref.node <= i and last > i
        )

    def cut_bytes_per_sample(self, i: int) -> int:
        return sum(self.tensor_bytes_per_sample(ref) for ref in self.cut_tensors(i))

    def all_cut_bytes_per_sample(self) -> tuple[int, ...]:
        """Bytes per sample crossing each of the L-1 cuts, in O(nodes + edges)."""
        n_cuts = len(self.nodes) - 1
        if n_cuts <= 0:
            return ()
        # A tensor crosses cuts max(producer, 0) .. last_use - 1: add on a difference array.
        delta = [0] * (n_cuts + 1)
        for ref, last in self._last_use.items():
            first = max(ref.node, 0)
            if last > first:
                nbytes = self.tensor_bytes_per_sample(ref)
                delta[first] += nbytes
                delta[last] -= nbytes
        cuts, running = [], 0
        for i in range(n_cuts):
            running += delta[i]
            cuts.append(running)
        return tuple(cuts)

    def call_node(self, i: int, values: Mapping[TensorRef, Any], *, training: bool | None = None) -> tuple:
        """Call node i's layer on `values` (refs -> tensors); its flat outputs.

        `training`, when given, is passed to layers (not to bare ops), replacing a value
        recorded when the model was built, as Keras' Functional.call does (`fit` runs a
        layer called with training=False in training mode too).
        """
        node = self.nodes[self._check_index(i)]
        layer = self._layers[i]
        args, kwargs = node.call_structure.fill(values)
        if training is not None and isinstance(layer, keras.Layer):
            kwargs["training"] = training
        outputs = keras.tree.flatten(layer(*args, **kwargs))
        return tuple(outputs)

    def run(self, inputs: Sequence[Any], *, training: bool | None = None) -> list:
        """Run the whole graph on model inputs; the model outputs (flat list)."""
        values: dict[TensorRef, Any] = {TensorRef(-1 - k, 0): x for k, x in enumerate(inputs)}
        for node in self.nodes:
            for t_index, y in enumerate(self.call_node(node.index, values, training=training)):
                values[TensorRef(node.index, t_index)] = y
        return [values[ref] for ref in self.outputs]

    def _check_index(self, i: int) -> int:
        if not 0 <= i < len(self.nodes):
            raise ValueError(
                f"Node index out of range. Received: i={i}; use 0 <= i < {len(self.nodes)}."
            )
        return i

    def _check_cut(self, i: int) -> None:
        if not 0 <= i < len(self.nodes) - 1:
            raise ValueError(
                f"Cut index out of range. Received: i={i}; the cut after node i needs "
                f"0 <= i < {len(self.nodes) - 1} (number of nodes - 1)."
            )


def _check_model(model: Any) -> None:
    if not isinstance(model, keras.Model):
        raise ValueError(
            "LayerGraph.from_model needs a Keras model. Received: "
            f"model={type(model).__name__}; pass a keras.Sequential or a Functional keras.Model."
        )
    if not model.layers:
        raise ValueError(
            f"The model has no layers. Received: model={model.name!r} with 0 layers; "
            "add layers before building the layer graph."
        )
    if not model.built:
        raise ValueError(
            f"The model is not built. Received: model={model.name!r} with built=False; "
            "give its first layer a keras.Input, call model.build(input_shape), or call "
            "the model on a batch once."
        )
