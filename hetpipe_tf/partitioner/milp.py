"""The HetPipe partitioning problem (Section 7): the planner's entry points and the MILP.

For a virtual worker of k devices, split the layer graph's L nodes into k contiguous stages
and place them on the devices in some order, minimising the slowest stage's time (compute +
receiving activations + receiving gradients) while every stage fits its device's memory.

Two exact methods (`SolverOptions.method`): the default solves it with `dp` (bisection on
the slowest stage's time, each step a DP over cuts and device-class counts, which chooses
the order too; see dp.py), when its tables are small enough (`dp_max_work`: few device
classes, as clusters of 2-4 GPU types have); otherwise, or with Method.MILP, the MILP below
with scipy.optimize.milp (HiGHS). The overflow diagnosis of an infeasible instance always
uses the MILP.

Formulation for one device order: binary b[j, c] = 1 when stage j's last node is c
(boundaries j = 0..k-2, cuts c = 0..L-2), one cut per boundary, cuts strictly increasing
(every stage non-empty), and a continuous T >= time of every stage. Prefix sums make stage
time and memory linear in b. Every distinct device order is solved (devices alike in type,
host, speed and memory are interchangeable); the best objective so far bounds T for the next
order, which prunes most of them quickly. When the distinct orders are too many to
enumerate, one MILP also chooses the order itself (assignment variables, see `assignment`).

Bound tightening before each MILP (standard MIP preprocessing, it never cuts off a solution
at least as good as the bound): a cheap heuristic partition gives an upper bound UB on T;
since every stage time is >= its compute time and its memory >= its layers' memory, T <= UB
and the device capacities confine each boundary's cut to a window (`cut_windows`), and cut
variables outside the windows are fixed to 0. Later orders need only beat the incumbent.
"""

from __future__ import annotations

import dataclasses
import enum
import itertools
import math
import time
from typing import Any, Iterator, Sequence

import numpy as np
from scipy.optimize import Bounds, LinearConstraint, milp
from scipy.sparse import coo_matrix

from hetpipe_tf.core.sync_schedule import Schedule
from hetpipe_tf.partitioner.comm import CommModel
from hetpipe_tf.partitioner import dp
from hetpipe_tf.partitioner.cost import CostModel, PredictionMemory, SyncMemory
from hetpipe_tf.partitioner.dp import device_classes
from hetpipe_tf.partitioner.plan import PartitionError, Plan, StagePlan


# scipy.optimize.milp statuses: 0 optimal, 1 iteration or time limit reached,
# 2 infeasible, 3 unbounded, 4 other (HiGHS "solve error", numerical trouble).
_HIGHS_LIMIT = 1
_HIGHS_INFEASIBLE = 2


class TimeLimitReached(Exception):
    """A MILP call ran out of its time budget before finding any layout."""


class SolverError(PartitionError):
    """HiGHS failed (status 3 or 4) under every retried setting: the search could not tell
    whether a layout fits, which is not the same as none fitting."""


class Method(enum.Enum):
    """Which exact method plans: DP when its tables are small enough (AUTO), or always one."""

    AUTO = "auto"
    DP = "dp"
    MILP = "milp"


@dataclasses.dataclass(frozen=True)
class SolverOptions:
    """Knobs of the solver; the defaults solve every order exactly."""

    method: Method = Method.AUTO
    # AUTO uses the DP while one DP check touches at most this many cells (class-count
    # vectors x classes^2 x layers, `dp.work_estimate`); 16 devices in 4 classes of 4 over
    # 1000 layers are 1e7 (~4 s here), 16 distinct classes would be 2.6e11 (MILP then).
    dp_max_work: int = 20_000_000
    max_enumerated_orders: int = 120   # MILP: more distinct orders -> assignment MILP
    time_limit_s: float | None = None  # budget of one search over all orders; None = optimal
    mip_rel_gap: float = 1e-6
    usable_fraction: float = 0.9       # share of device memory a stage may use
    # HiGHS' presolve returned wrong "optimal" layouts at the memory knife edge (checked
    # against an exhaustive search), so it is off by default; on it is 2-3x faster on large
    # models and layouts still fit (re-checked), but may not be optimal.
    presolve: bool = False

    def __post_init__(self) -> None:
        try:   # the value's name ("dp") is accepted too, e.g. from a flag
            object.__setattr__(self, "method", Method(self.method))
        except ValueError:
            raise ValueError(f"Unknown planning method. Received: method={self.method!r}; "
                             f"use one of {[m.value for m in Method]}.") from None
        if isinstance(self.dp_max_work, bool) or not isinstance(self.dp_max_work, int) \
                or self.dp_max_work < 0:
            raise ValueError(f"dp_max_work must be an int >= 0. Received: "
                             f"dp_max_work={self.dp_max_work!r}; e.g. 20_000_000.")

    def uses_dp(self, devices: Sequence[Any], num_layers: int) -> bool:
        if self.method is Method.AUTO:
            return dp.work_estimate(devices, num_layers) <= self.dp_max_work
        return self.method is Method.DP


