"""The search over device orders and cuts: the DP, the MILP per distinct order (the best
objective so far bounds the next, heuristic partitions rank the orders), or the
assignment MILP when the orders are too many; and the feasibility questions built on it
(`fits`, `max_minibatches`). The planner's entry points are in milp.py.
"""

from __future__ import annotations

import dataclasses
import itertools
import time
from typing import Any, Sequence

import numpy as np

from hetpipe_tf._args import check_int
from hetpipe_tf.partitioner import assignment, bounds, dp
from hetpipe_tf.partitioner.cost import CostModel, PredictionMemory, SyncMemory
from hetpipe_tf.partitioner.formulation import solve_order
from hetpipe_tf.partitioner.orders import count_distinct_orders, distinct_orders
from hetpipe_tf.partitioner.plan import PartitionError
from hetpipe_tf.partitioner.solver_options import SolverError, SolverOptions, TimeLimitReached


@dataclasses.dataclass(frozen=True)
class Best:
    """The best layout found: its objective value, cuts and device order."""

    value: float
    cuts: tuple[int, ...]
    order: tuple[Any, ...]


def check_inputs(profile: Any, devices: Sequence[Any], n_m: int) -> None:
    """Refuse a planning question with no answer before any search (PartitionError)."""
    check_int("n_m", n_m, minimum=1, error=PartitionError,
              hint="n_m is the number of minibatches in flight")
    if not devices:
        raise PartitionError("A virtual worker needs at least one device. Received: devices=[].")
    names = [d.name for d in devices]
    dupes = sorted({n for n in names if names.count(n) > 1})
    if dupes:
        raise PartitionError(f"Each device may appear once in a virtual worker. Received "
                             f"duplicate device names: {dupes}.")
    if len(profile.layers) == 0:
        raise PartitionError("The model has no layers to partition. Received: a profile with "
                             "0 layers; build the model (call it on an input) before planning.")
    if len(profile.layers) < len(devices):
        raise PartitionError(
            f"Every device needs at least one layer, but the model has fewer layers than the "
            f"virtual worker has devices. Received: {len(profile.layers)} layers, "
            f"{len(devices)} devices; use fewer devices per virtual worker.")
    allowed = len(profile.layers) - 1 - len(getattr(profile, "forbidden_cuts", ()))
    if len(devices) - 1 > allowed:
        raise PartitionError(
            f"The model cannot be cut into that many stages: the calls of a shared layer "
            f"(tied weights) stay in one stage, which leaves {allowed} allowed cuts. Received: "
            f"{len(devices)} devices; use at most {allowed + 1} devices per virtual worker, or "
            "untie the weights (docs/partitioner.md, Shared layers).")


def _search_dp(cm: CostModel, devices: Sequence[Any], opts: SolverOptions, objective: str
               ) -> tuple[Best | None, str]:
    """The DP's layout over every order (dp.py), and what `Plan.solver` says of it."""
    deadline = (time.perf_counter() + opts.time_limit_s if opts.time_limit_s is not None
                else None)
    found = dp.solve(cm, devices, feasibility_only=objective == "feasible", deadline=deadline)
    if found is None:
        return None, "dp (no layout fits memory)"
    if objective == "feasible":
        solver = "dp (feasibility)"
    elif found.proven:
        solver = f"dp (bisection on the bottleneck, {found.checks} DP checks): optimal"
    else:
        solver = (f"dp (time limit reached, best layout found; the optimum is >= "
                  f"{found.lower:.9g} s)")
    value = 0.0 if objective == "feasible" else found.value
    return Best(value, found.cuts, found.order), solver


