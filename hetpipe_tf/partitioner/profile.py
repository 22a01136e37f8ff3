"""Profile of a Keras model: per-layer time on each device type, FLOPs, memory, cut bytes.

Everything is per minibatch at the profile's batch size; "layer" means a node of the
`LayerGraph` (one call of a Keras layer), in graph order.

- FLOPs: TensorFlow's own counter. The model's forward pass is traced once as one
  `tf.function` (training mode) on concrete input specs, each node's call under its own
  name scope "hp_node_<i>", and `tf.compat.v1.profiler.profile(..., float_operation())`
  counts the graph; ops are attributed to nodes by that scope. Ops without a registered
  FLOP statistic (activations, pooling on some versions) count 0. Forward+backward FLOPs
  = 3 x forward for a layer with trainable weights (gradients w.r.t. inputs and weights),
  2 x forward otherwise.
- bytes_accessed = 3 x (distinct input tensors + outputs + param_bytes), i.e. the forward
  reads inputs and weights and writes outputs, and the backward touches them about twice.
- Memory: `param_bytes` / `trainable_param_bytes` come from the graph (gradients and
  optimizer slots are derived from them by the cost model); `activation_bytes` is the
  layer's output for the minibatch, what its consumers' backward keeps.
- Time on a measured type (a device of that type is present, `measure_on`): each node's
  forward+backward (GradientTape w.r.t. its float inputs and trainable weights) in a
  `tf.function` on random inputs at `measure_batch_size`, one warm-up call, median of
  `repeats`, minus the cost of calling an empty tf.function on that device (a stage runs
  as one function, so that cost is not a layer's; floor `MIN_MEASURED_S`), scaled
  linearly to the batch size. Non-trainable weights (BatchNorm moving statistics) are
  restored afterwards, so profiling leaves the model unchanged.
- Time on a type with no device at hand, "estimated": roofline
  max(flops / peak_flops, bytes_accessed / memory_bandwidth) / efficiency
  + launch_overhead_s, with efficiency `DEFAULT_EFFICIENCY[kind]` (GPU 0.5, CPU 0.3:
  typical fractions of peak that framework kernels reach).
- "calibrated": when some type of the same DeviceKind was measured (GPU -> GPU, CPU ->
  CPU), an estimated type's times are multiplied per layer class (Keras class name) by
  sum(measured) / sum(estimated) over the layers of that class on the measured types of
  that kind. Layer classes differ much more in how close they come to the roofline than
  device types of one kind do, so the class is the unit of calibration.
- Update time (`update_s`, per type; empty when no optimizer is given): what a stage's
  per-minibatch update costs for the node's weights, as the runtime does it today
  (`pipeline/weights.py` StageWeights.apply): one compiled call applying the optimizer to
  the node's trainable weights and adding the deltas of its float non-trainable weights,
  then an eager `tf.identity` snapshot of each of those variables (the next weight
  version). Measured on copies of the node's weights with a fresh optimizer built from the
  given one (its config), median of `repeats` after one warm-up, minus the same update of
  one scalar variable (a stage makes ONE such call per minibatch, so its fixed cost, the
  step counter and the call, is not a layer's; floor `MIN_MEASURED_S`). Estimated:
  bytes / memory_bandwidth / efficiency + launch_overhead_s with bytes =
  trainable x (5 + 2 x slots) + float non-trainable x 5 (read weight and gradient, read
  and write each slot, write the weight, and the copy-on-write copy of the weight that
  the live snapshot forces: 2 more); calibrated like times, one ratio per kind (pooled
  over all layers: an update is elementwise whatever the layer class). The update does
  not depend on the batch size, so `scaled` keeps it. Nodes without weights (and later
  calls of a shared layer) cost 0.
- `ModelProfile.scaled(b)` rescales linearly: FLOPs, times, activations, cut bytes and
  the activation part of bytes_accessed by b / batch_size (it ignores fixed per-layer
  costs, which makes small-batch times optimistic); update times are kept.
"""