def distinct_orders(devices: Sequence[Any]) -> Iterator[tuple[Any, ...]]:
    """Every order of `devices` up to swapping interchangeable ones, in a stable order."""
    groups = device_classes(devices)
    counts = [len(g) for g in groups]

    def rec(prefix: list[int]) -> Iterator[list[int]]:
        if len(prefix) == len(devices):
            yield prefix
            return
        for g, left in enumerate(counts):
            if left:
                counts[g] -= 1
                yield from rec(prefix + [g])
                counts[g] += 1

    for classes_in_order in rec([]):
        taken = [0] * len(groups)
        order = []
        for g in classes_in_order:
            order.append(groups[g][taken[g]])
            taken[g] += 1
        yield tuple(order)


def count_distinct_orders(devices: Sequence[Any]) -> int:
    """The multinomial len(devices)! / prod(class size!)."""
    n = math.factorial(len(devices))
    for group in device_classes(devices):
        n //= math.factorial(len(group))
    return n


class _Builder:
    """Rows of a sparse constraint matrix, collected as COO triplets."""

    def __init__(self, num_vars: int) -> None:
        self.num_vars = num_vars
        self.rows: list[np.ndarray] = []
        self.cols: list[np.ndarray] = []
        self.vals: list[np.ndarray] = []
        self.lb: list[float] = []
        self.ub: list[float] = []

    def add(self, cols: np.ndarray, vals: np.ndarray, lb: float, ub: float) -> None:
        r = len(self.lb)
        self.rows.append(np.full(len(cols), r))
        self.cols.append(np.asarray(cols))
        self.vals.append(np.asarray(vals, dtype=np.float64))
        self.lb.append(lb)
        self.ub.append(ub)

    def constraint(self) -> LinearConstraint:
        a = coo_matrix((np.concatenate(self.vals),
                        (np.concatenate(self.rows), np.concatenate(self.cols))),
                       shape=(len(self.lb), self.num_vars)).tocsr()
        return LinearConstraint(a, np.array(self.lb), np.array(self.ub))


def _cut_vars(j: int, num_cuts: int) -> np.ndarray:
    return np.arange(j * num_cuts, (j + 1) * num_cuts)


def _add_partition_rows(b: _Builder, k: int, num_cuts: int) -> None:
    """One cut per boundary; boundary j's cut strictly before boundary j+1's."""
    positions = np.arange(num_cuts, dtype=np.float64)
    for j in range(k - 1):
        b.add(_cut_vars(j, num_cuts), np.ones(num_cuts), 1, 1)
    for j in range(k - 2):
        b.add(np.concatenate([_cut_vars(j, num_cuts), _cut_vars(j + 1, num_cuts)]),
              np.concatenate([positions, -positions]), -np.inf, -1)


def _stage_terms(cm: CostModel, order: Sequence[Any], j: int, prefix: np.ndarray
                 ) -> tuple[np.ndarray, np.ndarray, float]:
    """(cols, vals, constant) of a prefix-sum quantity of stage j as a linear function of b.

    `prefix[i]` is the quantity over nodes 0..i-1; stage j spans (cut_{j-1}, cut_j].
    """
    k, L = len(order), cm.num_layers
    n = L - 1
    cols, vals, const = [], [], 0.0
    if j < k - 1:
        cols.append(_cut_vars(j, n))
        vals.append(prefix[1:L])          # end at cut c -> prefix[c + 1]
    else:
        const += prefix[L]
    if j > 0:
        cols.append(_cut_vars(j - 1, n))
        vals.append(-prefix[1:L])         # start after cut c -> minus prefix[c + 1]
    return (np.concatenate(cols) if cols else np.zeros(0, int),
            np.concatenate(vals) if vals else np.zeros(0), const)


