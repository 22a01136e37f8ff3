"""The HetPipe partitioning problem (Section 7): the planner's entry points.

For a virtual worker of k devices, split the layer graph's L nodes into k contiguous stages
and place them on the devices in some order, minimising the slowest stage's time (compute +
receiving activations + receiving gradients) while every stage fits its device's memory.

Two exact methods (`SolverOptions.method`): the default solves it with `dp` (bisection on
the slowest stage's time, each step a DP over cuts and device-class counts, which chooses
the order too; see dp.py), when its tables are small enough (`dp_max_work`: few device
classes, as clusters of 2-4 GPU types have); otherwise, or with Method.MILP, the MILP with
scipy.optimize.milp (HiGHS): one per distinct device order (formulation.py, bounded by
bounds.py), or one that also chooses the order when the orders are too many
(assignment.py); search.py drives them. The overflow diagnosis of an infeasible instance
always uses the MILP (diagnose.py).
"""

from __future__ import annotations

import time
from typing import Any, Sequence

from hetpipe_tf.core.sync_schedule import Schedule
from hetpipe_tf.partitioner.comm import CommModel
from hetpipe_tf.partitioner.cost import CostModel, PredictionMemory, SyncMemory
from hetpipe_tf.partitioner.diagnose import infeasible_error
from hetpipe_tf.partitioner.orders import count_distinct_orders, distinct_orders
from hetpipe_tf.partitioner.plan import PartitionError, Plan, StagePlan
from hetpipe_tf.partitioner.search import Best, check_inputs, fits, max_minibatches, search
from hetpipe_tf.partitioner.solver_options import (
    Method,
    SolverError,
    SolverOptions,
    TimeLimitReached,
)

__all__ = [
    "Method", "SolverError", "SolverOptions", "TimeLimitReached", "count_distinct_orders",
    "distinct_orders", "fits", "max_minibatches", "min_micro_batches", "plan_virtual_workers",
    "solve",
]


def _to_plan(cm: CostModel, profile: Any, best: Best, n_m: int, slots: int, solver: str,
             n_orders: int, seconds: float) -> Plan:
    costs = cm.evaluate(best.cuts, best.order)
    # every path re-checks; this guards the guarantee
    if not cm.cuts_allowed(best.cuts) or not all(c.fits for c in costs):
        raise AssertionError(f"internal error: the planner chose a layout that does not fit "
                             f"memory (cuts={best.cuts}); please report it")
    bounds = [-1, *best.cuts, cm.num_layers - 1]
    names = [l.name for l in profile.layers]
    stages = tuple(
        StagePlan(index=j, device=d.name, device_type=d.type_name, tf_device=d.tf_device,
                  first=bounds[j] + 1, last=bounds[j + 1],
                  layer_names=tuple(names[bounds[j] + 1:bounds[j + 1] + 1]),
                  compute_s=c.compute_s, update_s=c.update_s, recv_forward_s=c.recv_forward_s,
                  recv_backward_s=c.recv_backward_s, memory_bytes=c.memory_bytes,
                  memory_available=c.memory_available, minibatches_held=c.held,
                  emulated_speed_factor=d.emulated_speed_factor)
        for j, (d, c) in enumerate(zip(best.order, costs)))
    return Plan(model_name=profile.model_name, batch_size=profile.batch_size, n_m=n_m,
                optimizer_slots=slots, stages=stages, num_layers=cm.num_layers, solver=solver,
                orders_considered=n_orders, solve_seconds=seconds)


def solve(profile: Any, devices: Sequence[Any], n_m: int, *, cluster: Any,
          comm: CommModel | None = None, optimizer_slots: int = 0,
          options: SolverOptions = SolverOptions(), sync: SyncMemory | None = None,
          prediction: PredictionMemory | None = None) -> Plan:
    """Partition `profile`'s layers over `devices` (one virtual worker) with N_m in flight
    (`sync`: a synchronous schedule's memory instead, with n_m = 1; `prediction`: the
    staleness compensation's buffers; cost.py).

    Returns the Plan minimising the slowest stage; raises PartitionError when no partition
    fits, naming the devices short of memory and what would fit.
    """
    check_inputs(profile, devices, n_m)
    start = time.perf_counter()
    cm = CostModel(profile, devices, cluster, n_m=n_m, optimizer_slots=optimizer_slots,
                   comm=comm, usable_fraction=options.usable_fraction, sync=sync,
                   prediction=prediction)
    best, n_orders, solver = search(cm, devices, options)
    if best is None and "time limit" in solver:
        raise PartitionError(
            "The MILP found no layout within its time budget (none may exist, or the search "
            f"needed longer). Received: time_limit_s={options.time_limit_s}; raise it, or "
            "pass None to search until optimal.")
    if best is None:
        raise infeasible_error(profile, devices, n_m, cluster=cluster, comm=comm,
                               optimizer_slots=optimizer_slots, options=options, sync=sync,
                               prediction=prediction)
    return _to_plan(cm, profile, best, n_m, optimizer_slots, solver, n_orders,
                    time.perf_counter() - start)


def plan_virtual_workers(profile: Any, virtual_workers: Sequence[Sequence[Any]], *,
                         cluster: Any, comm: CommModel | None = None, optimizer_slots: int = 0,
                         n_m: int | None = None, limit: int = 32,
                         options: SolverOptions = SolverOptions(),
                         prediction: PredictionMemory | None = None) -> tuple[Plan, ...]:
    """Plans for several virtual workers sharing one N_m = min over VWs of Max_m (Section 4).

    With `n_m` given it is used as is (and must fit every virtual worker).
    """
    if not virtual_workers:
        raise PartitionError("At least one virtual worker is needed. Received: "
                             "virtual_workers=[].")
    if n_m is None:
        maxes = [max_minibatches(profile, vw, cluster=cluster, optimizer_slots=optimizer_slots,
                                 limit=limit, options=options, prediction=prediction)
                 for vw in virtual_workers]
        n_m = min(maxes)
        if n_m == 0:
            worst = maxes.index(0)
            # Re-solve the worst VW at N_m = 1 for a precise error message.
            solve(profile, virtual_workers[worst], 1, cluster=cluster, comm=comm,
                  optimizer_slots=optimizer_slots, options=options)
    return tuple(solve(profile, vw, n_m, cluster=cluster, comm=comm,
                       optimizer_slots=optimizer_slots, options=options, prediction=prediction)
                 for vw in virtual_workers)


def min_micro_batches(profile: Any, devices: Sequence[Any], *, cluster: Any,
                      schedule: Schedule = Schedule.GPIPE, rematerialize: bool = False,
                      optimizer_slots: int = 0,
                      options: SolverOptions = SolverOptions()) -> int | None:
    """The fewest micro-batches M (a divisor of the profile's batch size) for which a
    synchronous schedule fits the devices' memory: a micro-batch's activations shrink
    with M (cost.py). None when not even M = batch size fits."""
    batch = int(profile.batch_size)
    for m in (d for d in range(1, batch + 1) if batch % d == 0):
        sync = SyncMemory(m, schedule=schedule, rematerialize=rematerialize)
        if fits(profile, devices, 1, cluster=cluster, optimizer_slots=optimizer_slots,
                options=options, sync=sync):
            return m
