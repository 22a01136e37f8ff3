"""Exact partitioning without a MILP: bisection on the bottleneck T, each step a DP.

The question "is there a layout (device order and cuts) whose every stage takes <= T and
fits its device?" is answered exactly by a dynamic programme over
    (position j, last node e of stage j, device-class counts used by positions 0..j,
     class of position j),
whose value is the smallest *partial* time of stage j (compute + receiving activations)
over every layout of positions 0..j that meets T so far. Stage j's remaining term, the
gradients received from position j+1, depends on the class of j+1 and the cut e only, so it
is added (and T checked) when position j+1 is chosen; a smaller partial time is then never
worse, which is what makes keeping only the minimum exact. Devices of one class (same type,
host, speed, memory) are interchangeable, so the counts stand for every device order: one
DP covers all of them. Memory is integer bytes (the MILP's no-good loop is not needed):
a stage starting at s fits iff it ends at or before emax(s), found by binary search on the
integer memory prefix sums, since every layer's memory is nonnegative.

Transition to position j+1 of class h starting at node s (after cut s-1):
    partial(e') = P_h[e'+1] + min{ key(s) : s valid, s <= e' <= emax(s) },
    key(s) = recv(cut s-1, class g -> h) - P_h[s],  s valid from (j, s-1, counts, g) iff
    partial_j(s-1) + recv(cut s-1, h -> g) <= T.
The "min over intervals [s, emax(s)]" is a range-chmin / point query, done for all e' at
once with a sparse table (two power-of-two blocks per interval, pushed down level by level),
all in numpy. One DP costs O(states x L log L) with states = class-count vectors x classes.

The optimum is bracketed: `lower` is a proven lower bound (no layout meets a T that failed),
`upper` the exact cost (CostModel.evaluate) of the best layout found; bisection ends when
they are within `REL_TOL` of each other (float rounding of the prefix sums, not a MIP gap).
"""

from __future__ import annotations

import dataclasses
import itertools
import math
import time
from typing import Any, Sequence

import numpy as np

from hetpipe_tf.partitioner.cost import CostModel
from hetpipe_tf.partitioner.plan import PartitionError

# Bisection stops when (upper - lower) <= REL_TOL * upper: the prefix sums the DP compares
# with T carry float rounding of this order on 1000-layer models, so closer is noise.
REL_TOL = 1e-12
# T standing for "no time bound" (feasibility): finite so that inf (unreachable) + x > T.
_NO_BOUND = float(np.finfo(np.float64).max)
# Below this relative bracket the bisection tries the bracket's lower end (a reachable value
# after a failed check): if a layout meets it, that layout is optimal without more steps.
_NARROW = 1e-6
# Past this many cells a check (numpy arrays of that many float64) would not fit memory.
MAX_WORK = 1_000_000_000


@dataclasses.dataclass(frozen=True)
class DPResult:
    """A layout and what is proven about it."""

    value: float                 # its slowest stage, exact (CostModel.evaluate)
    cuts: tuple[int, ...]
    order: tuple[Any, ...]
    lower: float                 # no layout's slowest stage is below this
    checks: int                  # DP feasibility checks run
    proven: bool                 # bisection closed (False: stopped by the deadline)


def _class_key(d: Any) -> tuple:
    return (d.type_name, d.host, d.emulated_speed_factor, d.memory_bytes)


def device_classes(devices: Sequence[Any]) -> list[list[Any]]:
    """Interchangeable devices grouped, in first-seen order (same as the MILP's)."""
    groups: dict[tuple, list[Any]] = {}
    for d in devices:
        groups.setdefault(_class_key(d), []).append(d)
    return list(groups.values())


def work_estimate(devices: Sequence[Any], num_layers: int) -> int:
    """Cells one DP check touches (transitions x layers), to decide whether the DP is the
    right tool: with many distinct classes the count vectors grow as 2^classes."""
    sizes = [len(g) for g in device_classes(devices)]
    vectors = math.prod(s + 1 for s in sizes)
    return vectors * len(sizes) ** 2 * num_layers