def cut_windows(cm: CostModel, order: Sequence[Any] | None, upper: float = np.inf
                ) -> tuple[np.ndarray, np.ndarray] | None:
    """Inclusive [lo_j, hi_j] for boundary j's cut in any partition whose stages all fit
    their device's memory and, if `upper` is finite, have compute <= `upper`.

    Stage compute and memory (less the received activations) are prefix-sum differences of
    nonnegative terms, so a stage starting later can reach no further than its budget past
    the latest start, and one ending earlier must start no later than its budget before
    the earliest end. With `order` None the windows hold for every order of `cm.devices`
    (layers timed on their fastest device, the largest memory). None when nothing fits.
    """
    k, L = len(cm.devices), cm.num_layers
    if order is None:
        fastest = np.min([cm.layer_time(d) for d in cm.devices], axis=0)
        times = [np.concatenate([[0.0], np.cumsum(fastest)])] * k
        caps = [max(cm.capacity.values())] * k
    else:
        times = [cm.prefix_time(d) for d in order]
        caps = [cm.capacity[d.name] for d in order]
    # Per position: (prefix, budget) pairs that every stage must respect.
    limits = [[(cm.position_memory(j, k), float(caps[j]))]
              + ([(times[j], upper)] if np.isfinite(upper) else []) for j in range(k)]
    hi = np.empty(k - 1, dtype=int)
    start = 0                                    # latest possible first node of stage j
    for j in range(k - 1):
        reach = min(int(np.searchsorted(p, p[start] + b * (1 + 1e-9), side="right")) - 2
                    for p, b in limits[j])
        hi[j] = min(reach, L - 2 - (k - 2 - j))  # leave a node for every later stage
        start = hi[j] + 1
    lo = np.empty(k - 1, dtype=int)
    end = L - 1                                  # earliest possible last node of stage j+1
    for j in range(k - 2, -1, -1):
        first = max(int(np.searchsorted(p, p[end + 1] - b * (1 + 1e-9), side="left"))
                    for p, b in limits[j + 1])   # stage j+1 starts at c+1 >= first
        lo[j] = max(first - 1, j)
        end = lo[j]
    if np.any(lo > hi):
        return None
    return lo, hi


def heuristic_partition(cm: CostModel, order: Sequence[Any]) -> tuple[float, list[int]] | None:
    """A quick feasible partition for an upper bound: the smallest compute budget for which
    filling stages greedily (as far as both the budget and the device's memory allow) covers
    the model; returns its true cost, or None if the greedy layout does not fit."""
    k, L = len(order), cm.num_layers
    prefix = [cm.prefix_time(d) for d in order]
    held = [cm.input_factor(j, k) for j in range(k)]
    memory = [cm.position_memory(j, k) for j in range(k)]
    capacity = [cm.capacity[d.name] for d in order]

    def greedy(budget: float) -> list[int] | None:
        cuts, start = [], 0
        for j in range(k):
            received = held[j] * cm.cut_bytes[start - 1] if start > 0 else 0.0
            room = capacity[j] - received + memory[j][start]
            if j == k - 1:
                fits = memory[j][L] <= room and prefix[j][L] - prefix[j][start] <= budget
                return cuts if fits else None
            by_time = np.searchsorted(prefix[j], prefix[j][start] + budget, side="right") - 2
            by_memory = np.searchsorted(memory[j], room, side="right") - 2
            c = min(int(by_time), int(by_memory), L - 2 - (k - 2 - j))
            while c >= start and not cm.allowed[c]:   # the nearest allowed cut before it
                c -= 1
            if c < start:
                return None
            cuts.append(c)
            start = c + 1
        return cuts

    lo, hi = 0.0, max(float(p[-1]) for p in prefix)
    cuts = greedy(hi)
    if cuts is None:
        return None
    for _ in range(50):
        mid = (lo + hi) / 2
        found = greedy(mid)
        if found is None:
            lo = mid
        else:
            hi, cuts = mid, found
    costs = cm.evaluate(cuts, order)
    if not all(c.fits for c in costs):
        return None
    return max(c.time_s for c in costs), cuts


def _fix_outside_windows(upper: np.ndarray, windows: tuple[np.ndarray, np.ndarray],
                         num_cuts: int, allowed: np.ndarray | None = None) -> None:
    """Fix to 0 (upper bound 0) every cut variable outside its boundary's window, and at
    the cuts no plan may use (`allowed` False: between two calls of a shared layer)."""
    for j, (lo, hi) in enumerate(zip(*windows)):
        row = upper[j * num_cuts:(j + 1) * num_cuts]
        row[:lo] = 0
        row[hi + 1:] = 0
        if allowed is not None:
            row[~allowed[:num_cuts]] = 0


