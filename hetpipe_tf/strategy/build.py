"""Building the executor that trains one model, and what the strategy keeps for it.

At a model's first traced train step the strategy makes its layout (strategy/layout.py:
the plans given, or made now) and builds its executor here, by the training mode that
applies (strategy/modes.py: one VW, a synchronous schedule, several VWs under WSP, HetSeq).
Per model the strategy keeps a `Training`: the executor and what it was built from. A new
`compile()` (optimizer, loss, metrics, trainable flags) rebuilds it at the next fit on the
same layout, carrying the weights.
"""

from __future__ import annotations

import dataclasses
import logging
import sys
from typing import Any, Callable

import keras
import tensorflow as tf

from hetpipe_tf import _shim as _keras_shim
from hetpipe_tf._shim import keras_trainer
from hetpipe_tf.cluster.roles import connected_to_cluster
from hetpipe_tf.partitioner.input_shapes import input_shapes_set, set_input_shapes
from hetpipe_tf.pipeline.in_graph import InGraphRuntime
from hetpipe_tf.pipeline.program import Program
from hetpipe_tf.ps.shared_calls import shapes_first
from hetpipe_tf.strategy import schedules as sync_schedules
from hetpipe_tf.strategy import training_state, xla
from hetpipe_tf.strategy.compensation import (log_choice, optimizer_adjustment,
                                               predictor_factory)
from hetpipe_tf.strategy.layout import Layout, layout_for
from hetpipe_tf.strategy.modes import Job, TrainingMode, VirtualWorkers, mode_for
from hetpipe_tf.strategy.summary import describe, print_summary
from hetpipe_tf.strategy.validation import (check_batch, check_inter_op_threads, check_model,
                                            check_plan)
from hetpipe_tf.strategy.vw_metrics import VwMetrics, additive_metrics, state_metrics

logger = logging.getLogger(__name__)


@dataclasses.dataclass(frozen=True)
class Training:
    """What the strategy keeps for one model: its executor and what it was built from."""

    executor: Any    # one of the executors of strategy/modes.py
    program: Program
    compiled: tuple          # (optimizer, loss, metrics, trainable variables) at build
    batch_size: int
    metrics_result: Callable  # the model class's own get_metrics_result, bound
    layout: Layout           # the model's VWs (kept across a re-compile's rebuild)
    mode: TrainingMode
    # The metrics' state per VW (strategy/vw_metrics.py), or None: the shared metrics.
    vw_metrics: Any = None


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


def build_training(options, model, data, *, strategy, layout: Layout | None,
                   place_locally: Callable, guard_model: Callable) -> Training:
    """Build `model`'s executor for the batch `data` under `options` (`StrategyOptions`):
    on `layout`, or (None: the model's first fit) on the layout made now; the training mode
    that applies builds it (strategy/modes.py). `place_locally` and `guard_model` are the
    strategy's (variables in the caller's device scope; the model's wrappers)."""
    frame = sys._getframe(1)
    first_fit = layout is None
    fix_open_inputs(model, data, frame)
    check_model(model, strategy)
    batch_size = check_batch(data, lambda: _keras_shim.fit_first_batch(frame, False)[0])
    if layout is None:
        layout = layout_for(options, model, batch_size)
    program = Program.from_model(model, jit_compile=xla.requested(model))
    for p in layout.plans:
        check_plan(p, program, model, batch_size)
    if options.schedule.synchronous:
        sync_schedules.check_training(options.schedule, model, batch_size)
    training_state.check_optimizer(model.optimizer,
                                   max((p.num_stages for p in layout.plans), default=1))
    guard_model(model)   # before the build: its slots go to the host
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
        update_state(loss, y, y_pred, sample_weight)
        return original()

    def update_state(loss, y, y_pred, sample_weight):
        batch = tf.shape(keras.tree.flatten(y_pred)[0])[0]
        _keras_shim.loss_tracker(model).update_state(loss, sample_weight=batch)
        if per_output:
            # Its per-output loss trackers (the stage tasks leave them alone: stage.py
            # compiled_loss): updated here, one minibatch at a time.
            closs(y, y_pred, sample_weight)
        cm = _keras_shim.compile_metrics(model)
        if cm is not None:
            cm.update_state(y, y_pred, sample_weight)

    # Shared by every VW's (and HetSeq's) threads: in a cluster job a frozen task's tensor
    # must not hold tf.function's lock, and a remote update must have run before the next
    # one reads the metrics (ps/shared_calls.py shapes_first); local tensors are ready.
    if connected_to_cluster():
        update_metrics = shapes_first(update_metrics)
    vws = max(len(layout.plans), 1)
    mode = mode_for(options, layout)
    vw_metrics = _vw_metrics(options, model, mode, vws, update_state, original,
                             place_locally, per_output)
    compensation, d = options.compensation, layout.clock_distance
    adjust = optimizer_adjustment(compensation.value, layout.n_m, vws, d)
    predictor = predictor_factory(compensation.value, layout.n_m, vws)
    log_choice(compensation.value, compensation.by_default, layout.n_m, vws, d,
               adjusted=adjust is not None)
    runtime = mode.build(Job(model, program, batch_size, layout, update_metrics, strategy,
                             place_locally, adjust=adjust, predictor=predictor,
                             vw_metrics=vw_metrics))
    try:
        if not isinstance(runtime, InGraphRuntime):   # its threads wait on Keras' step
            check_inter_op_threads()
        if first_fit:   # what was chosen, through Keras' output (silenced by verbose=0)
            verbose = keras_trainer.fit_verbose(frame)
            if verbose:
                shares = getattr(getattr(runtime, "shares", None), "sizes", None)
                print_summary(describe(options, layout, mode,
                                       options.layout.cluster_or_none(),
                                       model_name=model.name,
                                       executor=type(runtime).__name__, shares=shares),
                              verbose)
    except BaseException:
        runtime.close()   # nothing is kept of a build that raised: no thread outlives it
        raise
    for w, p in enumerate(layout.plans):
        logger.info("HetPipe virtual worker %d of %d for %s:\n%s", w, len(layout.plans),
                    model.name, p.table())
    return Training(runtime, program, compiled_state(model), batch_size, original, layout,
                    mode, vw_metrics)


def _vw_metrics(options, model, mode: TrainingMode, vws: int, update_state: Callable,
                original: Callable, place_locally: Callable,
                per_output: bool) -> VwMetrics | None:
    """The metrics' state per VW (strategy/vw_metrics.py) where it applies: several VWs
    under WSP on HetPipe's schedule (not a virtual clock, not split batches), every metric
    additive; each VW's pipeline then enrolls (a one-stage VW updates its copy inside its
    task's call). Else None: every VW updates the model's metrics under their shared lock."""
    if (type(mode) is not VirtualWorkers or vws < 2 or options.splits_batches
            or options.schedule.synchronous):
        return None
    metrics = state_metrics(model)
    if not additive_metrics(metrics):
        return None
    return VwMetrics(metrics, update_state, original, vws, place_locally,
                     per_output=per_output, shown=list(model.metrics))
