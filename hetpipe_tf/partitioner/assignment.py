"""The partition MILP that also chooses the device order (for when orders are too many).

Variables: the cut variables b[j, c] of `milp`, assignment a[j, d] = 1 when device d runs the
stage at position j, per-position receive times r_in[j], r_out[j], and T. Each device takes
exactly one position. With S(j, d) the stage's compute on d (linear in b):
    T >= S(j, d) + r_in[j] + r_out[j] - M_t (1 - a[j, d])              for every j, d
    r_in[j]  >= recv(b[j-1], d' -> d) - M_c (2 - a[j-1, d'] - a[j, d])  for every d' != d
    r_out[j] >= recv(b[j],   d'' -> d) - M_c (2 - a[j+1, d''] - a[j, d])
    memory(j) <= sum_d a[j, d] cap(d)                                   (no big-M needed)
Interchangeable devices are kept in a fixed relative order to break symmetry.
"""

from __future__ import annotations

from typing import Any, Sequence

import numpy as np
from scipy.optimize import Bounds, milp

from hetpipe_tf.partitioner.cost import CostModel, held_minibatches
from hetpipe_tf.partitioner import milp as _m


def _heuristic_bound(cm: CostModel, devices: Sequence[Any]) -> float | None:
    """Best heuristic layout over a few natural orders (as given, by memory, by speed)."""
    total = {d.name: float(cm.prefix_time(d)[-1]) for d in devices}
    orders = [list(devices),
              sorted(devices, key=lambda d: -cm.capacity[d.name]),
              sorted(devices, key=lambda d: total[d.name])]
    found = [_m.heuristic_partition(cm, o) for o in orders]
    values = [f[0] for f in found if f is not None]
    return min(values) if values else None


def solve_assignment(cm: CostModel, devices: Sequence[Any], opts: "_m.SolverOptions"
                     ) -> tuple[float, list[int], list[Any]] | None:
    """(best time, cuts, device order) over all orders and cuts, or None if nothing fits."""
    k, L = len(devices), cm.num_layers
    n = L - 1
    nb = (k - 1) * n
    a0 = nb                          # a[j, d] at a0 + j * k + d
    rin0 = a0 + k * k                # r_in[j], r_out[j]
    rout0 = rin0 + k
    t_var = rout0 + k
    nv = t_var + 1
    av = lambda j, d: a0 + j * k + d  # noqa: E731 - index helper
    b = _m._Builder(nv)
    _m._add_partition_rows(b, k, n)
    for j in range(k):
        b.add(np.array([av(j, d) for d in range(k)]), np.ones(k), 1, 1)
    for d in range(k):
        b.add(np.array([av(j, d) for j in range(k)]), np.ones(k), 1, 1)
    # Symmetry: among interchangeable devices, the earlier one takes the earlier position.
    key = lambda dev: (dev.type_name, dev.host, dev.emulated_speed_factor, dev.memory_bytes)  # noqa: E731
    for d in range(k):
        for e in range(d + 1, k):
            if key(devices[d]) == key(devices[e]):
                pos = np.arange(k, dtype=np.float64)
                b.add(np.array([av(j, d) for j in range(k)] + [av(j, e) for j in range(k)]),
                      np.concatenate([pos, -pos]), -np.inf, -1)
                break
    t_scale = max(float(cm.prefix_time(devices[0])[-1]), 1e-12)
    caps = np.array([cm.capacity[d.name] for d in devices], dtype=np.float64)
    cap_scale = float(caps.max())
    worst_compute = max(float(cm.prefix_time(d)[-1]) for d in devices) / t_scale
    recv = {(s, t): cm.cut_seconds(devices[s], devices[t]) / t_scale
            for s in range(k) for t in range(k) if s != t}
    big_c = max((float(r.max()) for r in recv.values()), default=0.0) + 1.0
    big_t = worst_compute + 2 * big_c + 1.0
    for j in range(k):
        held = held_minibatches(j, k, cm.n_m)
        cols, vals, const = _m._stage_terms(cm, devices, j, cm.prefix_memory(held))
        if j > 0:
            cols = np.concatenate([cols, _m._cut_vars(j - 1, n)])
            vals = np.concatenate([vals, held * cm.cut_bytes])
        a_cols = np.array([av(j, d) for d in range(k)])
        b.add(np.concatenate([cols, a_cols]), np.concatenate([vals, -caps]) / cap_scale,
              -np.inf, -const / cap_scale)
        for d, dev in enumerate(devices):
            cols, vals, const = _m._stage_terms(cm, devices, j, cm.prefix_time(dev))
            b.add(np.concatenate([cols, [rin0 + j, rout0 + j, t_var, av(j, d)]]),
                  np.concatenate([vals / t_scale, [1.0, 1.0, -1.0, big_t]]),
                  -np.inf, big_t - const / t_scale)
            for e in range(k):
                if e == d:
                    continue
                if j > 0:   # receive activations from the device at j-1
                    b.add(np.concatenate([_m._cut_vars(j - 1, n),
                                          [rin0 + j, av(j - 1, e), av(j, d)]]),
                          np.concatenate([recv[(e, d)], [-1.0, big_c, big_c]]),
                          -np.inf, 2 * big_c)
                if j < k - 1:  # receive gradients from the device at j+1
                    b.add(np.concatenate([_m._cut_vars(j, n),
                                          [rout0 + j, av(j + 1, e), av(j, d)]]),
                          np.concatenate([recv[(e, d)], [-1.0, big_c, big_c]]),
                          -np.inf, 2 * big_c)
    c = np.zeros(nv)
    c[t_var] = 1.0
    integrality = np.zeros(nv)
    integrality[:rin0] = 1
    upper = np.r_[np.ones(rin0), np.full(2 * k + 1, np.inf)]
    # A heuristic layout bounds T; the bound confines every cut to a window (see milp).
    bound = _heuristic_bound(cm, devices)
    if bound is not None:
        upper[t_var] = bound / t_scale
        windows = _m.cut_windows(cm, None, bound)
        if windows is None:
            return None
        for j, (lo, hi) in enumerate(zip(*windows)):
            row = upper[j * n:(j + 1) * n]
            row[:lo] = 0
            row[hi + 1:] = 0
    options: dict[str, Any] = {"mip_rel_gap": opts.mip_rel_gap}
    if opts.time_limit_s is not None:
        options["time_limit"] = opts.time_limit_s
    res = milp(c, constraints=b.constraint(), integrality=integrality,
               bounds=Bounds(np.zeros(nv), upper), options=options)
    if res.x is None:
        return None
    x = np.round(res.x)
    cuts = [int(np.argmax(x[_m._cut_vars(j, n)])) for j in range(k - 1)]
    order = [devices[int(np.argmax([x[av(j, d)] for d in range(k)]))] for j in range(k)]
    # Report the exact cost of the chosen layout, not the big-M relaxation's T.
    value = max(c.time_s for c in cm.evaluate(cuts, order))
    return value, cuts, order