from __future__ import annotations

import contextlib
import dataclasses
import json
import statistics
import threading
import time
import types
from collections.abc import Iterator, Mapping, Sequence
from typing import Any

import keras
import numpy as np
import tensorflow as tf

from hetpipe_tf.cluster.catalog import DeviceKind, DeviceType, canonical_type_name, get_device_type
from hetpipe_tf.partitioner.cost import optimizer_slots
from hetpipe_tf.partitioner.layer_graph import LayerGraph, TensorRef

DEFAULT_EFFICIENCY: Mapping[DeviceKind, float] = types.MappingProxyType(
    {DeviceKind.GPU: 0.5, DeviceKind.CPU: 0.3}
)
TIME_SOURCES = ("measured", "estimated", "calibrated")
MIN_MEASURED_S = 1e-6  # floor of a measured layer time once the call cost is removed
_SCOPE = "hp_node_"


@dataclasses.dataclass(frozen=True)
class LayerCost:
    """Cost of one layer for one minibatch; times are forward+backward seconds by type;
    `update_s` the seconds of its weights' per-minibatch update by type (empty: none
    costed, i.e. 0)."""

    name: str
    time_s: Mapping[str, float]
    flops: int
    bytes_accessed: int
    param_bytes: int
    trainable_param_bytes: int
    activation_bytes: int
    update_s: Mapping[str, float] = dataclasses.field(default_factory=dict)
    tied_bytes: int = 0   # a tied layer's later call: its borrowed copy (LayerNode.tied_bytes)

    def __post_init__(self) -> None:
        object.__setattr__(self, "time_s", types.MappingProxyType(dict(self.time_s)))
        object.__setattr__(self, "update_s", types.MappingProxyType(dict(self.update_s)))
        bad_update = {k: v for k, v in self.update_s.items() if not (v >= 0 and np.isfinite(v))}
        if bad_update:
            raise ValueError(f"LayerCost {self.name}: update times must be finite and >= 0. "
                             f"Received: update_s={bad_update}.")
        for field in ("flops", "bytes_accessed", "param_bytes", "trainable_param_bytes",
                      "activation_bytes"):
            value = getattr(self, field)
            if value < 0:
                raise ValueError(f"LayerCost {self.name}: {field} must be >= 0. Received: {field}={value}.")
        bad = {k: v for k, v in self.time_s.items() if not (v >= 0 and np.isfinite(v))}
        if bad:
            raise ValueError(f"LayerCost {self.name}: times must be finite and >= 0. Received: time_s={bad}.")

    def to_dict(self) -> dict[str, Any]:
        return {f.name: getattr(self, f.name) for f in dataclasses.fields(self)} | {
            "time_s": dict(self.time_s), "update_s": dict(self.update_s)}

    @classmethod
    def from_dict(cls, d: Mapping[str, Any]) -> LayerCost:
        return cls(**_checked_keys(cls, d))


