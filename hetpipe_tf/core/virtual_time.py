"""The virtual clock's order: actions with virtual times (pure values, no TensorFlow).

A cluster model (`hetpipe_tf.sim.timeline`) gives, for a cluster and the VWs' plans, every
action of HetPipe's WSP training with the virtual time at which it happens:

* TASK: a stage task (forward, backward, or the last stage's forward+backward) of one
  minibatch of one VW, taken at its start (it ends at `end`);
* PUSH: VW v's aggregated update of wave c lands at the parameter servers (the VW's clock
  becomes c + 1);
* PULL_READ: VW v's pull after wave c is granted: the servers' weights are read;
* PULL_DONE: the pulled weights arrived (the minibatches that need them may start).

A virtual-clock executor (`hetpipe_tf.ps.virtual_coordinator`) runs exactly these actions in
this order. At equal times the kinds keep the causal order: pushes land before pulls read,
pulls arrive before the tasks they gate start.
"""

from __future__ import annotations

import dataclasses
import enum
from typing import Sequence

from hetpipe_tf.core.schedule import TaskKind


class ActionKind(enum.IntEnum):
    """What an action does; the value orders actions at equal times."""

    PUSH = 0
    PULL_READ = 1
    PULL_DONE = 2
    TASK = 3


@dataclasses.dataclass(frozen=True)
class Action:
    """One step of the virtual order. `wave` is set for pushes and pulls; `stage`,
    `minibatch` (1-based, per VW) and `task` for tasks; `end` is when a task ends (the time
    itself for the others)."""

    time: float
    kind: ActionKind
    vw: int
    wave: int = -1
    stage: int = -1
    minibatch: int = 0
    task: TaskKind | None = None
    end: float = 0.0

    def key(self) -> tuple:
        """The sort key: time, then the causal kind, then VW, stage, minibatch, wave."""
        return (self.time, int(self.kind), self.vw, self.stage, self.minibatch, self.wave)

    @property
    def entry(self) -> bool:
        """Whether this is a minibatch's first task (it enters stage 0 then)."""
        return (self.kind is ActionKind.TASK and self.stage == 0
                and self.task is not TaskKind.BACKWARD)


def ordered(actions: Sequence[Action]) -> tuple[Action, ...]:
    """`actions` in the virtual clock's order."""
    return tuple(sorted(actions, key=Action.key))


def batch_order(actions: Sequence[Action]) -> tuple[tuple[int, int], ...]:
    """(VW, minibatch) of every minibatch in the order they enter stage 0: the k-th batch
    of a run goes to that VW as that minibatch (a fast VW takes more batches)."""
    return tuple((a.vw, a.minibatch) for a in actions if a.entry)
