"""Long-lived threads that run a `FaultGuard`'s calls (hetpipe_tf/ps/faults.py).

The guard runs each call of the coordinator (submit once a minibatch, drain, abort,
close) on a thread other than its caller's, so that the caller can stop waiting once a
task is lost. `CallWorkers` keeps those threads: each waits on a queue of its own, an idle
one takes the next call, and it is idle again once the call has ended. A call that never
ends (a remote op of a frozen task: TensorFlow has no deadline on eager remote ops) keeps
its worker for good; the worker is never idle again, so later calls go to another idle
worker or a new one, and it stays behind as a daemon thread. Several callers at once each
get a worker of their own; at most `max_idle` workers wait between calls.

`around` (optional) is a context manager entered around each call on its worker (under
`FaultPolicy.CONTINUE`, an eager executor of the call's own). The call's end is signalled
inside it: leaving it may wait for a frozen task's op forever, and the caller must not.
So a caller's next call can come while its last worker is still leaving `around`: it
waits up to `grace_s` for a worker that began leaving less than `grace_s` ago (leaving
takes microseconds unless a frozen task holds it), then takes a new worker.

`close()` ends the idle workers and joins them and those ending after their last call;
every busy one ends once its call ends. A call after `close()` runs on a worker that ends
with it.
"""

from __future__ import annotations

import queue
import threading
import time
from typing import Callable, ContextManager


class Call:
    """One call handed to a worker: `value` or `error` once `done` is set."""

    __slots__ = ("fn", "args", "value", "error", "done")

    def __init__(self, fn: Callable, args: tuple):
        self.fn, self.args = fn, args
        self.value = self.error = None
        self.done = threading.Event()

    def run(self) -> None:
        try:
            self.value = self.fn(*self.args)
        except BaseException as e:  # noqa: BLE001 - handed to the caller
            self.error = e


class CallWorkers:
    """Worker threads named `name` that run `Call`s (module docstring). `on_start()` runs
    first on each worker's thread (e.g. to mark the thread as a guarded call's)."""

    def __init__(self, name: str, on_start: Callable[[], None],
                 around: Callable[[], ContextManager] | None = None, max_idle: int = 2,
                 grace_s: float = 0.1):
        self.name = name
        self.max_idle = max_idle
        self.grace_s = grace_s
        self._on_start = on_start
        self._around = around
        self._cond = threading.Condition()
        self._idle: list[tuple[queue.SimpleQueue, threading.Thread]] = []
        self._leaving: dict[int, float] = {}   # thread ident -> when it began leaving `around`
        self._ending: list[threading.Thread] = []   # workers that end after their call
        self._closed = False

    def start(self, call: Call) -> None:
        """Hand `call` to an idle worker (one leaving `around` within the grace), or to a
        new one."""
        with self._cond:
            while not self._idle and not self._closed:
                now = time.monotonic()
                until = max((t + self.grace_s for t in self._leaving.values()), default=now)
                if until <= now:
                    break
                self._cond.wait(until - now)
            worker = self._idle.pop() if self._idle else None
        if worker is not None:
            worker[0].put(call)
            return
        jobs: queue.SimpleQueue = queue.SimpleQueue()
        jobs.put(call)
        threading.Thread(target=self._serve, args=(jobs,), daemon=True, name=self.name).start()

    def _serve(self, jobs: queue.SimpleQueue) -> None:
        self._on_start()
        while True:
            call = jobs.get()
            if call is None:
                return
            if self._around is None:
                call.run()
                idle = self._back(jobs)   # before `done`: the caller's next call finds it
                call.done.set()
            else:
                try:
                    with self._around():
                        call.run()
                        with self._cond:
                            self._leaving[threading.get_ident()] = time.monotonic()
                        call.done.set()
                except BaseException as e:  # noqa: BLE001 - entering or leaving `around`
                    with self._cond:   # the thread's state is unknown: it ends
                        self._leaving.pop(threading.get_ident(), None)
                        self._ending_now()
                        self._cond.notify_all()
                    if not call.done.is_set():
                        call.error = e
                        call.done.set()
                    return
                idle = self._back(jobs)
            if not idle:
                return

    def _back(self, jobs: queue.SimpleQueue) -> bool:
        """Make this thread, the worker of `jobs`, idle again; False when it is to end
        instead (closed, or enough idle workers)."""
        with self._cond:
            self._leaving.pop(threading.get_ident(), None)
            self._cond.notify_all()
            if self._closed or len(self._idle) >= self.max_idle:
                self._ending_now()
                return False
            self._idle.append((jobs, threading.current_thread()))
            return True

    def _ending_now(self) -> None:
        """This worker ends once its call is signalled (call under `_cond`): `close` joins
        it, so none is left running after `close` but a stuck one."""
        self._ending = [t for t in self._ending if t.is_alive()]
        self._ending.append(threading.current_thread())

    def close(self, timeout_s: float = 5.0) -> None:
        with self._cond:
            self._closed = True
            idle, self._idle = self._idle, []
            ending, self._ending = self._ending, []
            self._cond.notify_all()
        for jobs, _ in idle:
            jobs.put(None)
        for thread in [t for _, t in idle] + ending:
            if thread is not threading.current_thread():
                thread.join(timeout_s)