@dataclasses.dataclass(frozen=True)
class ModelProfile:
    """Per-layer costs of a model at one batch size, on several device types."""

    model_name: str
    batch_size: int
    layers: tuple[LayerCost, ...]
    cut_bytes: tuple[int, ...]
    time_source: Mapping[str, str]
    # The optimizer whose update `LayerCost.update_s` times ("" = no update costed).
    update_optimizer: str = ""
    # Cuts no plan may use: between two calls of a shared layer (`LayerGraph.forbidden_cuts`).
    forbidden_cuts: tuple[int, ...] = ()

    def __post_init__(self) -> None:
        object.__setattr__(self, "layers", tuple(self.layers))
        object.__setattr__(self, "forbidden_cuts", tuple(sorted(int(c) for c in
                                                                self.forbidden_cuts)))
        if any(not 0 <= c < len(self.layers) - 1 for c in self.forbidden_cuts):
            raise ValueError(
                "forbidden_cuts must index cuts (0 <= cut < layers - 1). Received: "
                f"forbidden_cuts={list(self.forbidden_cuts)[:8]}, {len(self.layers)} layers.")
        object.__setattr__(self, "cut_bytes", tuple(int(b) for b in self.cut_bytes))
        object.__setattr__(self, "time_source", types.MappingProxyType(dict(self.time_source)))
        if self.batch_size <= 0:
            raise ValueError(f"batch_size must be > 0. Received: batch_size={self.batch_size}.")
        if len(self.cut_bytes) != max(len(self.layers) - 1, 0):
            raise ValueError(
                "cut_bytes needs one entry per cut (layers - 1). Received: "
                f"len(cut_bytes)={len(self.cut_bytes)}, len(layers)={len(self.layers)}.")
        bad = {k: v for k, v in self.time_source.items() if v not in TIME_SOURCES}
        if bad:
            raise ValueError(f"Unknown time sources. Received: {bad}; use one of {TIME_SOURCES}.")
        for layer in self.layers:
            if set(layer.time_s) != set(self.time_source):
                raise ValueError(
                    f"Layer {layer.name} has times for other device types than the profile. "
                    f"Received: {sorted(layer.time_s)} vs time_source {sorted(self.time_source)}.")
            if layer.update_s and set(layer.update_s) != set(self.time_source):
                raise ValueError(
                    f"Layer {layer.name} has update times for other device types than the "
                    f"profile. Received: {sorted(layer.update_s)} vs time_source "
                    f"{sorted(self.time_source)}; give every type or none.")

    @property
    def device_types(self) -> tuple[str, ...]:
        return tuple(self.time_source)

    def scaled(self, batch_size: int) -> ModelProfile:
        """The profile at another batch size, rescaled linearly (see module docstring)."""
        if batch_size <= 0:
            raise ValueError(f"batch_size must be > 0. Received: batch_size={batch_size}.")
        k = batch_size / self.batch_size
        layers = tuple(
            dataclasses.replace(
                c,
                time_s={t: s * k for t, s in c.time_s.items()},
                flops=round(c.flops * k),
                bytes_accessed=3 * c.param_bytes + round((c.bytes_accessed - 3 * c.param_bytes) * k),
                activation_bytes=round(c.activation_bytes * k),
            )
            for c in self.layers
        )
        return dataclasses.replace(self, batch_size=batch_size, layers=layers,
                                   cut_bytes=tuple(round(b * k) for b in self.cut_bytes))

    def to_dict(self) -> dict[str, Any]:
        return {
            "model_name": self.model_name,
            "batch_size": self.batch_size,
            "layers": [c.to_dict() for c in self.layers],
            "cut_bytes": list(self.cut_bytes),
            "time_source": dict(self.time_source),
            "update_optimizer": self.update_optimizer,
            "forbidden_cuts": list(self.forbidden_cuts),
        }

    @classmethod
    def from_dict(cls, d: Mapping[str, Any]) -> ModelProfile:
        kwargs = _checked_keys(cls, d)
        kwargs["layers"] = tuple(LayerCost.from_dict(c) for c in kwargs["layers"])
        return cls(**kwargs)

    def to_json(self, **kwargs: Any) -> str:
        return json.dumps(self.to_dict(), **kwargs)

    @classmethod
    def from_json(cls, text: str) -> ModelProfile:
        return cls.from_dict(json.loads(text))


def _checked_keys(cls: type, d: Mapping[str, Any]) -> dict[str, Any]:
    fields = {f.name for f in dataclasses.fields(cls)}
    # Fields with a default may be absent (profiles saved before they existed).
    required = {f.name for f in dataclasses.fields(cls)
                if f.default is dataclasses.MISSING and f.default_factory is dataclasses.MISSING}
    if not required <= set(d) <= fields:
        raise ValueError(
            f"{cls.__name__} dict has wrong keys. Received: keys={sorted(d)}; "
            f"expected {sorted(required)}, optionally {sorted(fields - required)}.")
    return dict(d)