def search(cm: CostModel, devices: Sequence[Any], opts: SolverOptions,
            objective: str = "time") -> tuple[Best | None, int, str]:
    """Best (cuts, order) over all distinct orders; also how many orders and which solver."""
    k = len(devices)
    if k == 1:
        cost = cm.evaluate([], devices)[0]
        value = {"time": cost.time_s, "feasible": 0.0,
                 "overflow": (cost.memory_bytes - cost.memory_available) / 2**30}[objective]
        if objective != "overflow" and not cost.fits:
            return None, 1, "single stage"
        return Best(value, (), tuple(devices)), 1, "single stage"
    n_orders = count_distinct_orders(devices)
    if objective in ("time", "feasible") and opts.uses_dp(devices, cm.num_layers):
        best, solver = _search_dp(cm, devices, opts, objective)
        return best, n_orders, solver
    many = n_orders > opts.max_enumerated_orders
    if many and objective in ("time", "feasible"):
        # Feasibility too: the assignment MILP's optimum exists iff some layout fits.
        solver = "milp (order chosen by assignment variables)"
        try:
            found = assignment.solve_assignment(cm, devices, opts)
        except TimeLimitReached:
            # No MILP layout in time: the greedy layout that bounded the search stands.
            found = assignment.heuristic_layout(cm, devices)
            solver += " (time limit reached, greedy layout)"
        except SolverError:
            # Not an infeasibility: a fitting greedy layout stands, marked; else re-raise.
            found = assignment.heuristic_layout(cm, devices)
            if found is None:
                raise
            solver += " (solver error, greedy layout)"
        if found is None:
            return None, n_orders, solver
        value, cuts, order = found[:3]
        if len(found) > 3 and not found[3]:   # HiGHS stopped at an incumbent, unproven
            solver += " (time limit reached, best layout found)"
        return Best(value, tuple(cuts), tuple(order)), n_orders, solver
    best: Best | None = None
    # The overflow diagnosis looks at no more orders than the solver would enumerate.
    orders = list(itertools.islice(distinct_orders(devices), max(opts.max_enumerated_orders, 1)))
    if objective == "time":
        # Heuristic partitions bound T from the start; the most promising orders go first.
        guesses = [bounds.heuristic_partition(cm, o) for o in orders]
        for o, g in zip(orders, guesses):
            if g is not None and (best is None or g[0] < best.value):
                best = Best(g[0], tuple(g[1]), o)
        rank = [g[0] if g is not None else np.inf for g in guesses]
        orders = [orders[i] for i in np.argsort(rank, kind="stable")]
    deadline = (time.perf_counter() + opts.time_limit_s if opts.time_limit_s is not None
                else None)
    solver = "milp per order"
    errors: list[SolverError] = []
    for order in orders:
        if deadline is not None:
            remaining = deadline - time.perf_counter()
            if remaining <= 0:   # out of budget: the best layout so far stands
                solver += " (time limit reached, best layout found)"
                break
            opts = dataclasses.replace(opts, time_limit_s=remaining)
        # Only a strictly better layout is worth finding; the incumbent stands otherwise.
        upper = best.value * (1 - 1e-9) if (best and objective == "time") else np.inf
        try:
            found = solve_order(cm, order, upper, opts, objective)
        except TimeLimitReached:
            solver += " (time limit reached, best layout found)"
            break
        except SolverError as e:
            # This order is unknown, not infeasible: remember it, say so, and go on.
            errors.append(e)
            continue
        if found is None:
            continue
        value, cuts, optimal = found
        if objective == "feasible":
            return Best(value, tuple(cuts), order), n_orders, solver
        if best is None or value < best.value:
            best = Best(value, tuple(cuts), order)
        if not optimal:     # HiGHS stopped at an incumbent: out of budget, unproven
            solver += " (time limit reached, best layout found)"
            break
    if errors:
        if best is None:   # no layout, but the failed orders might have had one
            raise SolverError(
                f"The MILP solver failed on {len(errors)} of {len(orders)} device order(s) "
                "and no other order gave a layout, so whether one fits is unknown (this is "
                f"not an infeasibility). Received: {errors[0]}")
        solver += (f" (solver error on {len(errors)} order(s) after retries: the best layout "
                   "of the other orders, maybe not optimal)")
    return best, n_orders, solver


def fits(profile: Any, devices: Sequence[Any], n_m: int, *, cluster: Any,
         optimizer_slots: int = 0, options: SolverOptions = SolverOptions(),
         sync: SyncMemory | None = None, prediction: PredictionMemory | None = None) -> bool:
    """Whether some partition of the model over `devices` fits memory with N_m in flight
    (or under the synchronous schedule `sync`, n_m = 1)."""
    check_inputs(profile, devices, n_m)
    cm = CostModel(profile, devices, cluster, n_m=n_m, optimizer_slots=optimizer_slots,
                   usable_fraction=options.usable_fraction, sync=sync, prediction=prediction)
    return search(cm, devices, options, objective="feasible")[0] is not None


def max_minibatches(profile: Any, devices: Sequence[Any], *, cluster: Any,
                    optimizer_slots: int = 0, limit: int = 32,
                    options: SolverOptions = SolverOptions(),
                    prediction: PredictionMemory | None = None) -> int:
    """Max_m: the largest N_m <= `limit` for which the virtual worker's memory suffices.

    Memory grows with N_m, so feasibility is monotone and a binary search finds the edge.
    Returns 0 when not even one minibatch fits.
    """
    check_int("limit", limit, minimum=1)
    lo, hi = 0, limit
    while lo < hi:
        mid = (lo + hi + 1) // 2
        if fits(profile, devices, mid, cluster=cluster, optimizer_slots=optimizer_slots,
                options=options, prediction=prediction):
            lo = mid
        else:
            hi = mid - 1
    return lo