@dataclasses.dataclass(frozen=True)
class _Solution:
    x: np.ndarray
    optimal: bool    # False: the time limit stopped HiGHS at this incumbent (no proof)


def _run_milp(c: np.ndarray, rows: _Builder, integrality: np.ndarray, bounds: Bounds,
              opts: SolverOptions) -> _Solution | None:
    """scipy.optimize.milp with the options' gap and budget; None only when HiGHS proved the
    model infeasible, TimeLimitReached when the budget ran out before any solution, and
    SolverError when both presolve settings ended in a solver error."""
    constraint = rows.constraint()
    failures = []
    # On a solver error (status 3 or 4), retry once with presolve switched: the numerical
    # trouble seen on these models starts or ends there.
    for presolve in (opts.presolve, not opts.presolve):
        options: dict[str, Any] = {"mip_rel_gap": opts.mip_rel_gap, "presolve": presolve}
        if opts.time_limit_s is not None:
            options["time_limit"] = opts.time_limit_s
        res = milp(c, constraints=constraint, integrality=integrality, bounds=bounds,
                   options=options)
        if res.status == 0 or (res.status == _HIGHS_LIMIT and res.x is not None):
            return _Solution(res.x, res.status == 0)
        if res.status == _HIGHS_LIMIT:
            raise TimeLimitReached()
        if res.status == _HIGHS_INFEASIBLE:
            return None
        failures.append(f"presolve={presolve}: status {res.status} ({res.message})")
    raise SolverError(
        "The MILP solver (HiGHS) failed on this partitioning model under every setting "
        "tried, so whether a layout fits is unknown (this is not an infeasibility). "
        f"Received: {'; '.join(failures)}; retry with another mip_rel_gap or "
        "max_enumerated_orders, or report the model.")


def _no_good_row(b: _Builder, j: int, k: int, n: int, first: int, last: int,
                 extra: np.ndarray = np.zeros(0, int)) -> None:
    """Forbid stage j from starting at `first` and ending at `last` or later: with the same
    start a later end only adds layers, and every layer's memory is nonnegative (the received
    bytes depend only on the start), so all those stages overflow too. With `extra` (binaries
    of which at most one is 1, e.g. the stage's device-class choices) only together with one
    of them. Each group - the start, the set of ends, `extra` - has at most one variable at
    1, so "not all groups at once" is: their sum <= groups - 1."""
    cols = [np.asarray(extra, dtype=int)]
    if j > 0:
        cols.append(np.array([(j - 1) * n + first - 1]))
    if j < k - 1:
        cols.append(_cut_vars(j, n)[last:])
    cols = np.concatenate(cols)
    groups = (len(extra) > 0) + (j > 0) + (j < k - 1)
    b.add(cols, np.ones(len(cols)), -np.inf, groups - 1)


def overflowing_stages(cm: CostModel, cuts: Sequence[int], order: Sequence[Any]
                       ) -> list[tuple[int, int, int]]:
    """(position, first, last) of every stage whose memory exceeds its device's usable
    memory, in integer bytes with no tolerance (the exact re-check of a MILP layout)."""
    bounds = [-1, *cuts, cm.num_layers - 1]
    return [(j, bounds[j] + 1, bounds[j + 1])
            for j, cost in enumerate(cm.evaluate(cuts, order)) if not cost.fits]