class _Level:
    """Position p's states (count vector, class) and the pairs (state, predecessor)."""

    def __init__(self, states: list[tuple[tuple[int, ...], int]]) -> None:
        states.sort(key=lambda s: (s[1], s[0]))    # one class's states contiguous
        self.states = states
        self.index = {s: i for i, s in enumerate(states)}
        self.cls = np.array([g for _, g in states], dtype=np.intp)
        self.pair_src = np.zeros(0, np.intp)
        self.pair_g = np.zeros(0, np.intp)
        self.pair_h = np.zeros(0, np.intp)
        self.starts = np.zeros(0, np.intp)         # first pair of each state

    def link(self, previous: "_Level") -> None:
        src, gs, hs, starts = [], [], [], []
        for counts, h in self.states:
            starts.append(len(src))
            before = list(counts)
            before[h] -= 1
            for g in range(len(counts)):
                i = previous.index.get((tuple(before), g))
                if i is not None:
                    src.append(i)
                    gs.append(g)
                    hs.append(h)
        self.pair_src = np.array(src, dtype=np.intp)
        self.pair_g = np.array(gs, dtype=np.intp)
        self.pair_h = np.array(hs, dtype=np.intp)
        self.starts = np.array(starts, dtype=np.intp)


class _Intervals:
    """Range-min over intervals [s, emax(s)]: for every end e', the smallest key(s) among
    the intervals holding e'. Intervals reaching the last allowed end (memory not binding)
    are a running minimum; each other interval is written into two power-of-two blocks of
    a sparse table (their union is the interval), which is pushed down to single nodes."""

    def __init__(self, emax: np.ndarray, last_end: int) -> None:
        L = len(emax)
        s = np.flatnonzero(emax >= np.arange(L))
        self.open = np.zeros(L, bool)
        self.open[s[emax[s] >= last_end]] = True
        self.last_end = last_end
        s = s[emax[s] < last_end]
        self.L, self.levels = L, 0
        if not len(s):
            return
        lg = np.floor(np.log2(emax[s] - s + 1)).astype(np.intp)
        self.levels = int(lg.max()) + 1
        slots = np.concatenate([lg * L + s, lg * L + emax[s] - (1 << lg) + 1])
        order = np.argsort(slots, kind="stable")
        slots, self.sources = slots[order], np.concatenate([s, s])[order]
        self.starts = np.flatnonzero(np.r_[True, slots[1:] != slots[:-1]])
        self.slots = slots[self.starts]

    def min_over(self, keys: np.ndarray) -> np.ndarray:
        """keys (rows x L, indexed by start s) -> (rows x L, indexed by end e')."""
        rows = keys.shape[0]
        out = np.minimum.accumulate(np.where(self.open, keys, np.inf), axis=1)
        out[:, self.last_end + 1:] = np.inf
        if not self.levels:
            return out
        table = np.full((rows, self.levels * self.L), np.inf)
        table[:, self.slots] = np.minimum.reduceat(keys[:, self.sources], self.starts, axis=1)
        table = table.reshape(rows, self.levels, self.L)
        for lg in range(self.levels - 1, 0, -1):
            half = 1 << (lg - 1)
            np.minimum(table[:, lg - 1], table[:, lg], out=table[:, lg - 1])
            np.minimum(table[:, lg - 1, half:], table[:, lg, :-half],
                       out=table[:, lg - 1, half:])
        return np.minimum(out, table[:, 0], out=out)


