"""Pure rules of pipelined model parallelism within one virtual worker (paper Section 4).

Nothing here touches TensorFlow. The runtime (`runtime.py`) obeys these rules and the
tests check the runtime's recorded trace against them with `check_trace`.

Minibatches are numbered from 1 in the order the user's dataset yields them. Stages are
numbered from 0 (stage 0 receives the input, stage k-1 computes the loss).

* Stage scheduling: the forward task of p on a stage runs after the forward tasks of every
  p' < p on that stage; likewise for backward tasks; among ready tasks a stage runs the one
  that became ready first (FIFO); the last stage runs forward+backward of a minibatch as one
  task.
* Local staleness: within a run (the minibatches between two drains of the pipeline, see
  docs/strategy.md) minibatch p uses weights that reflect exactly the local updates of
  minibatches 1..p-N_m; the first N_m minibatches of a run use the weights the run started
  with (which reflect every update before the run).
* Continuity: minibatch p+N_m may start as soon as p completed (its update is applied);
  no drain between waves.
"""

from __future__ import annotations

import dataclasses
import enum
import heapq
from typing import Iterable, Mapping, Sequence

from hetpipe_tf._args import check_int


class TaskKind(enum.Enum):
    FORWARD = "fwd"
    BACKWARD = "bwd"
    FORWARD_BACKWARD = "fwd+bwd"  # the last stage's single task
    APPLY = "apply"   # a stage's update of a committed minibatch (`simulate`'s update_time)


@dataclasses.dataclass(frozen=True, order=True)
class Task:
    """One unit of work of one stage for one minibatch."""

    stage: int
    minibatch: int
    kind: TaskKind = dataclasses.field(compare=False)


@dataclasses.dataclass(frozen=True)
class Event:
    """A task that ran from `start` to `end` (seconds or abstract time units)."""

    task: Task
    ready: float
    start: float
    end: float


def _check_positive(name: str, value: int) -> None:
    check_int(name, value, minimum=1)


def last_reflected_update(p: int, n_m: int, run_start: int = 1) -> int:
    """Id of the last local update reflected by minibatch p's weights.

    Updates are applied in minibatch order, so the weights reflect updates 1..q exactly,
    with q = max(run_start - 1, p - n_m). `run_start` is the first minibatch of the run p
    belongs to (1 when the pipeline never drained).
    """
    _check_positive("p", p)
    _check_positive("n_m", n_m)
    _check_positive("run_start", run_start)
    if p < run_start:
        raise ValueError(f"A minibatch cannot precede its run. Received: p={p}, "
                         f"run_start={run_start}; pass run_start <= p.")
    return max(run_start - 1, p - n_m)


def reflected_updates(p: int, n_m: int, run_start: int = 1) -> tuple[int, ...]:
    """The update ids (1-based minibatch ids) that minibatch p's weights reflect."""
    return tuple(range(1, last_reflected_update(p, n_m, run_start) + 1))


def wave_of(p: int, n_m: int) -> int:
    """0-based wave index of minibatch p: waves are N_m consecutive minibatches."""
    _check_positive("p", p)
    _check_positive("n_m", n_m)
    return (p - 1) // n_m


def may_start(p: int, completed: int, n_m: int) -> bool:
    """Whether minibatch p may enter the pipeline when minibatches 1..completed are done."""
    return p - completed <= n_m


def held_minibatches(position: int, num_stages: int, n_m: int) -> int:
    """Most minibatches whose activations the stage at `position` holds at once: N_m on
    every stage but the last (forward of p..p+N_m-1 may all precede the backward of p
    when a later stage is the bottleneck, `may_start`), 1 on the last, whose forward and
    backward of a minibatch are one task."""
    return 1 if position == num_stages - 1 else n_m


def task_kinds(stage: int, num_stages: int) -> tuple[TaskKind, ...]:
    """The tasks a stage runs for each minibatch, in order."""
    if stage == num_stages - 1:
        return (TaskKind.FORWARD_BACKWARD,)
    return (TaskKind.FORWARD, TaskKind.BACKWARD)


