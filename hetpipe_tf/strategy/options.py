"""The strategy's options: every `HetPipeStrategy(...)` argument, parsed, checked and resolved
once into one frozen value.

`StrategyOptions` is made of small frozen parts, one per concern: the layout (the cluster
argument, plans given or a planning callable, the allocation policy), the pipeline (N_m,
Max_m, in-graph), WSP (clock distance, placement, PS hosts, fresh pulls), the schedule
(HetPipe, GPipe, 1F1B; micro-batches; re-materialization), staleness compensation (the
value and whether it is the default), the data-parallel mode (and hand-given shares),
fault handling (`FaultOptions`) and the clock (this machine's, or a cluster model's virtual
one). Every default is resolved here: the compensation (BOTH, or
NONE in HetSeq mode) and N_m (1 for a synchronous schedule and for HetSeq; the plan's when
plans are given). The options record whether the user gave the clock distance D and the
allocation (`WSPOptions.distance_given`, `LayoutOptions.allocation_given`): under a cluster
model (`clock=VirtualClock(...)`) the planner picks what was not given (strategy/planning.py).
What only the first fit can know (plans the planner makes, the N_m, D and allocation it
picks for them) is a model's `Layout` (strategy/layout.py), never written back here.
"""

from __future__ import annotations

import dataclasses
import os
from typing import Any, Callable

from hetpipe_tf._args import check_int
from hetpipe_tf.cluster.allocation import AllocationPolicy
from hetpipe_tf.core.sync_schedule import Schedule
from hetpipe_tf.partitioner.plan import Plan
from hetpipe_tf.ps.faults import FaultOptions
from hetpipe_tf.ps.placement import PlacementPolicy
from hetpipe_tf.strategy import schedules
from hetpipe_tf.strategy.compensation import Compensation
from hetpipe_tf.strategy.data_parallel import DataParallel
from hetpipe_tf.strategy.hetseq import check_arguments as check_hetseq_arguments
from hetpipe_tf.strategy.validation import check_n_m, check_plans


@dataclasses.dataclass(frozen=True)
class LayoutOptions:
    """Where the model runs: the cluster argument as given (a Cluster, dict, ClusterSpec,
    resolver, or None for TF_CONFIG), the plans given (one per VW) or a callable that makes
    them at the first fit, and the allocation policy that forms VWs for the planner (None:
    not given)."""

    cluster: Any = dataclasses.field(default=None, compare=False)
    plans: tuple = ()
    plan_fn: Callable | None = None
    allocation: AllocationPolicy | None = None
    num_virtual_workers: int | None = None

    @property
    def plan(self) -> Plan | None:
        """The one plan given (its variables are created on their stage devices)."""
        return self.plans[0] if len(self.plans) == 1 else None

    @property
    def planned_at_fit(self) -> bool:
        return not self.plans

    @property
    def allocation_given(self) -> bool:
        return self.allocation is not None

    def cluster_or_none(self):
        """The hetpipe_tf Cluster of the argument or TF_CONFIG; None when neither is set."""
        if self.cluster is None and not os.environ.get("TF_CONFIG"):
            return None
        from hetpipe_tf.strategy.planning import resolve_cluster
        return resolve_cluster(self.cluster)


@dataclasses.dataclass(frozen=True)
class PipelineOptions:
    """One VW's pipeline: N_m (None: chosen when the planner plans, at the first fit), the
    memory bound Max_m, and whether one stage at N_m = 1 runs inside Keras' step."""

    n_m: int | None = None
    max_m: int | None = None
    in_graph: bool = True


@dataclasses.dataclass(frozen=True)
class WSPOptions:
    """Several VWs under Wave Synchronous Parallel (paper Section 5, docs/wsp.md). D as given,
    or 0 when not given (`distance_given` False: under a cluster model the planner picks each
    model's D, which its `Layout` holds)."""

    clock_distance: int = 0
    placement: PlacementPolicy = PlacementPolicy.DEFAULT
    ps_hosts: tuple[str, ...] | None = None
    fresh_pulls: bool = True
    distance_given: bool = False


@dataclasses.dataclass(frozen=True)
class ScheduleOptions:
    """The pipeline schedule (docs/schedules.md); micro-batches and re-materialization belong
    to the synchronous ones."""

    schedule: Schedule = Schedule.HETPIPE
    micro_batches: int | None = None
    rematerialize: bool = False

    @property
    def synchronous(self) -> bool:
        return self.schedule.synchronous


