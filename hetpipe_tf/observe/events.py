"""Stage-task events of a pipeline, from the runtime or the simulator, in one shape.

Both `hetpipe_tf.pipeline.runtime.PipelineRuntime.trace` and the simulator emit events with
`.task.stage`, `.task.minibatch`, `.task.kind` (a `TaskKind` or its value/name), `.start`
and `.end` (seconds), and possibly a virtual-worker id `.vw` (on the event or its task).
`normalize` turns any iterable of such objects (duck-typed; flat events with `stage`,
`minibatch`, `kind` on the event itself also work) into `StageEvent`s; everything in
`hetpipe_tf.observe` works on those, so real and simulated runs are drawn and measured alike.
"""

from __future__ import annotations

import dataclasses
from typing import Any, Iterable

# TaskKind values and names -> the short kind used in labels ("F3", "B3", "FB3").
_KIND_SHORT = {
    "fwd": "F", "forward": "F", "f": "F",
    "bwd": "B", "backward": "B", "b": "B",
    "fwd+bwd": "FB", "forward_backward": "FB", "fb": "FB",
}
KIND_NAMES = {"F": "forward", "B": "backward", "FB": "forward+backward"}


@dataclasses.dataclass(frozen=True, order=True)
class StageEvent:
    """One stage task of one virtual worker that ran from `start` to `end` (seconds)."""

    start: float
    end: float
    vw: int
    stage: int
    minibatch: int
    kind: str  # "F", "B" or "FB"

    @property
    def duration(self) -> float:
        return self.end - self.start

    @property
    def name(self) -> str:
        return f"{self.kind}{self.minibatch}"


def short_kind(kind: Any) -> str:
    """"F", "B" or "FB" for a TaskKind, its value ("fwd", "bwd", "fwd+bwd") or its name."""
    for candidate in (getattr(kind, "value", None), getattr(kind, "name", None), kind):
        if isinstance(candidate, str) and candidate.lower() in _KIND_SHORT:
            return _KIND_SHORT[candidate.lower()]
    raise ValueError(
        "Unknown task kind. Received: kind=%r; expected a hetpipe_tf.core.schedule."
        "TaskKind or one of 'fwd', 'bwd', 'fwd+bwd'." % (kind,))


def normalize(events: Iterable[Any], vw: int | None = None) -> list[StageEvent]:
    """`StageEvent`s of `events`, sorted by start time.

    `vw`: the virtual-worker id of events that carry none (default 0); events that carry a
    `vw` (on the event or its task) keep theirs.
    """
    out = []
    for e in events:
        if isinstance(e, StageEvent):
            out.append(e)
            continue
        task = getattr(e, "task", e)
        own_vw = getattr(e, "vw", getattr(task, "vw", None))
        try:
            ev = StageEvent(start=float(e.start), end=float(e.end),
                            vw=int(own_vw if own_vw is not None else (vw or 0)),
                            stage=int(task.stage), minibatch=int(task.minibatch),
                            kind=short_kind(task.kind))
        except AttributeError as err:
            raise TypeError(
                "An event needs .task.stage, .task.minibatch, .task.kind, .start and .end "
                f"(or the task fields on the event itself). Received: {e!r}; pass the "
                "runtime's trace or the simulator's events.") from err
        if ev.end < ev.start:
            raise ValueError(f"An event ends before it starts. Received: {e!r}.")
        out.append(ev)
    out.sort()
    return out


def emulated_stages(plan) -> dict[int, float]:
    """Stage index -> emulated speed factor, for the stages of `plan` that are emulated."""
    if plan is None:
        return {}
    return {s.index: float(s.emulated_speed_factor) for s in plan.stages
            if float(getattr(s, "emulated_speed_factor", 1.0)) != 1.0}
