"""Checks that run before training starts: errors say what is wrong, the value received,
and how to fix it."""

from __future__ import annotations

import logging
import os
from typing import Callable

import keras
import tensorflow as tf

from hetpipe_tf import _shim as _keras_shim
from hetpipe_tf._args import check_int
from hetpipe_tf.pipeline.program import check_shared_layers_kept_together

logger = logging.getLogger(__name__)

_OVERRIDES = ("train_step", "compute_loss")


def check_n_m(n_m, max_m, plan) -> None:
    check_int("n_m", n_m, minimum=1, hint="N_m, the minibatches in flight, is a positive "
                                           "integer")
    if max_m is not None and n_m > max_m:
        raise ValueError(
            f"N_m exceeds Max_m, the most minibatches the virtual worker's memory holds. "
            f"Received: n_m={n_m}, max_m={max_m}; pass n_m <= {max_m} (or devices with more "
            "memory).")
    if plan is not None:
        if n_m > plan.n_m:
            short = [s for s in plan.stages if s.memory_bytes > s.memory_available]
            raise ValueError(
                f"N_m is larger than the N_m the plan was made for, so its memory check does "
                f"not hold (stage 0 keeps N_m minibatches). Received: n_m={n_m}, "
                f"plan.n_m={plan.n_m}; make the plan with n_m={n_m} or pass n_m <= {plan.n_m}."
                + (f" The plan is already short of memory on {[s.device for s in short]}."
                   if short else ""))
        short = [s for s in plan.stages if s.memory_bytes > s.memory_available]
        if short:
            s = short[0]
            raise ValueError(
                f"The plan does not fit device memory (N_m > Max_m for this partition). "
                f"Received: stage {s.index} on {s.device} needs {s.memory_bytes} bytes, "
                f"{s.memory_available} available; lower N_m or re-plan.")


def check_plans(plans) -> tuple:
    """One Plan per virtual worker, all with the same N_m (Section 4: N_m is equal in every
    virtual worker)."""
    from hetpipe_tf.partitioner.plan import Plan

    try:
        plans = tuple(plans)
    except TypeError:
        raise ValueError("plan must be a Plan, a sequence of Plans (one per virtual worker) "
                         f"or a callable returning either. Received: plan={plans!r}.") from None
    bad = [i for i, p in enumerate(plans) if not isinstance(p, Plan)]
    if not plans or bad:
        raise ValueError("plan must be a Plan, a sequence of Plans (one per virtual worker) "
                         "or a callable returning either. Received: "
                         + (f"plan[{bad[0]}]={plans[bad[0]]!r}" if bad else "an empty sequence")
                         + "; build plans with hetpipe_tf.partitioner or strategy.manual_plan.")
    n_ms = [p.n_m for p in plans]
    if len(set(n_ms)) > 1:
        raise ValueError(
            "Every virtual worker must run the same N_m (Section 4: N_m = the minimum Max_m "
            f"over the virtual workers). Received: plans with n_m={n_ms}; make every plan with "
            f"n_m={min(n_ms)} (e.g. partitioner.milp.plan_virtual_workers).")
    return plans


def check_model(model, strategy) -> None:
    for name in _OVERRIDES:
        if _keras_shim.call_overridden(model, name):
            raise ValueError(
                f"HetPipeStrategy runs its own pipelined training step, so a model class that "
                f"overrides {name}() cannot be trained by it (the override would be silently "
                f"ignored). Received: model class {type(model).__name__} overrides {name}; "
                "use a Functional or Sequential model without the override: the loss and "
                "metrics via compile(), and any extra loss term (a VAE's KL divergence, a "
                "regulariser of activations) from a layer that calls self.add_loss(...) in "
                "its call(), which every stage adds to the compiled loss "
                "(docs/strategy.md \"Custom training loops\").")
    if model.distribute_strategy is not strategy:
        raise ValueError(
            "The model was not created inside HetPipeStrategy.scope(). Received: "
            f"model.distribute_strategy={model.distribute_strategy!r}; create the model and "
            "call compile() inside `with strategy.scope():`.")
    if model.optimizer is None:
        raise ValueError("The model has no optimizer. Received: optimizer=None; call "
                         "model.compile(optimizer=...) inside strategy.scope().")
    _check_compile(model)
    if _keras_shim.functional_graph(model) is None:
        if isinstance(model, keras.Sequential):
            raise ValueError(
                "The Sequential model is not built, so its layer graph is unknown. Received: "
                f"model={model.name!r} without an input shape; start it with keras.Input(...) "
                "or build it before fit.")
        raise ValueError(
            "HetPipeStrategy runs Sequential and Functional models (a subclassed model has no "
            f"layer graph to cut into stages). Received: model of class {type(model).__name__}; "
            "build the model with the Functional API or keras.Sequential.")
    for layer in _keras_shim.all_layers(model):
        if getattr(layer, "stateful", False):
            raise ValueError(
                "The pipeline runtime cannot place state carried across minibatches "
                f"(stateful=True). Received: layer {layer.name!r} ({type(layer).__name__}) "
                "with stateful=True; use stateful=False.")