@contextlib.contextmanager
def _quiet_tf_logging() -> Iterator[None]:
    logger = tf.get_logger()
    level = logger.level
    logger.setLevel("ERROR")
    try:
        yield
    finally:
        logger.setLevel(level)


def forward_flops(graph: LayerGraph, batch_size: int) -> tuple[int, ...]:
    """Forward FLOPs of each node at `batch_size`, counted by TensorFlow's profiler."""

    @tf.function(autograph=False)
    def forward(*inputs: tf.Tensor) -> list:
        values = {TensorRef(-1 - k, 0): x for k, x in enumerate(inputs)}
        for node in graph.nodes:
            with tf.name_scope(f"{_SCOPE}{node.index}"):
                outputs = graph.call_node(node.index, values, training=True)
            values.update({TensorRef(node.index, j): y for j, y in enumerate(outputs)})
        return [values[ref] for ref in graph.outputs]

    specs = [tf.TensorSpec((batch_size, *shape), dtype)
             for shape, dtype in zip(graph.input_shapes, graph.input_dtypes)]
    func_graph = forward.get_concrete_function(*specs).graph
    builder = tf.compat.v1.profiler.ProfileOptionBuilder
    options = builder(builder.float_operation()).with_empty_output().build()
    # The v1 profiler logs a deprecation warning per call of a TF-internal helper; it says
    # nothing about our use, so keep it out of the user's output.
    with _quiet_tf_logging():
        root = tf.compat.v1.profiler.profile(func_graph, cmd="scope", options=options)
    flops = [0] * len(graph.nodes)
    stack = list(root.children)
    while stack:
        entry = stack.pop()
        stack.extend(entry.children)
        scope = entry.name.split("/", 1)[0]
        if entry.float_ops and scope.startswith(_SCOPE):
            flops[int(scope[len(_SCOPE):])] += entry.float_ops
    return tuple(flops)


def estimate_time(flops: float, bytes_accessed: float, device_type: DeviceType,
                  efficiency: Mapping[DeviceKind, float] = DEFAULT_EFFICIENCY) -> float:
    """Roofline estimate of one layer task's seconds on `device_type`."""
    roofline = max(flops / device_type.peak_flops, bytes_accessed / device_type.memory_bandwidth)
    return roofline / efficiency[device_type.kind] + device_type.launch_overhead_s


def measure_layer_times(graph: LayerGraph, batch_size: int, device: str,
                        repeats: int = 3) -> tuple[float, ...]:
    """Median forward+backward seconds of each node at `batch_size` on `device`.

    The cost of calling an empty tf.function on `device` is subtracted (floored at
    `MIN_MEASURED_S`): a pipeline stage is one compiled function, so the per-call cost
    must not be charged to each of its layers.
    """
    call_cost = _call_overhead(device, max(repeats, 5))
    return tuple(max(_measure_node(graph, i, batch_size, device, repeats) - call_cost,
                     MIN_MEASURED_S) for i in range(len(graph)))


def _call_overhead(device: str, repeats: int) -> float:
    @tf.function(autograph=False)
    def empty(x: tf.Tensor) -> tf.Tensor:
        return tf.reduce_sum(tf.reshape(x, [-1])[:1])

    with tf.device(device):
        return _median_seconds(empty, [tf.zeros((1,))], repeats)


def _median_seconds(fn: Any, inputs: Sequence[tf.Tensor], repeats: int) -> float:
    fn(*inputs).numpy()  # warm-up: trace and first run
    seconds = []
    for _ in range(repeats):
        start = time.perf_counter()
        fn(*inputs).numpy()  # .numpy() waits for the device
        seconds.append(time.perf_counter() - start)
    return statistics.median(seconds)


