"""Building the executor that trains one model, and what the strategy keeps for it.

At a model's first traced train step the strategy plans it (when no plan was given) and
builds its executor here: an `InGraphRuntime` (one stage at N_m = 1, ops of Keras' own step),
a `PipelineRuntime` (one pipelined virtual worker) or a `Coordinator` of several virtual
workers through the parameter servers (hetpipe_tf/strategy/virtual_workers.py). Per model
the strategy keeps a `Training`: the executor and what it was built from. A new `compile()`
(optimizer, loss, metrics, trainable flags) rebuilds it at the next fit, carrying the
weights. The model's `get_metrics_result` is replaced by one that drains first, so epoch-end
logs, validation and callbacks see every minibatch.
"""

from __future__ import annotations

import dataclasses
import logging
import sys
import threading
from typing import Any, Callable

import keras
import tensorflow as tf

from hetpipe_tf import _shim as _keras_shim
from hetpipe_tf.cluster.roles import connected_to_cluster
from hetpipe_tf.partitioner.layer_graph import input_shapes_set, set_input_shapes
from hetpipe_tf.partitioner.plan import Plan
from hetpipe_tf.pipeline.in_graph import InGraphRuntime, runs_in_graph
from hetpipe_tf.pipeline.program import Program
from hetpipe_tf.pipeline.runtime import PipelineRuntime
from hetpipe_tf.pipeline.stage import Stage
from hetpipe_tf.pipeline.weights import StageWeights, WeightVersions
from hetpipe_tf.ps.faults import shapes_first
from hetpipe_tf.strategy import schedules as sync_schedules
from hetpipe_tf.strategy import training_state
from hetpipe_tf.strategy.hetseq import (build_hetseq, split_shares, splits_batches,
                                        synchronous_hetseq, whole_batch_note)
from hetpipe_tf.strategy.compensation import (log_choice, optimizer_adjustment,
                                               predictor_factory)
from hetpipe_tf.strategy.remote_guard import GuardedPipelineRuntime, guard_for
from hetpipe_tf.strategy.validation import (check_batch, check_inter_op_threads, check_model,
                                            check_n_m, check_plan, check_plans)

logger = logging.getLogger(__name__)


@dataclasses.dataclass
class Training:
    """What the strategy keeps for one model: its executor and what it was built from."""

    executor: Any    # PipelineRuntime / InGraphRuntime (one VW), Coordinator (several)
    program: Program
    compiled: tuple          # (optimizer, loss, metrics, trainable variables) at build
    batch_size: int
    metrics_result: Callable  # the model class's own get_metrics_result, bound


def compiled_state(model) -> tuple:
    return (model.optimizer, _keras_shim.compile_loss(model), _keras_shim.compile_metrics(model),
            tuple(model.trainable_variables))


def same_objects(a: tuple, b: tuple) -> bool:
    return len(a) == len(b) and all(x is y for x, y in zip(a, b))


def same_compile(a: tuple, b: tuple) -> bool:
    return same_objects(a[:3], b[:3]) and same_objects(a[3], b[3])


def changed_without_compile(model, compiled: tuple) -> str:
    now = compiled_state(model)
    what = [name for name, a, b in zip(("optimizer", "loss", "metrics"), compiled, now)
            if a is not b]
    if not same_objects(compiled[3], now[3]):
        what.append(f"trainable variables ({len(compiled[3])} at compile(), {len(now[3])} "
                    "now)")
    return (f"Model {model.name!r} changed since compile() and Keras is tracing its train "
            "step again (e.g. this fit adds sample weights or changes the inputs' structure); "
            "the pipeline cannot be rebuilt inside that trace. Received: changed "
            f"{', '.join(what)}. Call model.compile() again in strategy.scope() after "
            "changing a layer's `trainable` (Keras asks for this too: without it, its "
            "existing train step keeps the old setting).")