def _check_compile(model) -> None:
    """What `compile()` chose that the pipelined step cannot honour (docs/validation.md)."""
    # (An optimizer compiled outside the scope is refused by the strategy when fit
    # distributes its dataset, before Keras builds the optimizer's slots.)
    optimizer = model.optimizer
    if isinstance(optimizer, keras.optimizers.LossScaleOptimizer):
        raise ValueError(
            "HetPipeStrategy does not support loss scaling (the mixed_float16 policy wraps "
            "the optimizer in a LossScaleOptimizer): the pipeline's stages compute unscaled "
            "gradients, which the optimizer would divide by the loss scale, so training "
            "would silently crawl. Received: optimizer=LossScaleOptimizer (policy "
            f"{keras.mixed_precision.global_policy().name!r}); use "
            "keras.mixed_precision.set_global_policy('mixed_bfloat16') (same range as "
            "float32, no loss scaling) or 'float32'.")


def check_jit_compile(model, hetseq: bool) -> None:
    """Refuse `jit_compile=True` where the stages cannot honour it (strategy/xla.py): HetSeq's
    share task is compiled without XLA."""
    if hetseq and model.jit_compile is True:
        raise ValueError(
            "HetSeq's synchronous step does not compile its share task with XLA (the "
            "pipelined modes compile each stage's task). Received: jit_compile=True with "
            "data_parallel='hetseq' and clock_distance=0; call model.compile(..., "
            "jit_compile=False) (or leave the default 'auto'), or train without "
            "data_parallel='hetseq' (clock_distance > 0 trains one-device VWs, which "
            "compile with XLA).")


def _batch_sizes(data) -> set:
    """The static leading dimensions of a batch's tensors (None where unknown)."""
    return {t.shape[0] if t.shape.rank else None for t in tf.nest.flatten(data)
            if t is not None}


def check_batch(data, hint: Callable[[], int | None] = lambda: None) -> int:
    """The batch size the plan is made for: the traced batch's static size, else `hint()`
    (the size Keras' fit batches its data by, `_keras_shim.fit_first_batch`). Smaller
    batches (an epoch's remainder) run as they are, like in Keras."""
    flat = [t for t in tf.nest.flatten(data) if t is not None]
    known = _batch_sizes(data) - {None}
    if len(known) > 1:
        raise ValueError(
            "The tensors of one training batch disagree on the batch size. Received: batch "
            f"shapes {[tuple(t.shape) for t in flat]}; give every input, target and sample "
            "weight the same first dimension.")
    if known:
        return known.pop()
    size = hint()
    if size is None:
        raise ValueError(
            "HetPipeStrategy plans the pipeline for the largest batch a step takes, but this "
            "data's batch size is unknown (the batch dimension is open and Keras reports no "
            f"batch size). Received: batch shapes {[tuple(t.shape) for t in flat]}; batch a "
            "tf.data dataset with dataset.batch(n) before fit, or give fit NumPy arrays and "
            "batch_size.")
    return size


def check_same_batch(data, built_for: int) -> None:
    """A later fit may take batches up to the size the model's pipeline was planned for
    (a smaller one runs as it is); a larger static batch size is refused here, before
    training; an open batch dimension is checked per batch (`check_batch_fits`)."""
    sizes = _batch_sizes(data) - {None}
    if sizes and max(sizes) > built_for:
        raise ValueError(_too_large(max(sizes), built_for))


def check_batch_fits(size: int, built_for: int) -> None:
    """One batch of an open batch dimension, checked when it arrives."""
    if size > built_for:
        raise ValueError(_too_large(size, built_for))