def _measure_node(graph: LayerGraph, i: int, batch_size: int, device: str, repeats: int) -> float:
    node = graph.nodes[i]
    layer = graph.layer_of(i)
    trainable = list(getattr(layer, "trainable_weights", ()))
    state = list(getattr(layer, "non_trainable_weights", ()))
    saved = [w.numpy() for w in state]

    @tf.function(autograph=False)
    def step(*inputs: tf.Tensor) -> tf.Tensor:
        watched = [x for x in inputs if x.dtype.is_floating]
        with tf.GradientTape() as tape:
            tape.watch(watched)
            outputs = graph.call_node(i, dict(zip(node.inputs, inputs)), training=True)
        targets = [y for y in outputs if y.dtype.is_floating]
        grads = tape.gradient(targets, watched + trainable,
                              output_gradients=[tf.ones_like(y) for y in targets]) if targets else []
        results = list(outputs) + [g.values if isinstance(g, tf.IndexedSlices) else g
                                   for g in grads if g is not None]
        # One element of every result: forces the whole computation, costs nothing.
        done = [tf.cast(tf.reshape(t, [-1])[:1], tf.float32) for t in results]
        return tf.reduce_sum(tf.concat(done, 0)) if done else tf.constant(0.0)

    with tf.device(device):
        inputs = [_random_tensor((batch_size, *graph.tensor_shape(ref)), graph.tensor_dtype(ref))
                  for ref in node.inputs]
        seconds = _median_seconds(step, inputs, repeats)
    for weight, value in zip(state, saved):
        weight.assign(value)
    return seconds


def _fresh_optimizer(optimizer: Any) -> keras.optimizers.Optimizer:
    """A new, unbuilt optimizer like `optimizer` (a name or a Keras optimizer)."""
    if isinstance(optimizer, str):
        try:
            return keras.optimizers.get(optimizer)
        except ValueError:
            raise ValueError(
                f"Unknown optimizer for the update cost. Received: optimizer={optimizer!r}; "
                "pass a Keras optimizer name such as 'sgd' or 'adam', or an instance."
            ) from None
    if isinstance(optimizer, keras.optimizers.Optimizer):
        return type(optimizer).from_config(optimizer.get_config())
    raise ValueError(
        "The update cost needs a Keras optimizer or its name. Received: "
        f"optimizer={optimizer!r}; pass e.g. 'sgd', 'adam' or keras.optimizers.Adam(...), or "
        "None for no update cost.")


def optimizer_name(optimizer: Any) -> str:
    """The name a profile records for the optimizer whose update it times."""
    return optimizer.lower() if isinstance(optimizer, str) else type(optimizer).__name__.lower()


def _update_seconds(trainable: Sequence[Any], versioned: Sequence[Any], optimizer: Any,
                    device: str, repeats: int) -> float:
    """Median seconds of one update as `pipeline/weights.py` StageWeights.apply does it, on
    COPIES of the given variables: one compiled call (optimizer on `trainable`, deltas
    added to `versioned`), then an eager snapshot (`tf.identity`) of every variable."""
    with tf.device(device):
        t_copies = [keras.Variable(np.asarray(v), dtype=v.dtype, trainable=True)
                    for v in trainable]
        v_copies = [keras.Variable(np.asarray(v), dtype=v.dtype, trainable=False)
                    for v in versioned]
        opt = _fresh_optimizer(optimizer)
        opt.build(t_copies)
        # Tiny gradients: the update runs the same ops whatever the values.
        grads = [tf.fill(v.shape, tf.constant(1e-6, v.dtype)) for v in t_copies]
        deltas = [tf.zeros(v.shape, v.dtype) for v in v_copies]
    handles = [v.value for v in (*t_copies, *v_copies)]   # the tf.Variable behind each

    @tf.function(autograph=False)
    def apply(grads: list, deltas: list) -> None:
        if t_copies:
            opt.apply_gradients(zip(grads, t_copies))
        for v, d in zip(v_copies, deltas):
            v.value.assign_add(d)

    def update() -> None:
        with tf.device(device):
            apply(grads, deltas)
            snapshot = [tf.identity(h) for h in handles]
        # The snapshot stays alive until the next update (as a weight version does), so
        # the next call pays the copy-on-write copy of every variable it writes.
        update.kept = snapshot
        if snapshot:
            snapshot[-1].numpy()   # waits for the device

    update()  # warm-up: trace and first run
    seconds = []
    for _ in range(repeats):
        start = time.perf_counter()
        update()
        seconds.append(time.perf_counter() - start)
    return statistics.median(seconds)


