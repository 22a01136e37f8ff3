"""One virtual worker's pipeline with no threads: its tasks run when the caller says.

`OrderedRuntime` is the `PipelineRuntime` (the same stages, weight versions, commit and
metrics code: the numerics of the threaded runtime) whose stage queues have no thread: a
virtual-clock executor (`hetpipe_tf.ps.virtual_coordinator`) calls `run(j, kind, p)` for
each stage task in the order the cluster model gives, on its own thread, one at a time.

What the threads did happens here at fixed points: a stage applies its part of a committed
minibatch at the commit (before any later task of that stage, as its FIFO queue does),
and a committed minibatch is handed to `on_commit(mb)` instead of the updater thread; the
executor runs the wave hook and calls `complete(mb)` when the minibatch counts as complete
(at once, or when the pull that gates the next wave arrived).
"""

from __future__ import annotations

import collections
from typing import Callable

from hetpipe_tf.core.schedule import TaskKind
from hetpipe_tf.pipeline.runtime import _APPLY, Minibatch, PipelineRuntime


class _Queue:
    """A stage's task queue without a thread (FIFO; `take` finds a task by its id)."""

    def __init__(self) -> None:
        self.items: collections.deque = collections.deque()

    def put(self, item) -> None:
        self.items.append(item)

    def take(self, kind: TaskKind, p: int):
        for i, item in enumerate(self.items):
            if item[0] is kind and item[1].id == p:
                del self.items[i]
                return item
        return None


class OrderedRuntime(PipelineRuntime):
    """`PipelineRuntime(..., update_thread=True)` run task by task by its caller.

    on_commit(mb): called when minibatch mb was applied on every stage (its wave hook is
      the caller's); the caller then calls `complete(mb)`.
    Other arguments as `PipelineRuntime`'s.
    """

    def __init__(self, *args, on_commit: Callable[[Minibatch], None], **kwargs):
        self._on_commit = on_commit
        kwargs["update_thread"] = True
        super().__init__(*args, **kwargs)

    def _start_workers(self, loops, updater=None) -> None:
        self._workers = None
        self._queues = [_Queue() for _ in loops]
        self._updates = _Queue()

    @property
    def thread_ids(self) -> set[int]:
        return set()

    def has_task(self, j: int, kind: TaskKind, p: int) -> bool:
        return any(item[0] is kind and item[1].id == p for item in self._queues[j].items)

    def run(self, j: int, kind: TaskKind, p: int) -> None:
        """Run stage j's task `kind` of minibatch p now (it must be queued: its input is
        there). A failure is kept and re-raised, as a stage thread's."""
        item = self._queues[j].take(kind, p)
        if item is None:
            raise RuntimeError(
                f"The virtual order runs a task that is not ready. Received: stage {j} "
                f"{kind.value} of minibatch {p} of virtual worker {self.vw}; this is a bug, "
                "please report it.")
        try:
            self._execute(j, item)
        except BaseException as e:  # noqa: BLE001 - kept and re-raised as the threads'
            self._fail(e, self._where(j, item))
            raise
        finally:
            self._done()

    def _put(self, q, item) -> None:
        with self._cond:
            self._outstanding += 1
        if q is self._updates:     # committed: the caller's wave hook
            self._on_commit(item)
        elif item[0] == _APPLY:   # a stage's part of the commit, now (FIFO before later tasks)
            j = self._queues.index(q)
            try:
                self._execute(j, item)
            finally:
                self._done()
        else:
            q.put(item)

    def complete(self, mb: Minibatch) -> None:
        """Minibatch mb counts as complete (after its wave hook)."""
        self._completed(mb)
        self._done()

    def abort(self) -> None:
        """Drop the queued tasks (never run) and what was not committed."""
        with self._cond:
            for q in self._queues:
                self._outstanding -= len(q.items)
                q.items.clear()
        self._drop_uncommitted()

    def close(self) -> None:
        if not self._closed:
            self.abort()
            self._closed = True
