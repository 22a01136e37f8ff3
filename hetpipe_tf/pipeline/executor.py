"""The one interface the strategy drives: one virtual worker's `PipelineRuntime` and the
`Coordinator` of several (hetpipe_tf/ps) are both Executors.

An Executor owns its threads (daemon threads, so an Executor nobody closed cannot keep the
interpreter alive; `close()` or leaving `with executor:` stops and joins them) and keeps
the first error of its threads, re-raised as itself by the next call.
"""

from __future__ import annotations

import abc
import contextlib
import threading
from typing import Any

STOP = object()   # the queue item that ends a thread of a ThreadedExecutor


def thread_scope() -> Any:
    """Entered by each thread of an Executor around its whole loop: in a process connected
    to a cluster, the thread's eager ops run in an executor of its own, so that a lost
    task's failed ops block only the threads that worked for it (a stage, wave sync or
    feeder of the VW it served), never the others' (`tf_executors.own_executor`,
    docs/cluster_jobs.md "Going on without a lost VW"). Local jobs keep TensorFlow's
    default executor: nothing to lose there."""
    from hetpipe_tf._shim import tf_executors
    from hetpipe_tf.cluster.roles import connected_to_cluster

    return tf_executors.own_executor() if connected_to_cluster() else contextlib.nullcontext()


class Executor(abc.ABC):
    _error: BaseException | None = None
    _closed: bool = False

    @abc.abstractmethod
    def submit(self, inputs: list, y: Any, sample_weight: Any) -> None:
        """Hand over one minibatch; returns once it is admitted (at most N_m in flight)."""

    @abc.abstractmethod
    def drain(self) -> None:
        """Wait until every submitted minibatch is applied; ends the run."""

    @abc.abstractmethod
    def abort(self) -> None:
        """Drop what was not committed, keep what was applied, end the run, clear errors."""

    @abc.abstractmethod
    def close(self) -> None:
        """Abort, then stop and join every thread."""

    @property
    @abc.abstractmethod
    def thread_ids(self) -> set[int]:
        """Idents of the threads this Executor owns."""

    @property
    def closed(self) -> bool:
        """Whether `close()` ran (the Executor takes no more work)."""
        return self._closed

    @property
    def error(self) -> BaseException | None:
        """The first exception a thread raised, if any."""
        return self._error

    def _raise_if_failed(self) -> None:
        if self._error is not None:
            raise self._error

    def __enter__(self):
        return self

    def __exit__(self, *exc) -> None:
        self.close()


class ThreadedExecutor(Executor):
    """The lifecycle every threaded Executor shares: its threads (`_threads`) each take work
    from a queue (`_queues`, and an optional `_updates` queue read by one more thread)
    until `STOP`; one condition `_cond` guards its state; a run ends by `_on_run_end`
    (`_run_open`). Subclasses implement `abort` (drop what is in flight, then `_end_run`)."""

    _updates = None
    vw = 0

    def _drop_uncommitted(self) -> None:
        """The pipelines' abort: start a new run id (queued tasks of the old run are skipped),
        wait for the tasks being worked on, forget the versions of what was not completed,
        clear a failure, end the run (needs `_run`, `_outstanding`, `submitted`,
        `completed`, `dropped`, `versions`, `_waiting`)."""
        with self._cond:
            self._run += 1
            self._cond.notify_all()
            while self._outstanding:
                self._cond.wait(0.05)
            self.dropped += self.submitted - self.completed
            for p in range(self.completed + 1, self.submitted + 1):
                self.versions.forget(p)
            self.submitted = self.completed
            self._waiting = None
            self._error = None
            self._cond.notify_all()
        self._end_run()

    def _end_run(self) -> None:
        # Closed only once `on_run_end` returned: an interrupt inside it leaves the run
        # open, so the abort that follows runs it again.
        if self._run_open and self._on_run_end is not None:
            self._on_run_end()
        with self._cond:
            self._run_open = False

    def close(self) -> None:
        """Abort, then stop and join the threads (minibatches in flight are dropped)."""
        if self._closed:
            return
        self.abort()
        self._closed = True
        for q in self._queues:
            q.put(STOP)
        if self._updates is not None:
            self._updates.put(STOP)
        for t in self._threads:
            if t is not threading.current_thread():
                t.join()

    def _fail(self, e: BaseException, where: str) -> None:
        """Keep the first error of a thread (named by `where`) and wake every waiter."""
        e.add_note(f"hetpipe_tf: raised by {where} of virtual worker {self.vw}.")
        with self._cond:
            if self._error is None:
                self._error = e
            self._cond.notify_all()