def measure_update_times(graph: LayerGraph, optimizer: Any, device: str,
                         repeats: int = 3) -> tuple[float, ...]:
    """Median seconds of the per-minibatch update of each node's weights on `device`, less
    the update of one scalar variable (a stage's fixed cost per update, charged to no
    layer); 0 for nodes without weights of their own (see module docstring)."""
    def measure() -> tuple[float, ...]:
        out = []
        # One tf.function per node: TF's retracing warning says nothing about our use.
        with _quiet_tf_logging():
            fixed = _update_seconds([tf.zeros((1,))], [], optimizer, device, max(repeats, 5))
            for i in range(len(graph)):
                trainable, versioned = _update_variables(graph, i)
                if not trainable and not versioned:
                    out.append(0.0)
                    continue
                t = _update_seconds(trainable, versioned, optimizer, device, repeats)
                out.append(max(t - fixed, MIN_MEASURED_S))
        return tuple(out)

    return _in_own_thread(measure)


def _in_own_thread(fn: Any) -> Any:
    """fn() on a new thread, joined; its exception re-raised here. A tf.distribute scope is
    thread-local, so the copies and their optimizer live outside the caller's strategy
    (which may refuse an optimizer updating variables that are not its model's: the
    planner runs inside HetPipeStrategy's scope at the first fit)."""
    result: dict[str, Any] = {}

    def run() -> None:
        try:
            result["value"] = fn()
        except BaseException as e:  # noqa: BLE001 - re-raised in the caller's thread
            result["error"] = e

    thread = threading.Thread(target=run, name="hetpipe-profile-update")
    thread.start()
    thread.join()
    if "error" in result:
        raise result["error"]
    return result["value"]


def _update_variables(graph: LayerGraph, i: int) -> tuple[list, list]:
    """(trainable, float non-trainable) weights node i updates: none for a later call of a
    shared layer (its weights are updated once, with its first call's node)."""
    if graph.nodes[i].param_bytes == 0:
        return [], []
    layer = graph.layer_of(i)
    trainable = list(getattr(layer, "trainable_weights", ()))
    versioned = [w for w in getattr(layer, "non_trainable_weights", ())
                 if tf.as_dtype(w.dtype).is_floating]
    return trainable, versioned


def update_bytes(trainable_bytes: int, versioned_bytes: int, slots: int) -> int:
    """Bytes one update moves (module docstring): trainable x (5 + 2 slots) + versioned x 5."""
    return trainable_bytes * (5 + 2 * slots) + versioned_bytes * 5


def _random_tensor(shape: tuple[int, ...], dtype: str) -> tf.Tensor:
    dtype = tf.as_dtype(dtype)
    if dtype.is_floating:
        return tf.random.normal(shape, dtype=dtype)
    return tf.zeros(shape, dtype=dtype)  # index 0 is valid for embeddings and lookups