class Problem:
    """The T-independent tables of one (cost model, devices): built once, checked often."""

    def __init__(self, cm: CostModel, devices: Sequence[Any]) -> None:
        self.cm = cm
        self.k = k = len(devices)
        self.L = L = cm.num_layers
        self.classes = classes = device_classes(devices)
        # Ends no stage but the last may have (between two calls of a shared layer).
        self.forbidden = np.flatnonzero(~cm.allowed)
        G = len(classes)
        sizes = [len(c) for c in classes]
        rep = [c[0] for c in classes]
        self.P = np.stack([cm.prefix_time(d) for d in rep])            # (G, L+1)
        # XS[a, b, s]: seconds to move cut s-1 from a device of class a to another of class
        # b (s = 1..L-1; s = 0 has no cut). Two devices of one class: its first two.
        self.XS = np.full((G, G, L), np.inf)
        for a, b in itertools.product(range(G), repeat=2):
            if a == b and sizes[a] < 2:
                continue
            src = classes[a][1] if a == b else classes[a][0]
            self.XS[a, b, 1:] = cm.cut_seconds(src, classes[b][0])
        # KEY[g, h, s]: partial time of a class-h stage starting at s after class g, less
        # P_h[e'+1] (added per end).
        self.KEY = self.XS - self.P[None, :, :L]
        # Integer bytes (the cost model's layer bytes are integers; float sums of them
        # are exact far beyond any device's memory).
        cut_bytes = np.rint(cm.cut_bytes).astype(np.int64)
        caps = [cm.capacity[d.name] for d in rep]
        self.emax: dict[tuple[int, int], np.ndarray] = {}
        self.intervals: dict[tuple[int, int], _Intervals] = {}
        memo: dict[tuple, tuple[np.ndarray, _Intervals]] = {}
        for p in range(k):
            held = cm.input_factor(p, k)
            memory = np.rint(cm.position_memory(p, k)).astype(np.int64)
            last_end = L - 1 - (k - 1 - p)         # a node for every later stage
            for h in range(G):
                key = (held, p == 0, last_end, caps[h])
                if key not in memo:
                    if p == 0:      # starts at node 0, receives nothing
                        budget = np.full(L, -1, np.int64)
                        budget[0] = caps[h]
                    else:           # budget left for nodes s.. after the received bytes
                        budget = (caps[h] + memory[:L]
                                  - np.rint(held * np.r_[0, cut_bytes]).astype(np.int64))
                        budget[0] = -1
                    emax = np.searchsorted(memory, budget, side="right") - 2
                    emax = np.minimum(emax, last_end)
                    emax[budget < 0] = -1
                    memo[key] = (emax, _Intervals(emax, last_end))
                self.emax[p, h], self.intervals[p, h] = memo[key]
        # Levels: position p holds count vectors summing to p + 1.
        by_sum: dict[int, list] = {}
        for counts in itertools.product(*(range(s + 1) for s in sizes)):
            total = sum(counts)
            if 1 <= total <= k:
                by_sum.setdefault(total, []).extend(
                    (counts, g) for g in range(G) if counts[g] > 0)
        self.levels = [_Level(by_sum[p + 1]) for p in range(k)]
        for p in range(1, k):
            self.levels[p].link(self.levels[p - 1])
        full = tuple(sizes)
        self.final = np.array([i for i, (c, _) in enumerate(self.levels[-1].states)
                               if c == full], dtype=np.intp)

    # --- one feasibility check --------------------------------------------------------
    def _forward(self, T: float) -> tuple[list[np.ndarray], float]:
        """Minimal partial time per (state, end node) at every position (inf = no layout),
        and the next event: the smallest compared quantity above T. Every comparison with
        T keeps its outcome for any T' < next event, so the DP's answer does too."""
        L = self.L
        first = self.levels[0]
        part = np.full((len(first.states), L), np.inf)
        for i, h in enumerate(first.cls):
            ok = np.flatnonzero(np.arange(L) <= self.emax[0, h][0])
            part[i, ok] = self.P[h, ok + 1] - self.P[h, 0]
        if self.k > 1:
            part[:, self.forbidden] = np.inf
        over = part > T
        event = float(part[over].min(initial=np.inf))
        part[over] = np.inf
        parts = [part]
        for p in range(1, self.k):
            level = self.levels[p]
            shifted = np.empty_like(part)        # indexed by the next start s = e + 1
            shifted[:, 0] = np.inf
            shifted[:, 1:] = part[:, :-1]
            total = shifted[level.pair_src] + self.XS[level.pair_h, level.pair_g]
            ok = total <= T
            event = min(event, float(np.where(ok, np.inf, total).min(initial=np.inf)))
            keys = np.where(ok, self.KEY[level.pair_g, level.pair_h], np.inf)
            keys = np.minimum.reduceat(keys, level.starts, axis=0)
            part = np.empty((len(level.states), L))
            for h in np.unique(level.cls):
                rows = np.flatnonzero(level.cls == h)
                part[rows] = self.intervals[p, h].min_over(keys[rows]) + self.P[h, 1:]
            if p < self.k - 1:
                part[:, self.forbidden] = np.inf
            over = part > T
            event = min(event, float(part[over].min(initial=np.inf)))
            part[over] = np.inf
            parts.append(part)
        return parts, event

    def _backtrack(self, parts: list[np.ndarray], T: float, state: int
                   ) -> tuple[list[int], list[int]]:
        """Cuts and class sequence of a layout meeting T that ends in `state` at node L-1."""
        e, cuts, seq = self.L - 1, [], []
        for p in range(self.k - 1, 0, -1):
            level = self.levels[p]
            h = int(level.cls[state])
            pairs = range(level.starts[state],
                          level.starts[state + 1] if state + 1 < len(level.starts)
                          else len(level.pair_src))
            s = np.arange(1, e + 1)
            fits = self.emax[p, h][s] >= e
            best = (np.inf, -1, -1)
            for q in pairs:
                u, g = int(level.pair_src[q]), int(level.pair_g[q])
                ok = fits & (parts[p - 1][u, s - 1] + self.XS[h, g, s] <= T)
                partial = np.where(ok, self.KEY[g, h, s], np.inf)
                i = int(np.argmin(partial))
                if partial[i] < best[0]:
                    best = (float(partial[i]), u, int(s[i]))
            _, state, start = best
            seq.append(h)
            cuts.append(start - 1)
            e = start - 1
        seq.append(int(self.levels[0].cls[state]))
        return cuts[::-1], seq[::-1]

    def layout(self, T: float | None) -> tuple[list[int], list[Any]] | float:
        """(cuts, device order) of a layout whose stages all take <= T (None: no bound) and
        fit; when none does, the next event above T (no layout is within any T' below it,
        inf when memory alone rules every layout out)."""
        bound = _NO_BOUND if T is None else T
        parts, event = self._forward(bound)
        ends = parts[-1][self.final, self.L - 1]
        if not np.any(np.isfinite(ends)):
            return event
        cuts, seq = self._backtrack(parts, bound, int(self.final[np.argmin(ends)]))
        taken = [0] * len(self.classes)
        order = []
        for g in seq:
            order.append(self.classes[g][taken[g]])
            taken[g] += 1
        return cuts, order

    def lower_bound(self) -> float:
        """Every layer runs somewhere and the k stages share the work: a bound below T*."""
        fastest = np.min(np.diff(self.P, axis=1), axis=0)
        return float(max(fastest.sum() / self.k, fastest.max(initial=0.0)))