def simulate(num_stages: int, n_m: int, num_minibatches: int,
             forward_time: Sequence[float] | None = None,
             backward_time: Sequence[float] | None = None,
             arrival: Sequence[float] | None = None,
             update_time: Sequence[float] | None = None) -> list[Event]:
    """Event order of one virtual worker under the Section 4 rules (a discrete-event model).

    `forward_time[j]` / `backward_time[j]` are stage j's task durations (default 1 and 2);
    the last stage's single task takes the sum of both. `arrival[p-1]` is when minibatch p
    is handed to the virtual worker (default 0: the input is never the bottleneck).
    Minibatch p enters stage 0 once it arrived and minibatch p-N_m completed.

    `update_time[j]` (default none): stage j's own update per minibatch, where the runtime
    runs it (`pipeline/runtime.py`): when stage 0 finishes p's backward, p is committed;
    every other stage gets an APPLY task of p, ready then and FIFO with its other tasks;
    stage 0 applies its part at once on its thread and p completes after that (so p + N_m
    enters after it). Updates are events of kind APPLY.
    Returns events sorted by start time (ties by stage).
    """
    _check_positive("num_stages", num_stages)
    _check_positive("n_m", n_m)
    check_int("num_minibatches", num_minibatches, minimum=0)
    k = num_stages
    fwd = list(forward_time) if forward_time is not None else [1.0] * k
    bwd = list(backward_time) if backward_time is not None else [2.0] * k
    upd = list(update_time) if update_time is not None else [0.0] * k
    arr = list(arrival) if arrival is not None else [0.0] * num_minibatches
    if len(fwd) != k or len(bwd) != k or len(upd) != k or len(arr) != num_minibatches:
        raise ValueError("forward_time, backward_time and update_time need one value per "
                         "stage and arrival one per minibatch. Received: "
                         f"{len(fwd)}, {len(bwd)}, {len(upd)} for {k} stages, {len(arr)} "
                         f"arrivals for {num_minibatches} minibatches.")
    if any(u < 0 for u in upd):
        raise ValueError(f"update_time must be >= 0. Received: update_time={upd}.")

    seq = 0
    ready: list[list[tuple[float, int, Task]]] = [[] for _ in range(k)]  # per-stage heaps
    free_at = [0.0] * k
    events: list[Event] = []

    def push(task: Task, t: float) -> None:
        nonlocal seq
        heapq.heappush(ready[task.stage], (t, seq, task))
        seq += 1

    def first_kind(stage: int) -> TaskKind:
        return task_kinds(stage, k)[0]

    # Minibatches 1..N_m may enter at arrival; later ones when p-N_m completes.
    for p in range(1, min(n_m, num_minibatches) + 1):
        push(Task(0, p, first_kind(0)), arr[p - 1])
    while any(ready):
        # The next task to run: the stage that can start earliest (FIFO on its queue).
        best = None
        for j in range(k):
            if ready[j]:
                start = max(ready[j][0][0], free_at[j])
                if best is None or (start, j) < (best[0], best[1]):
                    best = (start, j)
        start, j = best
        t_ready, _, task = heapq.heappop(ready[j])
        kind = task.kind
        if kind is TaskKind.APPLY:
            dur = upd[j]
        elif kind is TaskKind.FORWARD_BACKWARD:
            dur = fwd[j] + bwd[j]
        else:
            dur = fwd[j] if kind is TaskKind.FORWARD else bwd[j]
        end = start + dur
        free_at[j] = end
        events.append(Event(task, t_ready, start, end))
        p = task.minibatch
        if kind is TaskKind.APPLY:
            continue
        if kind is TaskKind.FORWARD:
            push(Task(j + 1, p, first_kind(j + 1)), end)
        elif j > 0:
            push(Task(j - 1, p, TaskKind.BACKWARD), end)
        else:  # stage 0 finished p's backward (or k == 1): p is committed
            for i in range(1, k):
                if upd[i] > 0:
                    push(Task(i, p, TaskKind.APPLY), end)
            if upd[0] > 0:   # stage 0's own update, on its thread, before anything else
                events.append(Event(Task(0, p, TaskKind.APPLY), end, end, end + upd[0]))
                end += upd[0]
                free_at[0] = end
            nxt = p + n_m
            if nxt <= num_minibatches:
                push(Task(0, nxt, first_kind(0)), max(end, arr[nxt - 1]))
    events.sort(key=lambda e: (e.start, e.task.stage))
    return events


def per_stage_order(events: Iterable[Event]) -> dict[int, list[Task]]:
    """Task order on each stage (by start time)."""
    out: dict[int, list[Task]] = {}
    for e in sorted(events, key=lambda e: (e.start, e.end)):
        out.setdefault(e.task.stage, []).append(e.task)
    return out


class ScheduleViolation(ValueError):
    """A recorded trace breaks a Section 4 rule (raised by `check_trace`, never `assert`:
    the checks must hold under `python -O` too)."""


def _require(ok: bool, message: str) -> None:
    if not ok:
        raise ScheduleViolation(message)


def check_trace(stage_orders: Mapping[int, Sequence[Task]], num_stages: int, n_m: int,
                completions: Sequence[int] | None = None) -> None:
    """Raise ScheduleViolation unless per-stage task orders obey the Section 4 rules.

    Checks per-stage order of forward and backward tasks, the last stage's single task, and
    (on stage 0, which sees each minibatch first and last) at most N_m minibatches in
    flight. `completions`: minibatch ids in completion order (must be increasing).
    """
    k = num_stages
    for j in range(k):
        tasks = list(stage_orders.get(j, ()))
        kinds = task_kinds(j, k)
        for kind in kinds:
            ps = [t.minibatch for t in tasks if t.kind is kind]
            _require(ps == sorted(ps), f"stage {j} runs {kind.value} out of order: {ps}")
            _require(len(set(ps)) == len(ps), f"stage {j} repeats a {kind.value} task: {ps}")
        if j == k - 1:
            _require(all(t.kind is TaskKind.FORWARD_BACKWARD for t in tasks), (
                f"last stage {j} must run forward+backward as one task"))
        else:
            _require(not any(t.kind is TaskKind.FORWARD_BACKWARD for t in tasks),
                     f"stage {j} runs a fwd+bwd task but is not the last stage")
            # A backward of p on stage j never precedes its forward.
            seen_fwd: set[int] = set()
            for t in tasks:
                if t.kind is TaskKind.FORWARD:
                    seen_fwd.add(t.minibatch)
                else:
                    _require(t.minibatch in seen_fwd, f"stage {j}: bwd {t.minibatch} before fwd")
    # Entry on stage 0 (it sees each minibatch first and last): the started-th minibatch
    # of the trace may start only once started - N_m of them completed (`may_start`).
    started = completed = 0
    for t in stage_orders.get(0, ()):
        if t.kind in (TaskKind.FORWARD, TaskKind.FORWARD_BACKWARD):
            started += 1
            _require(may_start(started, completed, n_m),
                     f"more than N_m={n_m} minibatches in flight")
        if t.kind in (TaskKind.BACKWARD, TaskKind.FORWARD_BACKWARD):
            completed += 1
    if completions is not None:
        _require(list(completions) == sorted(completions), f"completion order: {completions}")