def _solve_order(cm: CostModel, order: Sequence[Any], upper: float, opts: SolverOptions,
                 objective: str = "time") -> tuple[float, list[int], bool] | None:
    """Best cuts for one device order, or None when infeasible (or not better than `upper`);
    the flag is False when the time limit stopped HiGHS before it proved the cuts optimal.

    objective "time": minimise the slowest stage. "feasible": any partition that fits.
    "overflow": minimise the largest memory overflow in bytes (for diagnosing infeasibility).
    """
    k, L = len(order), cm.num_layers
    n = L - 1
    nb = (k - 1) * n
    t_var = nb
    b = _Builder(nb + 1)
    _add_partition_rows(b, k, n)
    # Time rows are scaled to O(1); memory rows stay in bytes (see below).
    t_scale = max(float(cm.prefix_time(order[0])[-1]), 1e-12)
    for j, device in enumerate(order):
        held = cm.input_factor(j, k)
        cols, vals, const = _stage_terms(cm, order, j, cm.position_memory(j, k))
        cap = cm.capacity[device.name]
        if j > 0:  # received activations are held once per minibatch
            cols = np.concatenate([cols, _cut_vars(j - 1, n)])
            vals = np.concatenate([vals, held * cm.cut_bytes])
        if objective == "overflow":
            # memory - cap <= S, with S in units of cap-normalised bytes
            b.add(np.append(cols, t_var), np.append(vals / 2**30, -1.0), -np.inf,
                  (cap - const) / 2**30)
        else:
            # In integer bytes, unscaled: HiGHS' absolute feasibility tolerance (~1e-6) is
            # then far below a byte, where rows scaled by the capacity let layouts a few
            # bytes over through and misled presolve at the knife edge (wrong "optimal").
            b.add(cols, vals, -np.inf, cap - const)
        if objective == "time":
            cols, vals, const = _stage_terms(cm, order, j, cm.prefix_time(device))
            if j > 0:
                cols = np.concatenate([cols, _cut_vars(j - 1, n)])
                vals = np.concatenate([vals, cm.cut_seconds(order[j - 1], device)])
            if j < k - 1:
                cols = np.concatenate([cols, _cut_vars(j, n)])
                vals = np.concatenate([vals, cm.cut_seconds(order[j + 1], device)])
            b.add(np.append(cols, t_var), np.append(vals / t_scale, -1.0), -np.inf,
                  -const / t_scale)
    c = np.zeros(nb + 1)
    c[t_var] = 1.0 if objective in ("time", "overflow") else 0.0
    t_upper = upper / t_scale if objective == "time" and np.isfinite(upper) else np.inf
    t_lower = -np.inf if objective == "overflow" else 0.0
    b_upper = np.ones(nb)
    if k > 1 and objective != "overflow":       # overflowing layouts break the windows
        windows = cut_windows(cm, order, upper if objective == "time" else np.inf)
        if windows is None:
            return None
        _fix_outside_windows(b_upper, windows, n, cm.allowed)
    elif nb:
        _fix_outside_windows(b_upper, (np.zeros(k - 1, int), np.full(k - 1, n - 1)), n,
                             cm.allowed)
    bounds = Bounds(np.r_[np.zeros(nb), t_lower], np.r_[b_upper, t_upper])
    while True:
        solution = _run_milp(c, b, np.r_[np.ones(nb), 0], bounds, opts)
        if solution is None:
            return None
        x = np.round(solution.x[:nb]).reshape(k - 1, n) if nb else np.zeros((0, n))
        cuts = [int(np.argmax(row)) for row in x]
        if objective == "overflow":
            return float(solution.x[t_var]), cuts, solution.optimal
        # HiGHS' feasibility tolerance could let a layout overflow by a few bytes (it did
        # with rows scaled by the capacity). Re-check exactly; forbid each overflowing stage
        # (and every longer one with its start) and solve again. Each round removes the
        # returned layout and no fitting one, so the loop ends at the exact optimum.
        over = overflowing_stages(cm, cuts, order)
        if not over:
            break
        for j, first, last in over:
            _no_good_row(b, j, k, n, first, last)
    # The exact cost of the layout, not the solver's T (which carries its tolerances).
    value = max(cost.time_s for cost in cm.evaluate(cuts, order)) if objective == "time" else 0.0
    return value, cuts, solution.optimal


@dataclasses.dataclass(frozen=True)
class _Best:
    value: float
    cuts: tuple[int, ...]
    order: tuple[Any, ...]


def _check_inputs(profile: Any, devices: Sequence[Any], n_m: int) -> None:
    if not isinstance(n_m, (int, np.integer)) or isinstance(n_m, bool) or n_m <= 0:
        raise PartitionError(f"n_m (minibatches in flight) must be a positive int. "
                             f"Received: n_m={n_m!r}.")
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
               ) -> tuple[_Best | None, str]:
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
    return _Best(value, found.cuts, found.order), solver