def fix_open_inputs(model, data, frame) -> None:
    """Where the model's Inputs leave a per-sample dimension open (keras_hub tasks: the
    sequence length), plan it for the shapes of this fit's batches: the traced batch's, or
    the first batch's where the trace leaves them open too (`set_input_shapes`)."""
    functional = _keras_shim.functional_graph(model)
    if functional is None or not any(None in tuple(t.shape)[1:] for t in functional.inputs):
        return

    def per_sample(x) -> list:
        return [tuple(t.shape)[1:] for t in _keras_shim.standardize_inputs(functional, x)]

    shapes = per_sample(keras.utils.unpack_x_y_sample_weight(data)[0])
    if any(None in s for s in shapes):
        with tf.init_scope():
            _, first = _keras_shim.fit_first_batch(frame)
            if first is not None:
                shapes = per_sample(keras.utils.unpack_x_y_sample_weight(first)[0])
    if any(None in s for s in shapes):
        raise ValueError(
            "The model's inputs leave a dimension open and this data does not fix it, so "
            "there is no shape to plan the pipeline for. Received: per-sample input shapes "
            f"{shapes}; pad or crop the inputs to a fixed length (e.g. a keras_hub "
            "preprocessor's sequence_length) or give keras.Input a full shape.")
    given = input_shapes_set(model)
    if given is not None and given != tuple(shapes):
        grew = [(g, s) for g, s in zip(given, shapes) if any(b > a for a, b in zip(g, s))]
        if grew:
            raise ValueError(
                "These inputs are larger than the shapes the model's pipeline was planned "
                f"for. Received: per-sample shapes {shapes}, planned for {list(given)}; "
                "feed inputs no larger than planned, or train under a new HetPipeStrategy.")
        return   # smaller inputs run as they are, on the plan made for the larger ones
    set_input_shapes(model, shapes)


