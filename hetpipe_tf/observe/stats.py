"""Per-stage figures of a pipeline's events: busy, idle and waiting time, utilisation,
time per minibatch, throughput, and the staleness of the weights minibatches used.

Definitions (docs/observe.md), for the events of one virtual worker over its span (first
task start to last task end of that virtual worker):

* busy_s: sum of the stage's task durations;
* idle_s: sum of the gaps between consecutive tasks of the stage (it had started and had
  not finished its part of the window, yet ran nothing);
* waiting_s: time before the stage's first task and after its last within the span (the
  pipeline filling and draining: the stage waits for the other stages);
  busy_s + idle_s + waiting_s == span_s;
* utilisation: busy_s / span_s;
* time_per_minibatch_s: busy_s / number of distinct minibatches the stage ran (its forward
  plus backward work for one minibatch, comparable with `StagePlan.time_s`);
* throughput: distinct minibatches that ran on stage 0 / span_s (x batch size for samples).
"""

from __future__ import annotations

import dataclasses
from typing import Any, Iterable, Mapping, Sequence

from hetpipe_tf.observe.events import StageEvent, normalize


@dataclasses.dataclass(frozen=True)
class StageStats:
    vw: int
    stage: int
    tasks: int
    minibatches: int
    busy_s: float
    idle_s: float
    waiting_s: float
    span_s: float

    @property
    def utilisation(self) -> float:
        return self.busy_s / self.span_s if self.span_s > 0 else 0.0

    @property
    def time_per_minibatch_s(self) -> float:
        return self.busy_s / self.minibatches if self.minibatches else 0.0


def stage_stats(events: Iterable[Any], vw: int | None = None) -> dict[tuple[int, int], StageStats]:
    """(virtual worker, stage) -> `StageStats` of the events (see the module docstring)."""
    evs = normalize(events, vw)
    by_vw: dict[int, list[StageEvent]] = {}
    for e in evs:
        by_vw.setdefault(e.vw, []).append(e)
    out = {}
    for w, ves in sorted(by_vw.items()):
        t0 = min(e.start for e in ves)
        t1 = max(e.end for e in ves)
        span = t1 - t0
        by_stage: dict[int, list[StageEvent]] = {}
        for e in ves:
            by_stage.setdefault(e.stage, []).append(e)
        for j, ses in sorted(by_stage.items()):
            ses.sort()
            busy = sum(e.duration for e in ses)
            idle = sum(max(0.0, b.start - a.end) for a, b in zip(ses, ses[1:]))
            waiting = max(0.0, (ses[0].start - t0) + (t1 - max(e.end for e in ses)))
            out[(w, j)] = StageStats(vw=w, stage=j, tasks=len(ses),
                                     minibatches=len({e.minibatch for e in ses}),
                                     busy_s=busy, idle_s=idle, waiting_s=waiting, span_s=span)
    return out


def throughput(events: Iterable[Any], batch_size: int | None = None,
               vw: int | None = None) -> float:
    """Minibatches (or samples, with `batch_size`) per second over the events' span.

    With several virtual workers: the sum over them of each one's minibatches / its span.
    """
    evs = normalize(events, vw)
    total = 0.0
    for w in sorted({e.vw for e in evs}):
        ves = [e for e in evs if e.vw == w]
        span = max(e.end for e in ves) - min(e.start for e in ves)
        done = len({e.minibatch for e in ves if e.stage == 0})
        if span > 0:
            total += done / span
    return total * (batch_size or 1)


def staleness(record: Mapping[int, Sequence[int] | int],
              minibatches: Iterable[int] | None = None) -> dict[int, int]:
    """Minibatch p -> p minus the last update its weights reflected.

    `record` is `PipelineRuntime.record` (p -> the update ids reflected) or p -> the last
    update id. Within a run of the local pipeline this is N_m (the paper's s_local + 1);
    at most N_m for the first minibatches of a run.
    """
    keys = sorted(record) if minibatches is None else sorted(set(minibatches) & set(record))
    out = {}
    for p in keys:
        r = record[p]
        last = (max(r) if len(r) else 0) if isinstance(r, (tuple, list, set, frozenset)) else int(r)
        out[p] = p - last
    return out
