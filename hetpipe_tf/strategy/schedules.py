"""The strategy's side of synchronous schedules (GPipe, 1F1B; docs/schedules.md): the
arguments `schedule=`, `micro_batches=`, `rematerialize=` checked when the strategy is
made, the model and batch checked when training starts, and the executor built.

With a synchronous schedule each minibatch is one update on every stage (N_m = 1: an
`n_m` given with it is refused); `SyncPipelineRuntime` runs one virtual worker, and with
several the `Coordinator` drives one per VW through the parameter servers unchanged (a
wave is one minibatch).
"""

from __future__ import annotations

import functools
from typing import Any, Callable

import keras

from hetpipe_tf.core.sync_schedule import Schedule
from hetpipe_tf.pipeline.sync_runtime import SyncPipelineRuntime

# Loss reductions whose minibatch value is the row-weighted mean of its micro-batches'
# values (so scaling each micro-batch's loss by its rows / the minibatch's rows is exact).
_MEAN_REDUCTIONS = ("sum_over_batch_size", "mean")


def arguments_checked_first(init):
    """Decorates HetPipeStrategy.__init__: the schedule's arguments are checked before any
    other (so `n_m` with a synchronous schedule is refused as such, not by N_m's checks)."""
    @functools.wraps(init)
    def checked(self, *args, **kwargs):
        check_arguments(kwargs.get("schedule", Schedule.HETPIPE), kwargs.get("micro_batches"),
                        kwargs.get("rematerialize", False), kwargs.get("n_m"),
                        kwargs.get("data_parallel"))
        return init(self, *args, **kwargs)
    return checked


def configure(extended, schedule: Any, micro_batches: Any, rematerialize: Any,
              n_m: Any) -> None:
    """Check the arguments and keep them on `extended` (N_m = 1 when synchronous)."""
    schedule = check_arguments(schedule, micro_batches, rematerialize, n_m)
    if schedule.synchronous:
        extended.n_m = 1
    extended.schedule = schedule
    extended.micro_batches = micro_batches
    extended.rematerialize = rematerialize


def check_arguments(schedule: Any, micro_batches: Any, rematerialize: Any,
                    n_m: Any, data_parallel: Any = None) -> Schedule:
    """Refuse bad schedule arguments before anything is built; returns the Schedule."""
    schedule = Schedule.parse(schedule)
    hetseq = str(getattr(data_parallel, "value", data_parallel)).lower() == "hetseq"
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
        if (isinstance(micro_batches, bool) or not isinstance(micro_batches, int)
                or micro_batches < 1):
            raise ValueError(
                f"A synchronous schedule needs micro_batches=M, an int >= 1. Received: "
                f"schedule={schedule}, micro_batches={micro_batches!r}; pass a divisor of "
                "the batch size (GPipe's bubble (K-1)/(M+K-1) is small for M >= 4 x stages).")
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


def check_training(extended, model, batch_size: int) -> None:
    """Refuse, before the first step, what a synchronous schedule cannot run exactly."""
    m = extended.micro_batches
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


def build_runtime(extended, stages, weights, update_metrics: Callable, plan, **kwargs
                  ) -> SyncPipelineRuntime:
    """The executor of one virtual worker under `extended.schedule`."""
    return SyncPipelineRuntime(stages, weights, extended.schedule, extended.micro_batches,
                               update_metrics, rematerialize=extended.rematerialize,
                               plan=plan, **kwargs)


def synchronous(extended) -> bool:
    """Whether `extended` trains with a synchronous schedule."""
    return getattr(extended, "schedule", Schedule.HETPIPE).synchronous


def runtime_factory(extended, update_metrics: Callable):
    """For `build_virtual_workers`: None (HetPipe's PipelineRuntime), or a maker of one
    VW's synchronous executor."""
    if not synchronous(extended):
        return None
    return lambda stages, weights, plan, **kw: build_runtime(extended, stages, weights,
                                                             update_metrics, plan, **kw)


def sync_memory(extended):
    """The planner's memory model of `extended`'s synchronous schedule (None: HetPipe's)."""
    if not synchronous(extended):
        return None
    from hetpipe_tf.partitioner.cost import SyncMemory
    return SyncMemory(extended.micro_batches, schedule=extended.schedule,
                      rematerialize=extended.rematerialize)