def build_training(extended, model, data) -> Training:
    """Plan (at the first fit) and build `model`'s executor for the batch `data`: an
    `InGraphRuntime` or `PipelineRuntime` for one virtual worker, a `Coordinator` for several;
    installs the draining `get_metrics_result` on the model."""
    strategy = extended._container_strategy()
    frame = sys._getframe(1)
    fix_open_inputs(model, data, frame)
    check_model(model, strategy)
    batch_size = check_batch(data, lambda: _keras_shim.fit_first_batch(frame, False)[0])
    hetseq = synchronous_hetseq(extended)   # shares, no plans
    if not extended.plans and not hetseq:
        with tf.init_scope():  # we are inside Keras' train-function trace: plan eagerly
            if extended._plan_fn is not None:
                got = extended._plan_fn(model)
                extended.plans = (got,) if isinstance(got, Plan) else check_plans(got)
            else:
                extended.plans = extended._make_plans(model, batch_size)
        if extended.n_m is None:
            extended.n_m = min(p.n_m for p in extended.plans)
        for p in extended.plans:
            check_n_m(extended.n_m, extended.max_m, p)
        if len(extended.plans) == 1:
            extended.plan = extended.plans[0]
    program = Program.from_model(model)
    for p in extended.plans:
        check_plan(p, program, model, batch_size)
    if sync_schedules.synchronous(extended):
        sync_schedules.check_training(extended, model, batch_size)
    training_state.check_optimizer(model.optimizer,
                                   max((p.num_stages for p in extended.plans), default=1))
    extended.guard_model(model)   # before the build: its slots go to the host
    with tf.init_scope():
        training_state.build_canonical(model)
    # The class's own method: an earlier build may have replaced the instance's.
    original = type(model).get_metrics_result.__get__(model)

    # Keras weighs each output's loss tracker by the STATIC batch size (None, i.e. weight 1,
    # in a trace generalized over sizes): with such trackers, one trace per batch size, so
    # HetSeq's unequal shares and a remainder batch count by their size.
    closs = _keras_shim.compile_loss(model)
    per_output = closs is not None and bool(closs.metrics)

    @tf.function(reduce_retracing=not per_output)
    def update_with_masks(loss, y, y_pred, sample_weight, masks):
        # y_pred's Keras masks (Masking, mask_zero) do not pass a tf.function's boundary:
        # they come as an argument of their own and are attached again, so that the
        # metrics weigh the masked steps out as in Keras' own train step.
        for t, m in zip(keras.tree.flatten(y_pred), masks):
            if m is not None:
                _keras_shim.set_keras_mask(t, m)
        return update_metrics_body(loss, y, y_pred, sample_weight)

    def update_metrics(loss, y, y_pred, sample_weight):
        masks = [_keras_shim.keras_mask(t) for t in keras.tree.flatten(y_pred)]
        return update_with_masks(loss, y, y_pred, sample_weight, masks)

    def update_metrics_body(loss, y, y_pred, sample_weight):
        batch = tf.shape(keras.tree.flatten(y_pred)[0])[0]
        _keras_shim.loss_tracker(model).update_state(loss, sample_weight=batch)
        if per_output:
            # Its per-output loss trackers (the stage tasks leave them alone: stage.py
            # compiled_loss): updated here, one minibatch at a time.
            closs(y, y_pred, sample_weight)
        cm = _keras_shim.compile_metrics(model)
        if cm is not None:
            cm.update_state(y, y_pred, sample_weight)
        return original()

    # Shared by every VW's (and HetSeq's) threads: in a cluster job a frozen task's tensor
    # must not hold tf.function's lock (ps/faults.py shapes_first); local tensors are ready.
    if connected_to_cluster():
        update_metrics = shapes_first(update_metrics)
    vws = max(len(extended.plans), 1)
    adjust = optimizer_adjustment(extended.compensation, extended.n_m, vws,
                                  extended.clock_distance)
    predictor = predictor_factory(extended.compensation, extended.n_m, vws)
    log_choice(extended.compensation, extended.compensation_by_default,
               extended.n_m, vws, extended.clock_distance, adjusted=adjust is not None)
    if hetseq:
        runtime = build_hetseq(extended, model, program, batch_size, update_metrics, strategy)
    elif len(extended.plans) == 1:
        stages = Stage.for_plan(extended.plans[0], program, model)
        states = training_state.OptimizerStates(model, strategy, 1, adjust=adjust)
        with tf.init_scope():
            own = [s.trainable for s in stages]
            optimizers = states.for_virtual_worker(own, own)
        weights = WeightVersions([
            StageWeights(s.device, s.trainable, s.versioned_nt, o, extended.n_m,
                         counter=model.optimizer.iterations if s.index == 0 else None,
                         emulated_speed_factor=s.emulated_speed_factor,
                         predictor=predictor(s.device))
            for s, o in zip(stages, optimizers)])
        # Stages on remote tasks: a lost task ends the calls within fault_timeout_s
        # (strategy/remote_guard.py); the in-graph runtime cannot be guarded.
        guard = None if sync_schedules.synchronous(extended) else guard_for(extended)
        if sync_schedules.synchronous(extended):   # GPipe / 1F1B (docs/schedules.md)
            runtime = sync_schedules.build_runtime(
                extended, stages, weights, update_metrics, extended.plans[0],
                on_run_start=states.seed, on_run_end=states.merge)
        elif guard is not None:
            runtime = GuardedPipelineRuntime(stages, weights, extended.n_m, update_metrics,
                                             plan=extended.plans[0], on_run_start=states.seed,
                                             on_run_end=states.merge, guard=guard)
        elif extended.in_graph and runs_in_graph(stages, extended.n_m):
            runtime = InGraphRuntime(stages[0], weights, update_metrics,
                                     model.optimizer.iterations, plan=extended.plans[0],
                                     on_run_start=states.seed, on_run_end=states.merge)
        else:
            runtime = PipelineRuntime(stages, weights, extended.n_m, update_metrics,
                                      plan=extended.plans[0], on_run_start=states.seed,
                                      on_run_end=states.merge)
    else:
        from hetpipe_tf.strategy.virtual_workers import build_virtual_workers
        split = (split_shares(extended, extended.plans, batch_size)
                 if splits_batches(extended) else None)
        note = None if split is not None else whole_batch_note(extended.plans, batch_size)
        if note:   # which dispatch was chosen, and what the other predicts (docs/hetseq.md)
            logger.info(note)
        runtime = build_virtual_workers(
            model, program, extended.plans, extended.n_m, extended.clock_distance, update_metrics,
            split=split,
            cluster=extended._cluster_or_none(), placement=extended.placement,
            ps_hosts=extended.ps_hosts, place_locally=extended.place_locally,
            make_runtime=sync_schedules.runtime_factory(extended, update_metrics),
            fresh_pulls=extended.fresh_pulls, strategy=strategy, adjust=adjust,
            predictor=predictor, faults=getattr(extended, "faults", None))
    if not isinstance(runtime, InGraphRuntime):   # its threads wait on Keras' step
        try:
            check_inter_op_threads()
        except ValueError:
            runtime.close()
            raise
    extended._runtime_threads.update(runtime.thread_ids)

    def get_metrics_result():
        # Keras reads the metrics at the end of every epoch (and of evaluate): drain so
        # they, the validation that follows and epoch-end callbacks see every minibatch.
        if tf.executing_eagerly() and threading.get_ident() not in extended._runtime_threads:
            extended.drain()
        return original()

    object.__setattr__(model, "get_metrics_result", get_metrics_result)
    for w, p in enumerate(extended.plans):
        logger.info("HetPipe virtual worker %d of %d for %s:\n%s", w, len(extended.plans),
                    model.name, p.table())
    return Training(runtime, program, compiled_state(model), batch_size, original)
