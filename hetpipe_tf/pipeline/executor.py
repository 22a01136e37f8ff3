"""The one interface the strategy drives: one virtual worker's `PipelineRuntime` and the
`Coordinator` of several (hetpipe_tf/ps) are both Executors.

An Executor owns its threads (`workers.Workers`: daemon threads, so an Executor nobody
closed cannot keep the interpreter alive; `close()` or leaving `with executor:` stops and
joins them) and keeps the first error of its threads, re-raised as itself by the next call.
"""

from __future__ import annotations

import abc
import threading
from typing import Any, Callable, Sequence

from hetpipe_tf.pipeline.window import Window
from hetpipe_tf.pipeline.workers import STOP, Loop, Workers, thread_scope

__all__ = ["Executor", "ThreadedExecutor", "PipelineError", "STOP", "thread_scope"]


class PipelineError(RuntimeError):
    """The pipeline cannot take work: it was closed."""


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
    """The lifecycle every threaded Executor shares: its threads (`_workers`: one per stage
    or device, each taking work from its queue in `_queues`, and an optional updater reading
    `_updates`) until `STOP`; one condition `_cond` guards its state; `_outstanding` counts
    the tasks queued or being worked on; a run ends by `_on_run_end` (`_run_open`).
    Subclasses implement `abort` (drop what is in flight, then `_end_run`)."""

    _updates = None
    _workers: Workers | None = None
    vw = 0

    def _init_pipeline(self, stages: Sequence[Any], weights: Any, *, vw: int, history: int,
                       plan: Any, update_metrics: Callable, metrics_lock: Any,
                       after_apply: Callable | None, on_run_start: Callable | None,
                       on_run_end: Callable | None, trace: bool) -> None:
        """The state every pipeline of one VW keeps (`PipelineRuntime`, `SyncPipelineRuntime`;
        arguments as documented there); the subclass then starts its workers."""
        self.stages = list(stages)
        self.plan = plan  # the partitioner Plan the stages come from (reports, monitors)
        self.vw = vw
        self.history = history
        if len(weights.stages) != len(self.stages):
            raise ValueError(f"One StageWeights per stage is needed. Received: "
                             f"{len(weights.stages)} for {len(self.stages)} stages.")
        self.versions = weights
        self._after_apply = after_apply
        # Called when a run opens / after it closed (one VW: the optimizer state moves
        # between the stages' optimizers and the model's there).
        self._on_run_start = on_run_start
        self._on_run_end = on_run_end
        self._update_metrics = update_metrics
        # Several virtual workers update the model's shared metrics: one at a time, so
        # their update is a call of its own under the shared lock. One virtual worker: the
        # last stage updates them inside its compiled task (one call less per minibatch).
        self._fuse_metrics = metrics_lock is None
        self._metrics_lock = metrics_lock or threading.Lock()
        self._cond = threading.Condition()
        self.submitted = 0
        self.completed = 0
        self._waiting = None   # admitted, starts when p - N_m completes
        self.run_starts = Window(history)
        self._run_open = False
        self._run = 0
        # Tasks and updates queued or being worked on (counted from `_put` to their end, so an
        # abort never misses one a thread has just taken off its queue).
        self._outstanding = 0
        self._closed = False
        self._error = None
        self.logs: dict | None = None
        self.logs_time = 0.0
        self.trace_enabled = trace
        self.trace = Window(history)
        self.completions = Window(history)
        self.update_s = Window(history)
        self.dropped = 0        # minibatches an abort dropped without applying them

    def _start_workers(self, loops: Sequence[Loop], updater: Loop | None = None) -> None:
        """Start one thread per loop (queues `_queues`) and the updater's (`_updates`)."""
        every = list(loops) + ([updater] if updater is not None else [])
        self._workers = Workers(every, self._fail)
        self._queues = self._workers.queues[:len(loops)]
        self._updates = self._workers.queues[len(loops)] if updater is not None else None

    @property
    def thread_ids(self) -> set[int]:
        return self._workers.ids

    # --- a pipeline's minibatches: admission, a one-place waiting room, completion -------
    def _admit(self) -> int:
        """Under `_cond`, for `submit`: refuse after a failure or `close`, open a run if none
        is open, wait while N_m minibatches run and one waits; the new minibatch's id
        (started by `_start_or_wait`)."""
        self._raise_if_failed()
        if self._closed:
            raise PipelineError(f"The pipeline of virtual worker {self.vw} is closed.")
        if not self._run_open:
            if self._on_run_start is not None:
                self._on_run_start()
            self._run_open = True
            self.run_starts.append(self.submitted + 1)
            self.versions.start_run(self.submitted + 1)
        while self.submitted - self.completed > self.n_m and self._error is None:
            self._cond.wait()   # N_m in flight and one waiting already
        self._raise_if_failed()
        self.submitted += 1
        return self.submitted

    def _start_or_wait(self, mb: Any) -> None:
        """Under `_cond`: start `mb` now, or keep it in the waiting room until `_completed`
        of minibatch mb.id - N_m starts it."""
        if mb.id - self.completed > self.n_m:
            self._waiting = mb
        else:
            self._start(mb)

    def _completed(self, mb: Any) -> None:
        """Minibatch `mb` is complete: start the waiting one if it may start now."""
        with self._cond:
            self.completed = mb.id
            self.completions.append(mb.id)
            waiting = self._waiting
            if (waiting is not None and waiting.run == self._run
                    and waiting.id - self.completed <= self.n_m):
                self._waiting = None
                self._start(waiting)
            self._cond.notify_all()

    def wait_for_room(self) -> None:
        """Block until a minibatch can be submitted without waiting (fewer than N_m in
        flight, so its weight version exists)."""
        with self._cond:
            while self.submitted - self.completed >= self.n_m and self._error is None:
                self._cond.wait()
            self._raise_if_failed()

    def drain(self) -> None:
        """Wait until every submitted minibatch completed, then end the run."""
        with self._cond:
            while self.completed < self.submitted and self._error is None:
                self._cond.wait()
            self._raise_if_failed()
        self._end_run()

    def _put(self, q, item) -> None:
        with self._cond:
            self._outstanding += 1
        q.put(item)

    def _done(self, item: Any = None) -> None:
        with self._cond:
            self._outstanding -= 1
            if not self._outstanding:   # only an abort waits for this
                self._cond.notify_all()

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
        if self._workers is not None:
            self._workers.close()

    def _note(self, where: str) -> str:
        return f"hetpipe_tf: raised by {where} of virtual worker {self.vw}."

    def _fail(self, e: BaseException, where: str) -> None:
        """Keep the first error of a thread (named by `where`) and wake every waiter."""
        e.add_note(self._note(where))
        with self._cond:
            if self._error is None:
                self._error = e
            self._cond.notify_all()