def profile_model(
    model: keras.Model | LayerGraph,
    batch_size: int,
    device_types: Sequence[str | DeviceType],
    *,
    measure_on: Mapping[str, str] = types.MappingProxyType({}),
    measure_batch_size: int | None = None,
    repeats: int = 3,
    efficiency: Mapping[DeviceKind, float] = DEFAULT_EFFICIENCY,
    optimizer: Any = None,
) -> ModelProfile:
    """Profile `model` at `batch_size` for every device type in `device_types`.

    `measure_on` maps a device type name to the TensorFlow device string of a present
    device of that type ("/CPU:0", "/job:worker/task:1/device:GPU:0"); those types are
    measured, the others estimated or calibrated (module docstring).
    `optimizer`: the optimizer (name or Keras instance) whose per-minibatch update is
    costed per layer; None = the model's compiled optimizer if it has one, else no update
    cost (`update_s` empty).
    """
    _check_positive_int("batch_size", batch_size)
    _check_positive_int("repeats", repeats)
    if measure_batch_size is None:
        measure_batch_size = batch_size
    _check_positive_int("measure_batch_size", measure_batch_size)
    resolved = _resolve_types(device_types)
    measure = _resolve_measure_on(measure_on, resolved)
    graph = model if isinstance(model, LayerGraph) else LayerGraph.from_model(model)
    if optimizer is None and not isinstance(model, LayerGraph):
        optimizer = getattr(model, "optimizer", None)

    has_weights = [bool(getattr(graph.layer_of(i), "trainable_weights", ())) for i in range(len(graph))]
    fwd = forward_flops(graph, batch_size)
    flops = [f * (3 if w else 2) for f, w in zip(fwd, has_weights)]
    nbytes = [3 * (batch_size * (sum(graph.tensor_bytes_per_sample(r) for r in n.inputs)
                                 + n.output_bytes_per_sample) + n.param_bytes)
              for n in graph.nodes]
    estimated = {name: [estimate_time(f, b, t, efficiency) for f, b in zip(flops, nbytes)]
                 for name, t in resolved.items()}
    times: dict[str, list[float]] = {}
    for name, device in measure.items():
        scale = batch_size / measure_batch_size
        times[name] = [s * scale for s in measure_layer_times(graph, measure_batch_size, device, repeats)]

    classes = [n.class_name for n in graph.nodes]
    source = {}
    for name, device_type in resolved.items():
        if name in measure:
            source[name] = "measured"
            continue
        peers = [m for m in measure if resolved[m].kind is device_type.kind]
        if not peers:
            source[name] = "estimated"
            times[name] = estimated[name]
            continue
        ratio = _class_ratios(classes, [times[m] for m in peers], [estimated[m] for m in peers])
        source[name] = "calibrated"
        times[name] = [e * ratio[c] for e, c in zip(estimated[name], classes)]

    updates = (_update_times(graph, optimizer, resolved, measure, source, repeats, efficiency)
               if optimizer is not None else None)
    layers = tuple(
        LayerCost(
            name=node.name,
            time_s={name: times[name][i] for name in resolved},
            update_s={name: updates[name][i] for name in resolved} if updates else {},
            flops=int(flops[i]),
            bytes_accessed=int(nbytes[i]),
            param_bytes=node.param_bytes,
            trainable_param_bytes=node.trainable_param_bytes,
            activation_bytes=node.output_bytes_per_sample * batch_size,
            tied_bytes=node.tied_bytes,
        )
        for i, node in enumerate(graph.nodes)
    )
    return ModelProfile(
        model_name=graph.model_name,
        batch_size=batch_size,
        layers=layers,
        cut_bytes=tuple(b * batch_size for b in graph.all_cut_bytes_per_sample()),
        time_source=source,
        update_optimizer=optimizer_name(optimizer) if optimizer is not None else "",
        forbidden_cuts=tuple(sorted(graph.forbidden_cuts())),
    )