@dataclasses.dataclass(frozen=True)
class CompensationOptions:
    """Staleness compensation (docs/convergence.md) and whether the user left it default
    (a log line then names it where it changes training)."""

    value: Any = Compensation.BOTH   # parse's default for the WSP mode
    by_default: bool = True


@dataclasses.dataclass(frozen=True)
class DataParallelOptions:
    """How data parallelism treats unequal devices, and the shares given by hand."""

    mode: DataParallel = DataParallel.WSP
    shares: tuple[int, ...] | None = None


@dataclasses.dataclass(frozen=True)
class ClockOptions:
    """Whose time training follows: None, this machine's (threads race as they will); or a
    cluster model (`hetpipe_tf.sim.VirtualClock`): every task, push and pull in its order,
    at its virtual time (docs/virtual_clock.md)."""

    model: Any = dataclasses.field(default=None, compare=False)

    @property
    def virtual(self) -> bool:
        return self.model is not None

    @classmethod
    def parse(cls, clock: Any, *, synchronous: bool, data_parallel: DataParallel,
              num_plans: int) -> "ClockOptions":
        if clock is None or clock == "real":
            return cls()
        if isinstance(clock, str) or not callable(getattr(clock, "schedule", None)):
            raise ValueError(
                "clock must be None (this machine's time) or a cluster model. Received: "
                f"clock={clock!r}; pass hetpipe_tf.sim.VirtualClock(cluster), e.g. "
                "VirtualClock(paper_cluster()).")
        what = None
        if synchronous:
            what = "a synchronous schedule (GPipe, 1F1B)"
        elif data_parallel is not DataParallel.WSP:
            what = f"data_parallel={data_parallel.value!r}"
        elif num_plans == 1:
            what = "one virtual worker"
        if what is not None:
            raise ValueError(
                "The virtual clock trains several virtual workers under WSP with HetPipe's "
                f"schedule (docs/virtual_clock.md). Received: {what} with clock={clock!r}; "
                "use schedule='hetpipe', data_parallel='wsp' and one plan per VW (at least "
                "two), or drop clock=.")
        return cls(clock)