def _too_large(size: int, built_for: int) -> str:
    return ("This batch is larger than the batch size the model's pipeline was planned for "
            "(its stages' memory and N_m are planned for that size). Received: batch size "
            f"{size}, planned for {built_for}; train with batch_size <= {built_for}, or train "
            "this batch size under a new HetPipeStrategy (planned for it).")


def check_plan(plan, program, model, batch_size: int, cluster=None) -> None:
    """The plan's stages name the nodes of `program.graph`, in the graph's order, each on
    its own device that exists in this process (and in `cluster`: default, the cluster
    given to the model's strategy when it is a hetpipe_tf Cluster)."""
    check_plan_devices(plan, _given_cluster(model) if cluster is None else cluster)
    _check_plan_layers([n for s in plan.stages for n in s.layer_names], program.graph)
    if plan.num_layers != len(program.graph):
        raise ValueError(
            f"The plan does not match the model. Received: plan for {plan.num_layers} layers, "
            f"model {model.name!r} has {len(program.graph)}; make a new plan for this model.")
    plan.check_matches(program.layer_names)
    check_shared_layers_kept_together(program.graph, [(s.first, s.last) for s in plan.stages])
    if plan.batch_size and plan.batch_size != batch_size:
        logger.warning("The plan was made for batch size %d but the dataset's batch size is "
                       "%d: its predicted times and memory do not apply.", plan.batch_size,
                       batch_size)


def _check_plan_layers(order, graph) -> None:
    """The plan's layer names are the graph's node names, in a topological order."""
    names = [node.name for node in graph.nodes]
    if sorted(order) != sorted(names):
        missing = sorted(set(names) - set(order))
        extra = sorted(set(order) - set(names))
        raise ValueError(
            "The plan does not match the model: their layers differ. Received: plan "
            f"layers missing from the model: {extra[:5]}, model layers missing from "
            f"the plan: {missing[:5]}; make a new plan for this model.")
    position = {name: p for p, name in enumerate(order)}
    for p, name in enumerate(order):
        if any(position[graph.nodes[r.node].name] > p
               for r in graph.layer(name).inputs if not r.is_model_input):
            raise ValueError(
                "The plan's layer order is not a topological order of the model: "
                f"layer {name!r} at position {p} reads a tensor produced later. Received: "
                f"order={list(order)[:p + 1]}...; make a new plan.")


# --- devices ----------------------------------------------------------------------------

def _device_key(tf_device: str) -> tuple:
    """(job, replica, task, type, index) of a TF device string; None = unspecified."""
    try:
        spec = tf.DeviceSpec.from_string(tf_device)
    except (ValueError, TypeError):
        raise ValueError(
            "A plan stage's tf_device is not a TensorFlow device string. Received: "
            f"tf_device={tf_device!r}; use e.g. '/job:localhost/replica:0/task:0/device:CPU:1'."
        ) from None
    kind = spec.device_type.upper() if spec.device_type else None
    return (spec.job, spec.replica, spec.task, kind, spec.device_index)


def _same_device(a: tuple, b: tuple) -> bool:
    """Whether two device keys can name one device (unspecified fields match anything; a
    local device name without a job is /job:localhost/replica:0/task:0)."""
    return all(x is None or y is None or x == y for x, y in zip(a, b))


def _local_key(name: str) -> tuple:
    job, replica, task, kind, index = _device_key(name)
    if job is None:
        job, replica, task = "localhost", 0, 0
    return (job, replica, task, kind, index)


