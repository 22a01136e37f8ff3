"""The partition MILP for one device order (Section 7), solved with scipy.optimize.milp.

Binary b[j, c] = 1 when stage j's last node is c (boundaries j = 0..k-2, cuts c = 0..L-2),
one cut per boundary, cuts strictly increasing (every stage non-empty), and a continuous
T >= time of every stage (compute + receiving activations + receiving gradients). Prefix
sums make stage time and memory linear in b; memory rows stay in integer bytes. The
solution is re-checked exactly (`overflowing_stages`) and a layout that the solver's
tolerance let through is forbidden and the model solved again (`no_good_row`). The rows
and the solver call are shared with the assignment MILP (assignment.py).
"""

from __future__ import annotations

import dataclasses
from typing import Any, Sequence

import numpy as np
from scipy.optimize import Bounds, LinearConstraint, milp
from scipy.sparse import coo_matrix

from hetpipe_tf.partitioner.bounds import cut_windows, fix_outside_windows
from hetpipe_tf.partitioner.cost import CostModel
from hetpipe_tf.partitioner.solver_options import SolverError, SolverOptions, TimeLimitReached

# scipy.optimize.milp statuses: 0 optimal, 1 iteration or time limit reached,
# 2 infeasible, 3 unbounded, 4 other (HiGHS "solve error", numerical trouble).
_HIGHS_LIMIT = 1
_HIGHS_INFEASIBLE = 2


class Builder:
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


def cut_vars(j: int, num_cuts: int) -> np.ndarray:
    return np.arange(j * num_cuts, (j + 1) * num_cuts)


def add_partition_rows(b: Builder, k: int, num_cuts: int) -> None:
    """One cut per boundary; boundary j's cut strictly before boundary j+1's."""
    positions = np.arange(num_cuts, dtype=np.float64)
    for j in range(k - 1):
        b.add(cut_vars(j, num_cuts), np.ones(num_cuts), 1, 1)
    for j in range(k - 2):
        b.add(np.concatenate([cut_vars(j, num_cuts), cut_vars(j + 1, num_cuts)]),
              np.concatenate([positions, -positions]), -np.inf, -1)


def stage_terms(cm: CostModel, order: Sequence[Any], j: int, prefix: np.ndarray
                 ) -> tuple[np.ndarray, np.ndarray, float]:
    """(cols, vals, constant) of a prefix-sum quantity of stage j as a linear function of b.

    `prefix[i]` is the quantity over nodes 0..i-1; stage j spans (cut_{j-1}, cut_j].
    """
    k, L = len(order), cm.num_layers
    n = L - 1
    cols, vals, const = [], [], 0.0
    if j < k - 1:
        cols.append(cut_vars(j, n))
        vals.append(prefix[1:L])          # end at cut c -> prefix[c + 1]
    else:
        const += prefix[L]
    if j > 0:
        cols.append(cut_vars(j - 1, n))
        vals.append(-prefix[1:L])         # start after cut c -> minus prefix[c + 1]
    return (np.concatenate(cols) if cols else np.zeros(0, int),
            np.concatenate(vals) if vals else np.zeros(0), const)


@dataclasses.dataclass(frozen=True)
class Solution:
    x: np.ndarray
    optimal: bool    # False: the time limit stopped HiGHS at this incumbent (no proof)


def run_milp(c: np.ndarray, rows: Builder, integrality: np.ndarray, bounds: Bounds,
              opts: SolverOptions) -> Solution | None:
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
            return Solution(res.x, res.status == 0)
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


def no_good_row(b: Builder, j: int, k: int, n: int, first: int, last: int,
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
        cols.append(cut_vars(j, n)[last:])
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


def solve_order(cm: CostModel, order: Sequence[Any], upper: float, opts: SolverOptions,
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
    b = Builder(nb + 1)
    add_partition_rows(b, k, n)
    # Time rows are scaled to O(1); memory rows stay in bytes (see below).
    t_scale = max(float(cm.prefix_time(order[0])[-1]), 1e-12)
    for j, device in enumerate(order):
        held = cm.input_factor(j, k)
        cols, vals, const = stage_terms(cm, order, j, cm.position_memory(j, k))
        cap = cm.capacity[device.name]
        if j > 0:  # received activations are held once per minibatch
            cols = np.concatenate([cols, cut_vars(j - 1, n)])
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
            cols, vals, const = stage_terms(cm, order, j, cm.prefix_time(device))
            if j > 0:
                cols = np.concatenate([cols, cut_vars(j - 1, n)])
                vals = np.concatenate([vals, cm.cut_seconds(order[j - 1], device)])
            if j < k - 1:
                cols = np.concatenate([cols, cut_vars(j, n)])
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
        fix_outside_windows(b_upper, windows, n, cm.allowed)
    elif nb:
        fix_outside_windows(b_upper, (np.zeros(k - 1, int), np.full(k - 1, n - 1)), n,
                             cm.allowed)
    bounds = Bounds(np.r_[np.zeros(nb), t_lower], np.r_[b_upper, t_upper])
    while True:
        solution = run_milp(c, b, np.r_[np.ones(nb), 0], bounds, opts)
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
            no_good_row(b, j, k, n, first, last)
    # The exact cost of the layout, not the solver's T (which carries its tolerances).
    value = max(cost.time_s for cost in cm.evaluate(cuts, order)) if objective == "time" else 0.0
    return value, cuts, solution.optimal