@dataclasses.dataclass(frozen=True)
class StrategyOptions:
    """Every argument of `HetPipeStrategy`, checked and resolved (module docstring).
    `StrategyOptions.parse(...)` is the constructor that checks; the field defaults equal
    its resolved defaults for `HetPipeStrategy(cluster)` without plans."""

    layout: LayoutOptions = LayoutOptions()
    pipeline: PipelineOptions = PipelineOptions()
    wsp: WSPOptions = WSPOptions()
    schedule: ScheduleOptions = ScheduleOptions()
    compensation: CompensationOptions = CompensationOptions()
    data_parallel: DataParallelOptions = DataParallelOptions()
    faults: FaultOptions = FaultOptions()
    clock: ClockOptions = ClockOptions()

    @property
    def hetseq(self) -> bool:
        """HetSeq's own synchronous executor: data_parallel="hetseq" with D = 0."""
        return (self.data_parallel.mode is DataParallel.HETSEQ
                and self.wsp.clock_distance == 0)

    @property
    def splits_batches(self) -> bool:
        """Whether several VWs split every batch: data_parallel="wsp_split", or "hetseq"
        with clock_distance > 0 (one-device VWs under WSP)."""
        mode = self.data_parallel.mode
        return mode is DataParallel.WSP_SPLIT or (
            mode is DataParallel.HETSEQ and self.wsp.clock_distance > 0)

    @classmethod
    def parse(cls, cluster: Any = None, *, plan=None, n_m=None, schedule=Schedule.HETPIPE,
              micro_batches=None, rematerialize=False, max_m=None, clock_distance=None,
              placement="default", ps_hosts=None, allocation=None,
              num_virtual_workers=None, fresh_pulls=True, in_graph=True,
              compensation=None, data_parallel=DataParallel.WSP, shares=None,
              faults: FaultOptions = FaultOptions(), clock=None) -> "StrategyOptions":
        """Check every argument (errors name it and say how to fix it) and resolve every
        default; the arguments are HetPipeStrategy's. clock_distance=None: not given (D = 0,
        or picked by the planner under a cluster model)."""
        checked = schedules.check_arguments(schedule, micro_batches, rematerialize, n_m,
                                            data_parallel)
        layout = _layout(cluster, plan, allocation, num_virtual_workers, max_m)
        # Checked ints (NumPy integers accepted) are kept as Python ints.
        micro_batches = None if micro_batches is None else int(micro_batches)
        max_m = None if max_m is None else int(max_m)
        sched = ScheduleOptions(checked, micro_batches, rematerialize)
        # N_m: the one given, else the plans' (None: the planner's, at the first fit).
        resolved_n_m = n_m if n_m is not None or not layout.plans else layout.plans[0].n_m
        if resolved_n_m is not None:
            for p in layout.plans or (None,):
                check_n_m(resolved_n_m, max_m, p)
            resolved_n_m = int(resolved_n_m)
        given_distance = None if clock_distance is None else check_int(
            "clock_distance", clock_distance, minimum=0, hint="use 0 for BSP-like waves")
        clock_distance = given_distance or 0
        wsp = WSPOptions(clock_distance, PlacementPolicy.parse(placement),
                         None if ps_hosts is None else tuple(ps_hosts),
                         _check_bool("fresh_pulls", fresh_pulls),
                         distance_given=given_distance is not None)
        in_graph = _check_bool("in_graph", in_graph)
        chosen = None if compensation is None else Compensation.parse(compensation)
        if layout.allocation is not None and (layout.plans or layout.plan_fn is not None):
            raise ValueError(
                "allocation forms virtual workers for the planner; it cannot be combined "
                f"with a plan. Received: allocation={layout.allocation.name} and a plan; "
                "pass one plan per virtual worker, or no plan.")
        mode = DataParallel.parse(data_parallel)
        if chosen is None:
            # The default (docs/convergence.md "The defaults"): BOTH where staleness can
            # exist; HetSeq's synchronous steps have none to compensate.
            chosen = (Compensation.NONE if mode is DataParallel.HETSEQ
                      else CompensationOptions.value)
        hand_shares = check_hetseq_arguments(
            mode, shares, plans=layout.plans, plan_fn=layout.plan_fn,
            allocation=layout.allocation, clock_distance=clock_distance, n_m=n_m,
            has_cluster=layout.cluster_or_none() is not None, compensation=chosen)
        if sched.synchronous or mode is DataParallel.HETSEQ:
            resolved_n_m = 1   # one minibatch in flight (n_m given with either was refused)
        timed = ClockOptions.parse(clock, synchronous=sched.synchronous, data_parallel=mode,
                                   num_plans=len(layout.plans))
        return cls(layout=layout, pipeline=PipelineOptions(resolved_n_m, max_m, in_graph),
                   wsp=wsp, schedule=sched,
                   compensation=CompensationOptions(chosen, by_default=compensation is None),
                   data_parallel=DataParallelOptions(mode, hand_shares), faults=faults,
                   clock=timed)


def _layout(cluster, plan, allocation, num_virtual_workers, max_m) -> LayoutOptions:
    plan_fn = plan if callable(plan) else None
    plans = () if plan is None or callable(plan) else (
        (plan,) if isinstance(plan, Plan) else check_plans(plan))
    # Checked here, not first at the fit that plans: bad input fails before any work.
    for arg, value in (("max_m", max_m), ("num_virtual_workers", num_virtual_workers)):
        if value is not None:
            check_int(arg, value, minimum=1, hint="pass a positive int, or None for the "
                                                  "default")
    if not plans and plan_fn is None and cluster is None and not os.environ.get("TF_CONFIG"):
        raise ValueError(
            "HetPipeStrategy needs the virtual worker's devices. Received: cluster=None, "
            "plan=None and no TF_CONFIG; pass a cluster (hetpipe_tf.cluster) or a plan.")
    return LayoutOptions(cluster, plans, plan_fn,
                         None if allocation is None else AllocationPolicy.parse(allocation),
                         None if num_virtual_workers is None else int(num_virtual_workers))


def _check_bool(arg: str, value: Any) -> bool:
    if not isinstance(value, bool):
        raise ValueError(f"{arg} must be True or False. Received: {arg}={value!r}.")
    return value