def _update_times(graph: LayerGraph, optimizer: Any, resolved: Mapping[str, DeviceType],
                  measure: Mapping[str, str], source: Mapping[str, str], repeats: int,
                  efficiency: Mapping[DeviceKind, float]) -> dict[str, list[float]]:
    """Per type, per node: update seconds, by the same source as the type's times."""
    _fresh_optimizer(optimizer)   # refuse what is not an optimizer before any work
    slots = optimizer_slots(optimizer)
    nbytes = []
    for i in range(len(graph)):
        trainable, versioned = _update_variables(graph, i)
        nbytes.append(update_bytes(sum(_nbytes(w) for w in trainable),
                                   sum(_nbytes(w) for w in versioned), slots))

    def estimate(t: DeviceType) -> list[float]:
        return [0.0 if b == 0 else
                b / t.memory_bandwidth / efficiency[t.kind] + t.launch_overhead_s
                for b in nbytes]

    out = {name: list(measure_update_times(graph, optimizer, device, repeats))
           for name, device in measure.items()}
    for name, t in resolved.items():
        if name in out:
            continue
        est = estimate(t)
        peers = [m for m in measure if resolved[m].kind is t.kind]
        if source[name] == "calibrated" and peers:
            meas = sum(sum(out[m]) for m in peers)
            base = sum(sum(estimate(resolved[m])) for m in peers)
            est = [e * (meas / base if base > 0 else 1.0) for e in est]
        out[name] = est
    return out


def _nbytes(weight: Any) -> int:
    return int(np.prod(weight.shape, dtype=np.int64)) * tf.as_dtype(weight.dtype).size


def _class_ratios(classes: Sequence[str], measured: Sequence[Sequence[float]],
                  estimated: Sequence[Sequence[float]]) -> dict[str, float]:
    """measured / estimated per layer class, pooled over the measured types."""
    sums: dict[str, list[float]] = {c: [0.0, 0.0] for c in classes}
    for meas, est in zip(measured, estimated):
        for c, m, e in zip(classes, meas, est):
            sums[c][0] += m
            sums[c][1] += e
    return {c: (m / e if e > 0 else 1.0) for c, (m, e) in sums.items()}


def _check_positive_int(name: str, value: Any) -> None:
    if isinstance(value, bool) or not isinstance(value, (int, np.integer)) or value <= 0:
        raise ValueError(f"{name} must be an int > 0. Received: {name}={value!r}; pass a positive int.")


def _resolve_types(device_types: Sequence[str | DeviceType]) -> dict[str, DeviceType]:
    if isinstance(device_types, (str, DeviceType)) or not device_types:
        raise ValueError(
            "device_types must be a non-empty sequence of names or DeviceTypes. "
            f"Received: device_types={device_types!r}; pass e.g. ['TITAN_V', 'LOCAL_CPU'].")
    resolved: dict[str, DeviceType] = {}
    for item in device_types:
        device_type = item if isinstance(item, DeviceType) else get_device_type(item)
        resolved.setdefault(device_type.name, device_type)
    return resolved


def _resolve_measure_on(measure_on: Mapping[str, str],
                        resolved: Mapping[str, DeviceType]) -> dict[str, str]:
    measure = {}
    local = {_local_key(d.name) for d in tf.config.list_logical_devices()}
    for name, device in measure_on.items():
        key = canonical_type_name(name)
        if key not in resolved:
            raise ValueError(
                "measure_on names a device type that is not profiled. Received: "
                f"measure_on[{name!r}]={device!r}, device_types={sorted(resolved)}; "
                "add the type to device_types or drop it from measure_on.")
        # Remote devices (with a job) are checked by TensorFlow when used.
        if tf.DeviceSpec.from_string(device).job is None and _local_key(device) not in local:
            raise ValueError(
                f"measure_on names a device that is not present. Received: measure_on[{name!r}]="
                f"{device!r}; use one of {sorted(local)}.")
        measure[key] = device
    return measure


def _local_key(device: str) -> str:
    spec = tf.DeviceSpec.from_string(device)
    return f"/{(spec.device_type or '').upper()}:{spec.device_index or 0}"
