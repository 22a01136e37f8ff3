"""The strategy's side of synchronous schedules (GPipe, 1F1B; docs/schedules.md): the
arguments `schedule=`, `micro_batches=`, `rematerialize=` checked when the strategy is
made (into its `ScheduleOptions`), the model and batch checked when training starts, and
the executor built.

With a synchronous schedule each minibatch is one update on every stage (N_m = 1: an
`n_m` given with it is refused); `SyncPipelineRuntime` runs one virtual worker, and with
several the `Coordinator` drives one per VW through the parameter servers unchanged (a
wave is one minibatch).
"""

from __future__ import annotations

from typing import Any, Callable

import keras

from hetpipe_tf._args import check_int
from hetpipe_tf.core.sync_schedule import Schedule
from hetpipe_tf.pipeline.sync_runtime import SyncPipelineRuntime
from hetpipe_tf.strategy.data_parallel import DataParallel

# Loss reductions whose minibatch value is the row-weighted mean of its micro-batches'
# values (so scaling each micro-batch's loss by its rows / the minibatch's rows is exact).
_MEAN_REDUCTIONS = ("sum_over_batch_size", "mean")


def check_arguments(schedule: Any, micro_batches: Any, rematerialize: Any,
                    n_m: Any, data_parallel: Any = None) -> Schedule:
    """Refuse bad schedule arguments before anything is built; returns the Schedule."""
    schedule = Schedule.parse(schedule)
    try:   # a bad data_parallel is refused by its own check, with its own message
        hetseq = DataParallel.parse(data_parallel) is DataParallel.HETSEQ
    except ValueError:
        hetseq = False
    if schedule.synchronous and hetseq:
        raise ValueError(
            "HetSeq data parallelism holds the whole model on every device; a pipeline "
            f"schedule needs stages. Received: schedule={schedule}, "
            f"data_parallel={data_parallel!r}; use one of them (HetSeq is one synchronous "
            "step per batch already).")
    if not isinstance(rematerialize, bool):
        raise ValueError("rematerialize must be True or False. Received: "
                         f"rematerialize={rematerialize!r}.")
    if not schedule.synchronous:
        if micro_batches is not None or rematerialize:
            raise ValueError(
                "micro_batches and rematerialize belong to the synchronous schedules. "
                f"Received: schedule={schedule}, micro_batches={micro_batches!r}, "
                f"rematerialize={rematerialize}; pass schedule=Schedule.GPIPE or "
                "Schedule.ONE_F_ONE_B, or drop them (HetPipe's pipeline uses n_m).")
    else:
        check_int("micro_batches", micro_batches, minimum=1, hint=(
            f"a synchronous schedule ({schedule}) needs M micro-batches; pass a divisor of "
            "the batch size (GPipe's bubble (K-1)/(M+K-1) is small for M >= 4 x stages)"))
        if n_m is not None:
            raise ValueError(
                "n_m (minibatches in flight) is HetPipe's; a synchronous schedule applies "
                f"every minibatch before the next (N_m = 1). Received: schedule={schedule}, "
                f"n_m={n_m}; drop n_m, or use schedule=Schedule.HETPIPE.")
    return schedule


def _losses(loss) -> list:
    if isinstance(loss, dict):
        return [x for v in loss.values() for x in _losses(v)]
    if isinstance(loss, (list, tuple)):
        return [x for v in loss for x in _losses(v)]
    return [loss]


def check_training(options, model, batch_size: int) -> None:
    """Refuse, before the first step, what a synchronous schedule cannot run exactly;
    `options`: the strategy's `ScheduleOptions`."""
    m = options.micro_batches
    if m > batch_size:
        raise ValueError(
            f"More micro-batches than rows in a minibatch. Received: micro_batches={m}, "
            f"batch size {batch_size}; pass micro_batches <= {batch_size} or a larger batch.")
    if batch_size % m:
        divisors = [d for d in range(1, batch_size + 1) if batch_size % d == 0]
        raise ValueError(
            "The batch size must split into equal micro-batches (only an epoch's smaller "
            "last batch is split unevenly: its first micro-batches get a row more). "
            f"Received: batch size {batch_size}, micro_batches={m}; pass one of {divisors}.")
    if m > 1:
        for loss in _losses(getattr(model, "loss", None)):
            reduction = getattr(loss, "reduction", "sum_over_batch_size")
            if isinstance(loss, keras.losses.Loss) and reduction not in _MEAN_REDUCTIONS:
                raise ValueError(
                    "Under micro-batches the minibatch's loss is the row-weighted mean of its "
                    "micro-batches' losses, which holds for a mean reduction only. Received: "
                    f"loss {loss.name!r} with reduction={reduction!r}, micro_batches={m}; use "
                    "reduction='sum_over_batch_size' (Keras' default), or micro_batches=1.")


def build_runtime(options, stages, weights, update_metrics: Callable, plan, **kwargs
                  ) -> SyncPipelineRuntime:
    """The executor of one virtual worker under `options` (`ScheduleOptions`)."""
    return SyncPipelineRuntime(stages, weights, options.schedule, options.micro_batches,
                               update_metrics, rematerialize=options.rematerialize,
                               plan=plan, **kwargs)


def runtime_factory(options, update_metrics: Callable):
    """For `build_virtual_workers`: None (HetPipe's PipelineRuntime), or a maker of one
    VW's synchronous executor."""
    if not options.synchronous:
        return None
    return lambda stages, weights, plan, **kw: build_runtime(options, stages, weights,
                                                             update_metrics, plan, **kw)


def sync_memory(options):
    """The planner's memory model of a synchronous schedule (`ScheduleOptions`; None:
    HetPipe's)."""
    if not options.synchronous:
        return None
    from hetpipe_tf.partitioner.cost import SyncMemory
    return SyncMemory(options.micro_batches, schedule=options.schedule,
                      rematerialize=options.rematerialize)
