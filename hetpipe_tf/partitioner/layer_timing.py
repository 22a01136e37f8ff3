"""TensorFlow's measurement of a layer graph: forward FLOPs and forward+backward seconds.

- FLOPs: TensorFlow's own counter. The model's forward pass is traced once as one
  `tf.function` (training mode) on concrete input specs, each node's call under its own
  name scope "hp_node_<i>", and `tf.compat.v1.profiler.profile(..., float_operation())`
  counts the graph; ops are attributed to nodes by that scope. Ops without a registered
  FLOP statistic (activations, pooling on some versions) count 0.
- Time on a device at hand: each node's forward+backward (GradientTape w.r.t. its float
  inputs and trainable weights) in a `tf.function` on random inputs, one warm-up call,
  median of `repeats`, minus the cost of calling an empty tf.function on that device (a
  stage runs as one function, so that cost is not a layer's; floor `MIN_MEASURED_S`).
  Every variable of every layer it runs (`layer.variables`: weights, BatchNorm moving
  statistics, and the state of each Keras `SeedGenerator` that Dropout, GaussianNoise or an
  augmentation layer draws from) is restored afterwards, and the random inputs are drawn
  statelessly (no global op seed consumed): timing leaves every random stream where plain
  Keras would find it.
"""

from __future__ import annotations

import contextlib
import statistics
import time
from collections.abc import Iterator, Sequence
from typing import Any

import tensorflow as tf

from hetpipe_tf.partitioner.layer_graph import LayerGraph, TensorRef

MIN_MEASURED_S = 1e-6  # floor of a measured layer time once the call cost is removed
_SCOPE = "hp_node_"


@contextlib.contextmanager
def quiet_tf_logging() -> Iterator[None]:
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
    with quiet_tf_logging():
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


def graph_variables(graph: LayerGraph) -> list:
    """Every variable the layers of `graph` own, seed generators' states included
    (`layer.variables`; deduplicated: a shared layer has several nodes)."""
    seen: dict[int, Any] = {}
    for i in range(len(graph)):
        for v in getattr(graph.layer_of(i), "variables", ()):
            seen.setdefault(id(v), v)
    return list(seen.values())


@contextlib.contextmanager
def preserved(variables: Sequence[Any]) -> Iterator[None]:
    """Restore every variable in `variables` to its value on entry, on exit."""
    saved = [(v, v.numpy()) for v in variables]
    try:
        yield
    finally:
        for v, value in saved:
            v.assign(value)


def measure_layer_times(graph: LayerGraph, batch_size: int, device: str,
                        repeats: int = 3) -> tuple[float, ...]:
    """Median forward+backward seconds of each node at `batch_size` on `device`; every
    variable of the graph's layers is left as it was (module docstring).

    The cost of calling an empty tf.function on `device` is subtracted (floored at
    `MIN_MEASURED_S`): a pipeline stage is one compiled function, so the per-call cost
    must not be charged to each of its layers.
    """
    call_cost = _call_overhead(device, max(repeats, 5))
    with preserved(graph_variables(graph)):
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
        inputs = [random_tensor((batch_size, *graph.tensor_shape(ref)), graph.tensor_dtype(ref))
                  for ref in node.inputs]
        return _median_seconds(step, inputs, repeats)


def random_tensor(shape: tuple[int, ...], dtype: str) -> tf.Tensor:
    """Random values drawn statelessly: an unseeded `tf.random.normal` would advance the
    global op-seed counter that the user's later unseeded random ops read."""
    dtype = tf.as_dtype(dtype)
    if dtype.is_floating:
        return tf.random.stateless_normal(shape, seed=[0, 0], dtype=dtype)
    return tf.zeros(shape, dtype=dtype)  # index 0 is valid for embeddings and lookups