def _cost(cm: CostModel, cuts: Sequence[int], order: Sequence[Any]) -> float:
    costs = cm.evaluate(cuts, order)
    if not cm.cuts_allowed(cuts) or not all(c.fits for c in costs):   # a bug otherwise
        raise AssertionError(f"internal error: the DP chose a layout that does not fit "
                             f"memory or cuts a shared layer (cuts={list(cuts)}); please "
                             "report it")
    return max(c.time_s for c in costs)


def solve(cm: CostModel, devices: Sequence[Any], *, feasibility_only: bool = False,
          deadline: float | None = None) -> DPResult | None:
    """The layout with the smallest slowest stage over every device order (None when no
    layout fits). `deadline` (time.perf_counter()) stops the bisection early: the best
    layout found stands, with proven=False. `feasibility_only`: the first fitting layout."""
    work = work_estimate(devices, cm.num_layers)
    if work > MAX_WORK:
        raise PartitionError(
            f"The DP's tables would be too large for these devices: too many classes of "
            f"interchangeable devices (the count vectors grow as 2^classes). Received: "
            f"{len(device_classes(devices))} classes of {len(devices)} devices, "
            f"{cm.num_layers} layers, {work} cells per check (limit {MAX_WORK}); use "
            "SolverOptions(method=Method.AUTO) or Method.MILP.")
    problem = Problem(cm, devices)
    found = problem.layout(None)
    checks = 1
    if not isinstance(found, tuple):
        return None
    cuts, order = found
    best = _cost(cm, cuts, order)
    # upper: a T the DP found a layout within; lower: every layout's bottleneck is >= it
    # (raised by each failed check to its next event, so it is itself a reachable value).
    upper, lower = best, min(problem.lower_bound(), best)
    if feasibility_only:
        return DPResult(best, tuple(cuts), tuple(order), lower, checks, False)
    while upper > lower and upper - lower > REL_TOL * upper:
        if deadline is not None and time.perf_counter() >= deadline:
            return DPResult(best, tuple(cuts), tuple(order), lower, checks, False)
        # Bisect; once the bracket is narrow try its lower end, the likeliest optimum.
        T = lower if upper - lower < _NARROW * upper else (lower + upper) / 2
        found = problem.layout(T)
        checks += 1
        if not isinstance(found, tuple):
            lower = max(lower, found)
            continue
        value = _cost(cm, *found)
        if value > T * (1 + 1e-9):
            # The DP's prefix sums and CostModel.evaluate disagree beyond rounding: the
            # cost model has a term this module does not know about.
            raise AssertionError(
                f"internal error: the DP's stage times disagree with CostModel.evaluate "
                f"(a layout within T={T!r} costs {value!r}); update partitioner/dp.py to "
                "the cost model")
        if T == lower:          # a layout within the proven lower bound: optimal
            upper = lower
        else:
            upper = min(T, value)
        if value < best:
            best, (cuts, order) = value, found
    return DPResult(best, tuple(cuts), tuple(order), lower, checks, True)
