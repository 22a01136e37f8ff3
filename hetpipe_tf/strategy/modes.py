"""One class per training mode: the executor that trains a model.

Each mode is a subclass of `TrainingMode`, as Keras' `distribution_lib` has one class per
distribution; `mode_for` picks the one that applies to the strategy's options and the
model's layout, once per build:

- `VirtualClock`: several VWs under WSP in a cluster model's order and virtual time
  (`VirtualCoordinator`, no threads; docs/virtual_clock.md);
- `HetSeq`: every device the whole model, a share of each batch (`HetSeqExecutor`);
- `VirtualWorkers`: several VWs under WSP through the parameter servers (`Coordinator`, or
  `SplitCoordinator` when every batch is split), each VW on the schedule's runtime;
- `SynchronousPipeline`: one VW under GPipe or 1F1B (`SyncPipelineRuntime`);
- `OneVirtualWorker`: one VW under HetPipe's schedule: `InGraphRuntime` (one stage at
  N_m = 1), a `GuardedPipelineRuntime` (stages on remote tasks), else `PipelineRuntime`.
"""

from __future__ import annotations

import abc
import dataclasses
import logging
from typing import Any, Callable

import tensorflow as tf

from hetpipe_tf.pipeline.in_graph import InGraphRuntime, runs_in_graph
from hetpipe_tf.pipeline.program import Program
from hetpipe_tf.pipeline.runtime import PipelineRuntime
from hetpipe_tf.pipeline.stage import Stage
from hetpipe_tf.pipeline.weights import StageWeights, WeightVersions
from hetpipe_tf.strategy import schedules, training_state
from hetpipe_tf.strategy.hetseq import build_hetseq, split_shares, whole_batch_note
from hetpipe_tf.strategy.layout import Layout
from hetpipe_tf.strategy.remote_guard import GuardedPipelineRuntime, guard_for
from hetpipe_tf.strategy.validation import check_jit_compile

# What a build chose (the VWs' plans, the batch dispatch) is logged under one name.
logger = logging.getLogger("hetpipe_tf.strategy.build")


@dataclasses.dataclass(frozen=True)
class Job:
    """What building one model's executor takes, besides the strategy's options."""

    model: Any
    program: Program
    batch_size: int
    layout: Layout
    update_metrics: Callable
    strategy: Any
    place_locally: Callable[[], Any]   # variables keep the caller's device scope inside
    adjust: Any = None                 # compensation's optimizer adjustment (None: none)
    predictor: Callable[[str], Any] = lambda device: None   # compensation's, per device
    vw_metrics: Any = None   # the metric state per VW (strategy/vw_metrics.py), or None


class TrainingMode(abc.ABC):
    """A way of training a model; `build` returns its executor (pipeline/executor.py)."""

    def __init__(self, options):
        self.options = options   # the strategy's StrategyOptions

    @staticmethod
    @abc.abstractmethod
    def applies(options, layout: Layout) -> bool:
        """Whether this mode trains a model with these options and layout."""

    @abc.abstractmethod
    def build(self, job: Job):
        """The executor that trains `job.model`."""


class HetSeq(TrainingMode):
    """data_parallel="hetseq" with D = 0: one synchronous step per batch (docs/hetseq.md)."""

    @staticmethod
    def applies(options, layout: Layout) -> bool:
        return options.hetseq

    def build(self, job: Job):
        check_jit_compile(job.model, hetseq=True)
        return build_hetseq(self.options, job.model, job.program, job.batch_size,
                            job.update_metrics, job.strategy)


