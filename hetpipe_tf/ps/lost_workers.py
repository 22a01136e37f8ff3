"""A Coordinator going on without the VWs of a lost worker task.

Going on without a lost VW (`on_fault="continue"`, docs/cluster_jobs.md): the fault guard
calls `drop_lost(error)` when a worker task is lost. Its VWs are dropped: the servers
retire them (the global clock a minimum over the others), their feeders take no more
batches (a batch one was handed back goes to the others; the minibatches in their
pipelines and their unpushed wave are lost), runs skip them (`start_run`, `drain`,
`flush`, `abort`, `close`), `on_drop(vw)` leaves their optimizer state out of the merge and
seed, and a warning names the task, its address, the VWs and stages dropped. An error of a
VW whose task turns out lost is its consequence, not a failure of the job, and work on a
dropped VW that hangs (a frozen task) is left behind on a daemon thread.
"""

from __future__ import annotations

import logging
import threading
import time
from typing import Callable

from hetpipe_tf._shim import tf_executors
from hetpipe_tf.ps.call_workers import Call, CallWorkers
from hetpipe_tf.ps.faults import TaskLostError, remote_failure

logger = logging.getLogger(__name__)


class LostWorkers:
    """The Coordinator's part that drops lost VWs (module docstring). Uses the
    Coordinator's `runtimes`, `servers`, `guard`, `dropped`, `dropped_at`, `_lock`,
    `_queue`, `_feeding`, `_metrics_lock`, `_on_drop`, `_continues` and `_vw_calls` (VW ->
    its `CallWorkers`, empty at first)."""

    # Split batches (ps/split.py) cannot go on without a VW: its share has no taker.
    _can_drop = True

    @property
    def live(self) -> list[int]:
        """The VWs still training (not dropped)."""
        return [w for w in range(len(self.runtimes)) if w not in self.dropped]

    def drop_lost(self, error: TaskLostError) -> bool | str:
        """The guard's `on_lost` under on_fault='continue': drop the VWs of a lost worker
        task (module docstring). True when the job goes on; else why it cannot."""
        if error.use.parameter_server:
            return "w_global lives on the parameter servers"
        with self._lock:
            new = [w for w in error.virtual_workers if w not in self.dropped]
            left = [w for w in self.live if w not in new]
            if not left:
                return "no virtual worker would be left"
            for w in new:
                self.dropped[w] = error
                self.dropped_at[w] = time.monotonic()
            self._lock.notify_all()
        if new and self._metrics_lock is not None:
            self._metrics_lock.drop(set().union(*(self.runtimes[w].thread_ids for w in new)))
        for w in new:
            self.servers.retire(w)
            if self._on_drop is not None:
                self._on_drop(w)
        if new:
            stages = "; ".join(f"stage {s} of VW {vw} on {d}" for vw, s, d in error.stages)
            logger.warning(
                "hetpipe_tf: task %s at %s is lost: %s. on_fault='continue': dropped virtual "
                "worker(s) %s (%s; their minibatches in flight and unpushed wave are lost); "
                "training goes on with VW(s) %s, WSP clocks over them.", error.task,
                error.address, error.seen, new, stages, left)
        return True

    def _on_vw(self, w: int, fn: Callable, *args) -> None:
        """fn(*args), work on VW w: skipped once w is dropped; under on_fault='continue' run
        on a call worker of w's own (an eager executor per call) and left behind there when
        w is dropped meanwhile, and its error ignored when it comes from w's lost task."""
        if w in self.dropped:
            return None
        if not self._continues:
            return fn(*args)
        call = Call(fn, args)
        self._vw_workers(w).start(call)
        # A lost task blocks w's worker only; its `done` is set before it leaves the
        # executor, which waits for its remote ops (a frozen task's never end).
        while not call.done.wait(0.05):
            if w in self.dropped:
                return None
        if call.error is not None and not self._lost_with(w, call.error):
            raise call.error
        return None

    def _vw_workers(self, w: int) -> CallWorkers:
        """VW w's call workers (made when first needed), each call in its own executor."""
        with self._lock:
            workers = self._vw_calls
            if w not in workers:
                workers[w] = CallWorkers(f"hetpipe-vw{w}-call", on_start=_nothing,
                                         around=tf_executors.own_executor, max_idle=1)
            return workers[w]

    def _close_vw_workers(self) -> None:
        """End the VWs' idle call workers (one stuck in a lost task stays behind)."""
        with self._lock:
            workers = list(self._vw_calls.values())
        for cw in workers:
            cw.close()

    def _lost_with(self, w: int, e: BaseException) -> bool:
        """Whether VW w's error `e` comes from a lost task that dropped w (probed now)."""
        if w in self.dropped:
            return True
        if self._continues and remote_failure(e):
            self.guard.confirm(self.guard.options.timeout_s)
        return w in self.dropped

    def _wait_taken(self) -> None:
        """Until every queued batch was taken and handed on (`queue.join`), leaving out the
        ones dropped VWs hold (stuck in their lost task)."""
        if not self._continues:
            return self._queue.join()
        q = self._queue
        while True:
            with self._lock:
                stuck = sum(self._feeding[w] for w in self.dropped)
            with q.all_tasks_done:
                if q.unfinished_tasks <= stuck:
                    return
                q.all_tasks_done.wait(0.05)


class DroppableLock:
    """A mutex whose holder can be let go of: `drop(idents)` frees it if one of those threads
    holds it and keeps them from taking it again (a dropped VW's stage thread stuck in a
    remote op of its frozen task; it stays behind, the other VWs go on)."""

    def __init__(self) -> None:
        self._cond = threading.Condition()
        self._owner: int | None = None
        self._dropped: set[int] = set()

    def __enter__(self) -> None:
        me = threading.get_ident()
        with self._cond:
            while self._owner is not None or me in self._dropped:
                self._cond.wait()
            self._owner = me

    def __exit__(self, *exc) -> None:
        with self._cond:
            if self._owner == threading.get_ident():   # not let go of meanwhile
                self._owner = None
                self._cond.notify_all()

    def drop(self, idents: set) -> None:
        with self._cond:
            self._dropped |= set(idents)
            if self._owner in self._dropped:
                self._owner = None
                self._cond.notify_all()


def _nothing() -> None:
    """A call worker's `on_start` that marks nothing."""
