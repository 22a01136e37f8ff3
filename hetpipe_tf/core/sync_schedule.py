"""Synchronous pipeline schedules as values: per stage, the ordered list of actions.

A synchronous schedule splits each minibatch into M micro-batches. Every stage runs the
forward (F) and backward (B) of each micro-batch once, accumulates the weight gradients in
its own memory and applies them once (APPLY) at the end of the minibatch, so one minibatch
is one optimizer step on every stage (GPipe Section 2.2). A schedule only decides the
ORDER of F and B on each stage; the executor (`pipeline/sync_runtime.py`) runs the lists on
the stage threads and the simulator (`sim/gpipe.py`) replays the same lists with times
(`replay` below). A new schedule (interleaved, zero-bubble) is one more function returning
such lists, checked by `check_actions`; its memory rule (`Schedule.held`) is read off
its own lists, so the planner and the simulator need nothing more.

* GPIPE: all forwards, then all backwards (GPipe Fig. 2c): stage j holds the activations of
  all M micro-batches at once.
* ONE_F_ONE_B (PipeDream-flush): stage j runs min(K - 1 - j, M) warm-up forwards, then
  alternates one forward and one backward, then the remaining backwards; it holds at most
  min(K - j, M) micro-batches' activations. Same result as GPIPE (same gradients, summed in
  the same micro-batch order), less memory, the same bubble (K - 1) / (M + K - 1) with equal
  stage times. Any M >= 1 is valid (M < K only shortens the warm-up).

Dependencies a list must respect (checked by `check_actions`, replayed by `replay`):
F(j, m) after F(j - 1, m); B(j, m) after B(j + 1, m) and after F(j, m); APPLY last, after
every B of the stage. Micro-batches are numbered from 0, stages from 0.
"""

from __future__ import annotations

import dataclasses
import enum
import functools
from typing import Callable, Sequence

from hetpipe_tf._args import check_int, parse_enum
from hetpipe_tf.core.schedule import held_minibatches


class Schedule(enum.Enum):
    """How a virtual worker schedules its minibatches (HetPipeStrategy(schedule=...))."""

    HETPIPE = "hetpipe"          # asynchronous, N_m minibatches in flight (paper Section 4)
    GPIPE = "gpipe"              # synchronous: M micro-batches, all F then all B
    ONE_F_ONE_B = "1f1b"         # synchronous: PipeDream-flush

    @property
    def synchronous(self) -> bool:
        return self is not Schedule.HETPIPE

    @classmethod
    def parse(cls, value) -> "Schedule":
        return parse_enum(cls, value, arg="schedule", what="pipeline schedule")

    def held(self, num_stages: int, in_flight: int) -> tuple[int, ...]:
        """Per stage position, the most units whose activations the stage holds at once.

        Synchronous: micro-batches of a minibatch of `in_flight` = M, the peak of each
        stage's own action list (GPIPE: M; ONE_F_ONE_B: min(K - j, M)). HETPIPE: minibatches,
        with `in_flight` = N_m (`core.schedule.held_minibatches`).
        """
        if not self.synchronous:
            return tuple(held_minibatches(j, num_stages, in_flight) for j in range(num_stages))
        return _held(self, num_stages, in_flight)


class ActionKind(enum.Enum):
    FORWARD = "F"
    BACKWARD = "B"
    APPLY = "U"    # apply the minibatch's accumulated update on this stage


@dataclasses.dataclass(frozen=True)
class Action:
    kind: ActionKind
    stage: int
    micro_batch: int = -1   # -1 for APPLY

    def __repr__(self) -> str:
        m = "" if self.kind is ActionKind.APPLY else str(self.micro_batch)
        return f"{self.kind.value}{m}@{self.stage}"


Actions = tuple[tuple[Action, ...], ...]   # one ordered tuple per stage


def _check_sizes(num_stages: int, micro_batches: int) -> None:
    check_int("num_stages", num_stages, minimum=1)
    check_int("micro_batches", micro_batches, minimum=1)


def gpipe(num_stages: int, micro_batches: int) -> Actions:
    """GPipe: on every stage F0..F(M-1), B0..B(M-1), APPLY."""
    _check_sizes(num_stages, micro_batches)
    M = micro_batches
    return tuple(
        tuple([Action(ActionKind.FORWARD, j, m) for m in range(M)]
              + [Action(ActionKind.BACKWARD, j, m) for m in range(M)]
              + [Action(ActionKind.APPLY, j)])
        for j in range(num_stages))


def one_f_one_b(num_stages: int, micro_batches: int) -> Actions:
    """1F1B (PipeDream-flush): warm-up forwards, one forward one backward, cool-down."""
    _check_sizes(num_stages, micro_batches)
    K, M = num_stages, micro_batches
    out = []
    for j in range(K):
        warm = min(K - 1 - j, M)
        acts = [Action(ActionKind.FORWARD, j, m) for m in range(warm)]
        f, b = warm, 0
        while f < M:
            acts.append(Action(ActionKind.FORWARD, j, f))
            acts.append(Action(ActionKind.BACKWARD, j, b))
            f, b = f + 1, b + 1
        acts += [Action(ActionKind.BACKWARD, j, m) for m in range(b, M)]
        acts.append(Action(ActionKind.APPLY, j))
        out.append(tuple(acts))
    return tuple(out)


_BUILDERS: dict[Schedule, Callable[[int, int], Actions]] = {
    Schedule.GPIPE: gpipe, Schedule.ONE_F_ONE_B: one_f_one_b}