class VirtualWorkers(TrainingMode):
    """Several VWs under WSP (hetpipe_tf/strategy/virtual_workers.py)."""

    @staticmethod
    def applies(options, layout: Layout) -> bool:
        return len(layout.plans) > 1

    def build(self, job: Job):
        from hetpipe_tf.strategy.virtual_workers import build_virtual_workers

        o, plans = self.options, job.layout.plans
        split = split_shares(o, plans, job.batch_size) if o.splits_batches else None
        note = None if split is not None else whole_batch_note(plans, job.batch_size)
        if note:   # which dispatch was chosen, and what the other predicts (docs/hetseq.md)
            logger.info(note)
        return build_virtual_workers(
            job.model, job.program, plans, job.layout.n_m, job.layout.clock_distance,
            job.update_metrics, split=split, cluster=o.layout.cluster_or_none(),
            placement=o.wsp.placement, ps_hosts=o.wsp.ps_hosts,
            place_locally=job.place_locally,
            make_runtime=schedules.runtime_factory(o.schedule, job.update_metrics),
            fresh_pulls=o.wsp.fresh_pulls, strategy=job.strategy, adjust=job.adjust,
            predictor=job.predictor, faults=o.faults, vw_metrics=job.vw_metrics)


class VirtualClock(TrainingMode):
    """Several VWs under WSP in a cluster model's order and virtual time
    (hetpipe_tf/strategy/virtual_clock.py, docs/virtual_clock.md)."""

    @staticmethod
    def applies(options, layout: Layout) -> bool:
        return options.clock.virtual

    def build(self, job: Job):
        from hetpipe_tf.strategy.virtual_clock import build_virtual_clock

        return build_virtual_clock(self.options, job)


class OneVirtualWorker(TrainingMode):
    """One pipelined VW under HetPipe's schedule, N_m minibatches in flight."""

    @staticmethod
    def applies(options, layout: Layout) -> bool:
        return len(layout.plans) == 1

    def build(self, job: Job):
        model, plan, n_m = job.model, job.layout.plans[0], job.layout.n_m
        stages = Stage.for_plan(plan, job.program, model)
        states = training_state.OptimizerStates(model, job.strategy, 1, adjust=job.adjust)
        with tf.init_scope():
            own = [s.trainable for s in stages]
            optimizers = states.for_virtual_worker(own, own)
        weights = WeightVersions([
            StageWeights(s.device, s.trainable, s.versioned_nt, o, n_m,
                         counter=model.optimizer.iterations if s.index == 0 else None,
                         emulated_speed_factor=s.emulated_speed_factor,
                         predictor=job.predictor(s.device))
            for s, o in zip(stages, optimizers)])
        return self.runtime(job, stages, weights, states)

    def runtime(self, job: Job, stages, weights, states):
        plan, n_m = job.layout.plans[0], job.layout.n_m
        hooks = dict(plan=plan, on_run_start=states.seed, on_run_end=states.merge)
        # Stages on remote tasks: a lost task ends the calls within fault_timeout_s
        # (strategy/remote_guard.py); the in-graph runtime cannot be guarded.
        guard = guard_for(self.options.faults, job.layout.plans,
                          self.options.layout.cluster_or_none())
        if guard is not None:
            return GuardedPipelineRuntime(stages, weights, n_m, job.update_metrics,
                                          guard=guard, **hooks)
        if self.options.pipeline.in_graph and runs_in_graph(stages, n_m):
            return InGraphRuntime(stages[0], weights, job.update_metrics,
                                  job.model.optimizer.iterations, **hooks)
        return PipelineRuntime(stages, weights, n_m, job.update_metrics, **hooks)


class SynchronousPipeline(OneVirtualWorker):
    """One VW under GPipe or 1F1B: one update per minibatch (docs/schedules.md)."""

    @staticmethod
    def applies(options, layout: Layout) -> bool:
        return options.schedule.synchronous and len(layout.plans) == 1

    def runtime(self, job: Job, stages, weights, states):
        return schedules.build_runtime(self.options.schedule, stages, weights,
                                       job.update_metrics, job.layout.plans[0],
                                       on_run_start=states.seed, on_run_end=states.merge)


# In the order tried: the first that applies trains the model.
MODES: tuple[type[TrainingMode], ...] = (VirtualClock, HetSeq, VirtualWorkers,
                                         SynchronousPipeline, OneVirtualWorker)


def mode_for(options, layout: Layout) -> TrainingMode:
    """The training mode of a model with `layout` under `options` (`StrategyOptions`)."""
    for mode in MODES:
        if mode.applies(options, layout):
            return mode(options)
    raise ValueError(f"No training mode for this layout. Received: {len(layout.plans)} "
                     "plans; pass at least one plan, or a cluster to plan over.")
