"""TensorFlow's measurement of each node's per-minibatch update.

What a stage's update costs for the node's weights, as the runtime does it
(`pipeline/weights.py` StageWeights.apply): one compiled call applying the optimizer to
the node's trainable weights and adding the deltas of its float non-trainable weights,
then an eager `tf.identity` snapshot of each of those variables (the next weight
version). Measured on copies of the node's weights with a fresh optimizer built from the
given one (its config), median of `repeats` after one warm-up, minus the same update of
one scalar variable (a stage makes ONE such call per minibatch, so its fixed cost, the
step counter and the call, is not a layer's; floor `MIN_MEASURED_S`). Nodes without
weights (and later calls of a shared layer) cost 0.
"""

from __future__ import annotations

import statistics
import threading
import time
from collections.abc import Sequence
from typing import Any

import keras
import numpy as np
import tensorflow as tf

from hetpipe_tf.partitioner.layer_graph import LayerGraph
from hetpipe_tf.partitioner.layer_timing import MIN_MEASURED_S, quiet_tf_logging


def fresh_optimizer(optimizer: Any) -> keras.optimizers.Optimizer:
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
        opt = fresh_optimizer(optimizer)
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
        with quiet_tf_logging():
            fixed = _update_seconds([tf.zeros((1,))], [], optimizer, device, max(repeats, 5))
            for i in range(len(graph)):
                trainable, versioned = update_variables(graph, i)
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


def update_variables(graph: LayerGraph, i: int) -> tuple[list, list]:
    """(trainable, float non-trainable) weights node i updates: none for a later call of a
    shared layer (its weights are updated once, with its first call's node)."""
    if graph.nodes[i].param_bytes == 0:
        return [], []
    layer = graph.layer_of(i)
    trainable = list(getattr(layer, "trainable_weights", ()))
    versioned = [w for w in getattr(layer, "non_trainable_weights", ())
                 if tf.as_dtype(w.dtype).is_floating]
    return trainable, versioned


def weight_bytes(weight: Any) -> int:
    return int(np.prod(weight.shape, dtype=np.int64)) * tf.as_dtype(weight.dtype).size