def actions(schedule: Schedule, num_stages: int, micro_batches: int) -> Actions:
    """The action lists of a synchronous `schedule`."""
    schedule = Schedule.parse(schedule)
    if not schedule.synchronous:
        raise ValueError("HETPIPE is asynchronous: its rules are in core/schedule.py, not an "
                         f"action list. Received: schedule={schedule}.")
    return _BUILDERS[schedule](num_stages, micro_batches)


@functools.lru_cache(maxsize=256)
def _held(schedule: Schedule, num_stages: int, micro_batches: int) -> tuple[int, ...]:
    return tuple(peak_alive(acts) for acts in actions(schedule, num_stages, micro_batches))


def bubble_fraction(num_stages: int, micro_batches: int) -> float:
    """GPipe's idle fraction of every stage with equal stage times: (K - 1) / (M + K - 1)."""
    _check_sizes(num_stages, micro_batches)
    return (num_stages - 1) / (micro_batches + num_stages - 1)


def peak_alive(stage_actions: Sequence[Action]) -> int:
    """Most micro-batches a stage holds at once (forwarded, not yet backwarded)."""
    alive = peak = 0
    for a in stage_actions:
        if a.kind is ActionKind.FORWARD:
            alive += 1
            peak = max(peak, alive)
        elif a.kind is ActionKind.BACKWARD:
            alive -= 1
    return peak


class ScheduleError(ValueError):
    """An action list that is malformed or cannot run (raised, never `assert`)."""


def _deps(a: Action, num_stages: int) -> list[Action]:
    if a.kind is ActionKind.FORWARD:
        return [Action(ActionKind.FORWARD, a.stage - 1, a.micro_batch)] if a.stage else []
    if a.kind is ActionKind.BACKWARD:
        d = [Action(ActionKind.FORWARD, a.stage, a.micro_batch)]
        if a.stage < num_stages - 1:
            d.append(Action(ActionKind.BACKWARD, a.stage + 1, a.micro_batch))
        return d
    return []


def check_actions(lists: Actions, num_stages: int, micro_batches: int,
                  max_alive: Sequence[int] | None = None) -> tuple[Action, ...]:
    """Raise ScheduleError unless `lists` is a valid synchronous schedule; return one order
    in which every action can run (a topological order that keeps each stage's list).

    Valid: one list per stage; each holds exactly one F and one B of every micro-batch and
    one APPLY, last; every dependency (module docstring) can be met without deadlock; and
    with `max_alive`, stage j never holds more than max_alive[j] micro-batches."""
    K, M = num_stages, micro_batches
    _check_sizes(K, M)
    if len(lists) != K:
        raise ScheduleError(f"One action list per stage is needed. Received: {len(lists)} "
                            f"lists for {K} stages.")
    for j, acts in enumerate(lists):
        want = ({Action(ActionKind.FORWARD, j, m) for m in range(M)}
                | {Action(ActionKind.BACKWARD, j, m) for m in range(M)}
                | {Action(ActionKind.APPLY, j)})
        if len(acts) != len(want) or set(acts) != want:
            raise ScheduleError(f"Stage {j} must run F and B of micro-batches 0..{M - 1} once "
                                f"each and one APPLY. Received: {list(acts)}.")
        if acts[-1].kind is not ActionKind.APPLY:
            raise ScheduleError(f"Stage {j} must APPLY last. Received: {list(acts)}.")
        if max_alive is not None and peak_alive(acts) > max_alive[j]:
            raise ScheduleError(f"Stage {j} holds {peak_alive(acts)} micro-batches at once, "
                                f"more than {max_alive[j]}. Received: {list(acts)}.")
    done: set[Action] = set()
    pos = [0] * K
    order: list[Action] = []
    while len(order) < sum(len(a) for a in lists):
        progressed = False
        for j in range(K):
            while pos[j] < len(lists[j]):
                a = lists[j][pos[j]]
                if any(d not in done for d in _deps(a, K)):
                    break
                done.add(a)
                order.append(a)
                pos[j] += 1
                progressed = True
        if not progressed:
            stuck = [lists[j][pos[j]] for j in range(K) if pos[j] < len(lists[j])]
            raise ScheduleError(f"The schedule deadlocks: every stage waits. Received: next "
                                f"actions {stuck}.")
    return tuple(order)


@dataclasses.dataclass(frozen=True)
class Timed:
    """An action placed in time by `replay`."""

    action: Action
    ready: float
    start: float
    end: float


def replay(lists: Actions, duration: Callable[[Action], float],
           transfer: Callable[[Action], float] = lambda a: 0.0,
           start: float = 0.0) -> list[Timed]:
    """Place each action at its earliest time: a stage runs its list in order, an action
    starts when its stage is free and its inputs arrived (the producing action's end plus
    `transfer(producer)`: F(j - 1, m)'s activations, B(j + 1, m)'s gradients). `duration`
    gives each action's seconds. Returns the timed actions in `check_actions` order."""
    K = len(lists)
    M = sum(1 for a in lists[0] if a.kind is ActionKind.FORWARD)
    order = check_actions(lists, K, M)
    end: dict[Action, float] = {}
    free = [start] * K
    out = []
    for a in order:
        ready = start
        for d in _deps(a, K):
            ready = max(ready, end[d] + (transfer(d) if d.stage != a.stage else 0.0))
        t0 = max(ready, free[a.stage])
        end[a] = t0 + duration(a)
        free[a.stage] = end[a]
        out.append(Timed(a, ready, t0, end[a]))
    return out