def _search(cm: CostModel, devices: Sequence[Any], opts: SolverOptions,
            objective: str = "time") -> tuple[_Best | None, int, str]:
    """Best (cuts, order) over all distinct orders; also how many orders and which solver."""
    k = len(devices)
    if k == 1:
        cost = cm.evaluate([], devices)[0]
        value = {"time": cost.time_s, "feasible": 0.0,
                 "overflow": (cost.memory_bytes - cost.memory_available) / 2**30}[objective]
        if objective != "overflow" and not cost.fits:
            return None, 1, "single stage"
        return _Best(value, (), tuple(devices)), 1, "single stage"
    n_orders = count_distinct_orders(devices)
    if objective in ("time", "feasible") and opts.uses_dp(devices, cm.num_layers):
        best, solver = _search_dp(cm, devices, opts, objective)
        return best, n_orders, solver
    many = n_orders > opts.max_enumerated_orders
    if many and objective in ("time", "feasible"):
        # Feasibility too: the assignment MILP's optimum exists iff some layout fits.
        from hetpipe_tf.partitioner import assignment
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
        return _Best(value, tuple(cuts), tuple(order)), n_orders, solver
    best: _Best | None = None
    # The overflow diagnosis looks at no more orders than the solver would enumerate.
    orders = list(itertools.islice(distinct_orders(devices), max(opts.max_enumerated_orders, 1)))
    if objective == "time":
        # Heuristic partitions bound T from the start; the most promising orders go first.
        guesses = [heuristic_partition(cm, o) for o in orders]
        for o, g in zip(orders, guesses):
            if g is not None and (best is None or g[0] < best.value):
                best = _Best(g[0], tuple(g[1]), o)
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
            found = _solve_order(cm, order, upper, opts, objective)
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
            return _Best(value, tuple(cuts), order), n_orders, solver
        if best is None or value < best.value:
            best = _Best(value, tuple(cuts), order)
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


def _to_plan(cm: CostModel, profile: Any, best: _Best, n_m: int, slots: int, solver: str,
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
    _check_inputs(profile, devices, n_m)
    start = time.perf_counter()
    cm = CostModel(profile, devices, cluster, n_m=n_m, optimizer_slots=optimizer_slots,
                   comm=comm, usable_fraction=options.usable_fraction, sync=sync,
                   prediction=prediction)
    best, n_orders, solver = _search(cm, devices, options)
    if best is None and "time limit" in solver:
        raise PartitionError(
            "The MILP found no layout within its time budget (none may exist, or the search "
            f"needed longer). Received: time_limit_s={options.time_limit_s}; raise it, or "
            "pass None to search until optimal.")
    if best is None:
        from hetpipe_tf.partitioner.diagnose import infeasible_error
        raise infeasible_error(profile, devices, n_m, cluster=cluster, comm=comm,
                               optimizer_slots=optimizer_slots, options=options, sync=sync,
                               prediction=prediction)
    return _to_plan(cm, profile, best, n_m, optimizer_slots, solver, n_orders,
                    time.perf_counter() - start)


def fits(profile: Any, devices: Sequence[Any], n_m: int, *, cluster: Any,
         optimizer_slots: int = 0, options: SolverOptions = SolverOptions(),
         sync: SyncMemory | None = None, prediction: PredictionMemory | None = None) -> bool:
    """Whether some partition of the model over `devices` fits memory with N_m in flight
    (or under the synchronous schedule `sync`, n_m = 1)."""
    _check_inputs(profile, devices, n_m)
    cm = CostModel(profile, devices, cluster, n_m=n_m, optimizer_slots=optimizer_slots,
                   usable_fraction=options.usable_fraction, sync=sync, prediction=prediction)
    return _search(cm, devices, options, objective="feasible")[0] is not None


def max_minibatches(profile: Any, devices: Sequence[Any], *, cluster: Any,
                    optimizer_slots: int = 0, limit: int = 32,
                    options: SolverOptions = SolverOptions(),
                    prediction: PredictionMemory | None = None) -> int:
    """Max_m: the largest N_m <= `limit` for which the virtual worker's memory suffices.

    Memory grows with N_m, so feasibility is monotone and a binary search finds the edge.
    Returns 0 when not even one minibatch fits.
    """
    if limit < 1:
        raise ValueError(f"limit must be >= 1. Received: limit={limit}.")
    lo, hi = 0, limit
    while lo < hi:
        mid = (lo + hi + 1) // 2
        if fits(profile, devices, mid, cluster=cluster, optimizer_slots=optimizer_slots,
                options=options, prediction=prediction):
            lo = mid
        else:
            hi = mid - 1
    return lo


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
    return None
