"""Bounds that confine the partition search without cutting off a better layout.

A cheap greedy partition gives an upper bound UB on the slowest stage's time
(`heuristic_partition`). Every stage time is >= its compute time and its memory >= its
layers' memory, so with T <= UB and the device capacities each boundary's cut lies in a
window (`cut_windows`); cut variables outside their windows, and at cuts no plan may use,
are fixed to 0 (`fix_outside_windows`). Standard MIP preprocessing: it never removes a
solution at least as good as the bound.
"""

from __future__ import annotations

from typing import Any, Sequence

import numpy as np

from hetpipe_tf.partitioner.cost import CostModel


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


def fix_outside_windows(upper: np.ndarray, windows: tuple[np.ndarray, np.ndarray],
                         num_cuts: int, allowed: np.ndarray | None = None) -> None:
    """Fix to 0 (upper bound 0) every cut variable outside its boundary's window, and at
    the cuts no plan may use (`allowed` False: between two calls of a shared layer)."""
    for j, (lo, hi) in enumerate(zip(*windows)):
        row = upper[j * num_cuts:(j + 1) * num_cuts]
        row[:lo] = 0
        row[hi + 1:] = 0
        if allowed is not None:
            row[~allowed[:num_cuts]] = 0

