"""Where a stage's per-minibatch update runs in one VW's pipeline, as the runtime does it.

Every stage applies its own partition's update (optimizer step + the next weight-version
snapshot) on its own thread and device (`pipeline/runtime.py` `_commit`, `weights.py`):
when stage 0 finishes minibatch p's backward, p is committed: every other stage j gets an
APPLY task of p, ready at that moment and queued FIFO with its other ready tasks; then
stage 0 applies its own part at once on its thread, and p completes when that is done
(so p + N_m enters after it). With one stage, the update follows its single task.

`simulate_pipeline` is `hetpipe_tf.core.schedule.simulate` when no stage has an update
(it returns exactly that function's events). With updates it runs the same Section 4
list scheduling (earliest possible start over the stages, FIFO per stage, ties by stage)
plus those APPLY tasks, which appear as events of kind `APPLY`. The loop is the core
one extended by the commit step above: core/ is another developer's, and the extension
belongs there (an `update_time` argument of `schedule.simulate`); until then
tests/sim/test_updates.py pins that both agree whenever updates are 0 and checks the
extension by hand.
"""

from __future__ import annotations

import enum
import heapq
from typing import Sequence

from hetpipe_tf.core import schedule
from hetpipe_tf.core.schedule import Event, Task, TaskKind


class UpdateKind(enum.Enum):
    APPLY = "apply"   # a stage's update of a committed minibatch (the runtime's "apply" task)


APPLY = UpdateKind.APPLY


def simulate_pipeline(num_stages: int, n_m: int, num_minibatches: int,
                      forward_time: Sequence[float], backward_time: Sequence[float],
                      update_time: Sequence[float] | None = None,
                      arrival: Sequence[float] | None = None) -> list[Event]:
    """Events of one VW under the Section 4 rules with each stage's update (module doc).

    `update_time[j]`: seconds of stage j's update per minibatch (None or all 0: none).
    """
    if update_time is None or not any(update_time):
        return schedule.simulate(num_stages, n_m, num_minibatches, forward_time,
                                 backward_time, arrival=arrival)
    return _simulate(num_stages, n_m, num_minibatches, forward_time, backward_time,
                     update_time, arrival)


def _simulate(num_stages: int, n_m: int, num_minibatches: int, forward_time: Sequence[float],
              backward_time: Sequence[float], update_time: Sequence[float],
              arrival: Sequence[float] | None) -> list[Event]:
    """The loop (also with all updates 0, where it must equal core's: tested)."""
    k = num_stages
    fwd, bwd, upd = list(forward_time), list(backward_time), list(update_time)
    arr = list(arrival) if arrival is not None else [0.0] * num_minibatches
    if not (len(fwd) == len(bwd) == len(upd) == k) or len(arr) != num_minibatches:
        raise ValueError("forward_time, backward_time and update_time need one value per "
                         f"stage and arrival one per minibatch. Received: {len(fwd)}, "
                         f"{len(bwd)}, {len(upd)} for {k} stages, {len(arr)} arrivals for "
                         f"{num_minibatches} minibatches.")
    if any(u < 0 for u in upd):
        raise ValueError(f"update_time must be >= 0. Received: update_time={upd}.")

    seq = 0
    ready: list[list[tuple[float, int, Task]]] = [[] for _ in range(k)]
    free_at = [0.0] * k
    events: list[Event] = []

    def push(task: Task, t: float) -> None:
        nonlocal seq
        heapq.heappush(ready[task.stage], (t, seq, task))
        seq += 1

    def first_kind(stage: int) -> TaskKind:
        return schedule.task_kinds(stage, k)[0]

    for p in range(1, min(n_m, num_minibatches) + 1):
        push(Task(0, p, first_kind(0)), arr[p - 1])
    while any(ready):
        best = None
        for j in range(k):
            if ready[j]:
                start = max(ready[j][0][0], free_at[j])
                if best is None or (start, j) < (best[0], best[1]):
                    best = (start, j)
        start, j = best
        t_ready, _, task = heapq.heappop(ready[j])
        kind = task.kind
        if kind is APPLY:
            dur = upd[j]
        elif kind is TaskKind.FORWARD_BACKWARD:
            dur = fwd[j] + bwd[j]
        else:
            dur = fwd[j] if kind is TaskKind.FORWARD else bwd[j]
        end = start + dur
        free_at[j] = end
        events.append(Event(task, t_ready, start, end))
        p = task.minibatch
        if kind is APPLY:
            continue
        if kind is TaskKind.FORWARD:
            push(Task(j + 1, p, first_kind(j + 1)), end)
        elif j > 0:
            push(Task(j - 1, p, TaskKind.BACKWARD), end)
        else:  # stage 0 finished p's backward (or k == 1): p is committed
            for i in range(1, k):
                if upd[i] > 0:
                    push(Task(i, p, APPLY), end)
            if upd[0] > 0:   # stage 0's own update, on its thread, before anything else
                events.append(Event(Task(0, p, APPLY), end, end, end + upd[0]))
                end += upd[0]
                free_at[0] = end
            nxt = p + n_m
            if nxt <= num_minibatches:
                push(Task(0, nxt, first_kind(0)), max(end, arr[nxt - 1]))
    events.sort(key=lambda e: (e.start, e.task.stage))
    return events