def check_plan_devices(plan, cluster=None) -> None:
    """Every stage on its own device, each existing in this process (TensorFlow's soft
    placement would otherwise silently run it on another device) and, when `cluster` (a
    hetpipe_tf Cluster) is given, one of the cluster's devices."""
    keys = [_device_key(s.tf_device) for s in plan.stages]
    for j, a in enumerate(keys):
        for i in range(j):
            if _same_device(keys[i], a):
                raise ValueError(
                    "The plan puts two stages on one device: a device runs one stage of a "
                    "virtual worker (the planner never does this, and the stages would "
                    f"share one device's time and memory). Received: stages {i} and {j} on "
                    f"{plan.stages[i].tf_device!r} and {plan.stages[j].tf_device!r}; give "
                    "every stage its own device, or merge the two stages into one.")
    local = [d.name for d in tf.config.list_logical_devices()]
    local_keys = [_local_key(n) for n in local]
    connected = any(k[0] != "localhost" for k in local_keys)
    for s, key in zip(plan.stages, keys):
        # After connect_to_cluster, /job:localhost means this task under its own job name.
        probe = (None, None, None) + key[3:] if key[0] == "localhost" and connected else key
        if not any(_same_device(probe, k) for k in local_keys):
            raise ValueError(
                f"Stage {s.index} of the plan names a device that does not exist in this "
                "process, where TensorFlow would silently run it on another device. "
                f"Received: tf_device={s.tf_device!r}; use one of {local} "
                f"(tf.config.list_logical_devices()), {_more_devices_hint(plan, s.tf_device)}, or "
                "connect to the cluster (tf.config.experimental_connect_to_cluster) "
                "before fit.")
    if cluster is None:
        return
    by_name = {d.name for d in cluster.devices}
    cluster_keys = [_device_key(d.tf_device) for d in cluster.devices]
    for s, key in zip(plan.stages, keys):
        if s.device in by_name or any(_same_device(key, k) for k in cluster_keys):
            continue
        raise ValueError(
            f"Stage {s.index} of the plan runs on a device that is not in the cluster given "
            f"to HetPipeStrategy. Received: device={s.device!r}, tf_device={s.tf_device!r}; "
            "use the cluster's devices ("
            + ", ".join(f"{d.name}={d.tf_device}" for d in cluster.devices[:8])
            + (", ..." if len(cluster.devices) > 8 else "")
            + ") or pass the cluster the plan was made for.")


def _more_devices_hint(plan, missing: str) -> str:
    """How to make the logical CPUs a local plan needs: hetpipe_tf's own call."""
    if (tf.DeviceSpec.from_string(missing).device_type or "CPU").upper() != "CPU":
        return ("create more logical devices with tf.config.set_logical_device_configuration "
                "before TensorFlow starts")
    indices = [tf.DeviceSpec.from_string(st.tf_device).device_index or 0
               for st in plan.stages
               if (tf.DeviceSpec.from_string(st.tf_device).device_type or "CPU").upper() == "CPU"]
    n = max(indices, default=0) + 1
    return (f"split this machine's CPU into {n} logical devices at the top of the program, "
            "before TensorFlow starts: `import hetpipe_tf as hp; "
            f"hp.configure_logical_devices({n})` (hetpipe_tf.cluster.local; a "
            f"Cluster.local([\"CPU\"] * {n}) runs on them)")


def _given_cluster(model):
    """The hetpipe_tf Cluster given to the model's strategy, if one was (a TF cluster spec
    names tasks, not devices, so it cannot say which devices a plan may use)."""
    from hetpipe_tf.cluster.spec import Cluster

    options = getattr(model.distribute_strategy, "options", None)
    given = getattr(getattr(options, "layout", None), "cluster", None)
    if isinstance(given, Cluster):
        return given
    if isinstance(given, dict) and "hosts" in given:
        return Cluster.from_dict(given)
    return None


def inter_op_threads() -> int:
    """The threads of TensorFlow's inter-op pool: the configured number, or (0, the
    default) the CPUs this process may run on, as TensorFlow picks."""
    n = tf.config.threading.get_inter_op_parallelism_threads()
    if n:
        return n
    try:
        return len(os.sched_getaffinity(0))
    except AttributeError:   # not Linux
        return os.cpu_count() or 1


def check_inter_op_threads() -> None:
    """A threaded pipeline needs 2 inter-op threads: Keras' train step holds one while its
    `submit` waits for room in the pipeline, and the stages' work needs another (with one,
    several VWs, or one VW at N_m > 1, hung at the first batch; docs/validation.md)."""
    n = inter_op_threads()
    if n < 2:
        raise ValueError(
            "A pipelined fit needs TensorFlow's inter-op thread pool to have at least 2 "
            "threads (Keras' step holds one while it waits for the pipeline). Received: "
            f"inter_op_parallelism_threads={tf.config.threading.get_inter_op_parallelism_threads()}"
            f" ({n} thread(s)); call tf.config.threading.set_inter_op_parallelism_threads(2) "
            "before TensorFlow starts (also on a 1-CPU machine).")
