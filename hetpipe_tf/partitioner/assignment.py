"""The partition MILP that also chooses the device order (for when orders are too many).

Devices are grouped into classes of interchangeable ones (same type, host, speed, memory),
which removes the symmetry among them. Variables: the cut variables b[j, c] of
`formulation`,
a[j, g] = 1 when a device of class g runs the stage at position j (class g fills exactly
as many positions as it has devices), receive times r_in[j], r_out[j], and T. With S(j, g)
the stage's compute on class g (linear in b):
    T >= S(j, g) + r_in[j] + r_out[j] - M_t (1 - a[j, g])              for every j, g
    r_in[j]  >= recv(b[j-1], g' -> g) - M_c (2 - a[j-1, g'] - a[j, g])  for every g', g
    r_out[j] >= recv(b[j],   g'' -> g) - M_c (2 - a[j+1, g''] - a[j, g])
    memory(j) <= sum_g a[j, g] cap(g)                                   (no big-M needed)
"""

from __future__ import annotations

from typing import Any, Sequence

import numpy as np
from scipy.optimize import Bounds

from hetpipe_tf.partitioner import bounds
from hetpipe_tf.partitioner.cost import CostModel
from hetpipe_tf.partitioner.dp import device_classes
from hetpipe_tf.partitioner.formulation import (
    Builder,
    add_partition_rows,
    cut_vars,
    no_good_row,
    overflowing_stages,
    run_milp,
    stage_terms,
)
from hetpipe_tf.partitioner.solver_options import SolverOptions


def heuristic_layout(cm: CostModel, devices: Sequence[Any]
                     ) -> tuple[float, list[int], list[Any]] | None:
    """Best greedy layout over a few natural orders (as given, by memory, by speed)."""
    total = {d.name: float(cm.prefix_time(d)[-1]) for d in devices}
    orders = [list(devices),
              sorted(devices, key=lambda d: -cm.capacity[d.name]),
              sorted(devices, key=lambda d: total[d.name])]
    found = [(f[0], f[1], o) for o in orders
             if (f := bounds.heuristic_partition(cm, o)) is not None]
    return min(found, key=lambda f: f[0]) if found else None


def solve_assignment(cm: CostModel, devices: Sequence[Any], opts: SolverOptions
                     ) -> tuple[float, list[int], list[Any], bool] | None:
    """(best time, cuts, device order, proven optimal) over all orders and cuts, or None if
    nothing fits; proven is False when the time limit stopped HiGHS at an incumbent."""
    k, L = len(devices), cm.num_layers
    n = L - 1
    nb = (k - 1) * n
    classes = device_classes(devices)
    g_count = len(classes)
    a0 = nb                          # a[j, g] at a0 + j * G + g: position j uses class g
    rin0 = a0 + k * g_count          # r_in[j], r_out[j]
    rout0 = rin0 + k
    t_var = rout0 + k
    nv = t_var + 1
    av = lambda j, g: a0 + j * g_count + g  # noqa: E731 - index helper
    b = Builder(nv)
    add_partition_rows(b, k, n)
    for j in range(k):
        b.add(np.array([av(j, g) for g in range(g_count)]), np.ones(g_count), 1, 1)
    for g, members in enumerate(classes):
        b.add(np.array([av(j, g) for j in range(k)]), np.ones(k), len(members), len(members))
    rep = [members[0] for members in classes]
    t_scale = max(float(cm.prefix_time(rep[0])[-1]), 1e-12)
    caps = np.array([cm.capacity[d.name] for d in rep], dtype=np.float64)
    worst_compute = max(float(cm.prefix_time(d)[-1]) for d in rep) / t_scale
    # Transfer times between classes; within a class, between two of its devices.
    recv = {(e, g): cm.cut_seconds(classes[e][-1] if e == g else rep[e], rep[g]) / t_scale
            for e in range(g_count) for g in range(g_count)}
    big_c = max(float(r.max(initial=0.0)) for r in recv.values()) + 1.0
    big_t = worst_compute + 2 * big_c + 1.0
    for j in range(k):
        held = cm.input_factor(j, k)
        cols, vals, const = stage_terms(cm, devices, j, cm.position_memory(j, k))
        if j > 0:
            cols = np.concatenate([cols, cut_vars(j - 1, n)])
            vals = np.concatenate([vals, held * cm.cut_bytes])
        a_cols = np.array([av(j, g) for g in range(g_count)])
        # Integer bytes, unscaled: the solver's tolerance stays far below a byte (formulation.py).
        b.add(np.concatenate([cols, a_cols]), np.concatenate([vals, -caps]), -np.inf, -const)
        for g, dev in enumerate(rep):
            cols, vals, const = stage_terms(cm, devices, j, cm.prefix_time(dev))
            b.add(np.concatenate([cols, [rin0 + j, rout0 + j, t_var, av(j, g)]]),
                  np.concatenate([vals / t_scale, [1.0, 1.0, -1.0, big_t]]),
                  -np.inf, big_t - const / t_scale)
            for e in range(g_count):
                if j > 0:   # receive activations from the class at j-1
                    b.add(np.concatenate([cut_vars(j - 1, n),
                                          [rin0 + j, av(j - 1, e), av(j, g)]]),
                          np.concatenate([recv[(e, g)], [-1.0, big_c, big_c]]),
                          -np.inf, 2 * big_c)
                if j < k - 1:  # receive gradients from the class at j+1
                    b.add(np.concatenate([cut_vars(j, n),
                                          [rout0 + j, av(j + 1, e), av(j, g)]]),
                          np.concatenate([recv[(e, g)], [-1.0, big_c, big_c]]),
                          -np.inf, 2 * big_c)
    c = np.zeros(nv)
    c[t_var] = 1.0
    integrality = np.zeros(nv)
    integrality[:rin0] = 1
    upper = np.r_[np.ones(rin0), np.full(2 * k + 1, np.inf)]
    # A heuristic layout bounds T; the bound confines every cut to a window (formulation.py).
    guess = heuristic_layout(cm, devices)
    bound = guess[0] if guess is not None else None
    if bound is not None:
        upper[t_var] = bound / t_scale
    windows = bounds.cut_windows(cm, None, bound if bound is not None else np.inf)
    if windows is None:
        return None
    bounds.fix_outside_windows(upper, windows, n, cm.allowed)
    var_bounds = Bounds(np.zeros(nv), upper)
    while True:
        solution = run_milp(c, b, integrality, var_bounds, opts)
        if solution is None:
            return None
        x = np.round(solution.x)
        cuts = [int(np.argmax(x[cut_vars(j, n)])) for j in range(k - 1)]
        chosen = [int(np.argmax([x[av(j, g)] for g in range(g_count)])) for j in range(k)]
        taken = [0] * g_count
        order = []
        for g in chosen:
            order.append(classes[g][taken[g]])
            taken[g] += 1
        # Exact re-check (integer bytes, no tolerance) of what the solver's tolerance may let
        # through; an overflowing stage is forbidden on its class and on every class with no
        # more memory (its bytes do not depend on the class), and the MILP solved again.
        over = overflowing_stages(cm, cuts, order)
        if not over:
            break
        for j, first, last in over:
            smaller = np.array([av(j, g) for g in range(g_count) if caps[g] <= caps[chosen[j]]])
            no_good_row(b, j, k, n, first, last, extra=smaller)
    # Report the exact cost of the chosen layout, not the big-M relaxation's T.
    value = max(c.time_s for c in cm.evaluate(cuts, order))
    return value, cuts, order, solution.optimal
