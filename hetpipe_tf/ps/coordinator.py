"""Drives several virtual workers (VWs) through the parameter servers under WSP.

The chief process owns the parameter servers' variables and every VW's pipeline runtime
(ClusterCoordinator's model: Keras 3 cannot run ParameterServerStrategy, and eager
variables are never shared between client processes).

Input: each batch Keras hands the strategy is one minibatch of ONE virtual worker. A
feeder thread per VW takes the next batch from a shared queue as soon as its VW can start
a minibatch (fewer than N_m in flight), so a fast VW takes more batches than a slow one
(data parallelism over unequal VWs) and a VW held back by the clock distance D takes none.
`assignment[w]` lists the step numbers (0-based, in Keras' order) VW w took.

Runs: the first `submit` after a drain starts a run: w_global := the model's variables
(a callback or the user may have changed them), every VW pulls it, clocks restart at 0.
`drain` (end of an epoch, before evaluate/predict, when Keras reads metrics) waits until
every queued batch was taken, ends the run at the servers (a VW waiting for a wave that
will never come, because the data ran out, stops waiting: its remaining minibatches are
already running), drains every VW, pushes unfinished waves (`WaveSync.flush`) and copies
w_global into the model's variables. Deadlock-free while batches flow: the slowest VW
never waits for others (every wave it needs, all VWs have pushed).

`abort` (an exception or interrupt in `fit`) stops taking batches, drops the queued ones and
every minibatch in flight without applying it, pushes what each VW did apply and closes the
run as `drain` does: the model then holds the last applied state. `on_run_start` /
`on_run_end` are called when a run opens / after it closed (the strategy moves the
optimizers' state there, hetpipe_tf/strategy/training_state.py). `close` (or leaving
`with coordinator:`) aborts and joins every thread.

Going on without a lost VW (`on_fault="continue"`): `lost_workers.LostWorkers`, a base
of the Coordinator.
"""

from __future__ import annotations

import queue
import threading
from typing import Any, Callable, Sequence

from hetpipe_tf._shim import keras_optimizer
from hetpipe_tf.pipeline.executor import Executor, thread_scope
from hetpipe_tf.pipeline.window import DEFAULT_HISTORY, Window
from hetpipe_tf.ps.faults import FaultPolicy, TaskLostError
from hetpipe_tf.ps.lost_workers import DroppableLock, LostWorkers
from hetpipe_tf.ps.server import ParameterServers, VariableCopy
from hetpipe_tf.ps.wave_sync import WaveSync

_STOP = object()


class Coordinator(LostWorkers, Executor):
    """Dispatch, runs and the end-of-run protocol of several VWs.

    Args:
      runtimes: one `PipelineRuntime` per VW (built with `update_thread=True` and
        `after_apply=syncs[w].after_apply`).
      syncs: the VWs' `WaveSync`s, same order.
      servers: the parameter servers (variables in `model_variables` order).
      model_variables: the model's versioned variables, mirrored from w_global after runs.
      on_run_start, on_run_end: called when a run opens and after it closed.
      history: how many step numbers `assignment` keeps per VW.
      guard: the `hetpipe_tf.ps.faults.FaultGuard` of a cluster job (None locally).
      on_drop: called with a VW's index when it is dropped (module docstring).
    """

    def __init__(self, runtimes: Sequence[Any], syncs: Sequence[WaveSync],
                 servers: ParameterServers, model_variables: Sequence[Any],
                 on_run_start: Callable[[], None] | None = None,
                 on_run_end: Callable[[], None] | None = None,
                 history: int = DEFAULT_HISTORY, guard=None,
                 on_drop: Callable[[int], None] | None = None,
                 metrics_lock: "DroppableLock | None" = None):
        if not (len(runtimes) == len(syncs) == servers.num_workers):
            raise ValueError(f"One runtime and one WaveSync per worker are needed. Received: "
                             f"{len(runtimes)} runtimes, {len(syncs)} syncs, "
                             f"{servers.num_workers} workers.")
        self.runtimes = list(runtimes)
        self.syncs = list(syncs)
        self.servers = servers
        self.model_variables = list(model_variables)
        # A run's start and end move w_global and the model's variables in one call each.
        handles = [keras_optimizer.variable_handle(v) for v in self.model_variables]
        self._to_servers = VariableCopy(handles, servers.variables)
        self._from_servers = VariableCopy(servers.variables, handles)
        self.assignment = [Window(history) for _ in self.runtimes]
        self.run_starts = Window(history)  # step number of each run's first batch
        self._on_run_start = on_run_start
        self._on_run_end = on_run_end
        self._queue = self._new_queue()
        self._run_open = False
        self._steps = 0
        self._error: BaseException | None = None
        self._lock = threading.Condition()
        self._aborting = False
        self._generation = 0    # an abort starts a new one: batches of older ones are dropped
        self._feeding = [0] * len(self.runtimes)   # feeder w handing a batch to VW w now
        self._closed = False
        # Cluster jobs: a hetpipe_tf.ps.faults.FaultGuard runs the calls below so that a
        # lost task ends them within its bound (docs/cluster_jobs.md); None locally.
        self.guard = guard
        self.dropped: dict[int, TaskLostError] = {}   # VW -> the loss that dropped it
        self.dropped_at: dict[int, float] = {}   # VW -> time.monotonic() of the drop
        self._on_drop = on_drop
        self._vw_calls: dict = {}   # VW -> its CallWorkers under on_fault='continue'
        # The VWs' shared metrics lock (strategy/virtual_workers.py), held by a stage thread
        # across remote ops (its metrics update, its logs read): `drop_lost` lets go of it
        # for a dropped VW stuck in its frozen task (SIGSTOP), else the others wait forever.
        self._metrics_lock = metrics_lock
        self._continues = (guard is not None and guard.options.policy is FaultPolicy.CONTINUE
                           and self._can_drop)
        if self._continues:
            guard.on_lost = self.drop_lost
            servers.settle_pushes = True
        self._feeders = [threading.Thread(target=self._feed, args=(w,), daemon=True,
                                          name=f"hetpipe-feeder-{w}")
                         for w in range(len(self.runtimes))]
        for t in self._feeders:
            t.start()

    @property
    def thread_ids(self) -> set[int]:
        ids = {t.ident for t in self._feeders}
        for rt in self.runtimes:
            ids |= rt.thread_ids
        return ids

    @property
    def error(self) -> BaseException | None:
        """The failure to report: a lost task's TaskLostError first (the stage errors it
        caused are its consequences)."""
        if self.guard is not None and self.guard.fatal is not None:
            return self.guard.fatal
        return self._error

    @property
    def logs(self) -> dict | None:
        """The metrics as of the most recently completed minibatch of any VW."""
        done = [rt for rt in self.runtimes if rt.logs is not None]
        return max(done, key=lambda rt: rt.logs_time).logs if done else None

    # --- called by the strategy ----------------------------------------------------------
    def submit(self, inputs: list, y, sample_weight) -> None:
        if self.guard is not None and not self.guard.inside():
            return self.guard.call(self.submit, inputs, y, sample_weight)
        self._raise_if_failed()
        if self._closed:
            raise RuntimeError("The coordinator of the virtual workers is closed.")
        if not self._run_open:
            self._start_run()
            if self._on_run_start is not None:
                self._on_run_start()
        self._enqueue(self._steps, inputs, y, sample_weight)
        self._steps += 1

    def drain(self) -> None:
        if self.guard is not None and not self.guard.inside():
            return self.guard.call(self.drain)
        if not self._run_open:
            self._raise_if_failed()
            return
        self._wait_taken()
        self.servers.end_run()
        for w, rt in enumerate(self.runtimes):
            self._on_vw(w, rt.drain)
        self._close_run()
        self._raise_if_failed()

    def _close_run(self) -> None:
        """Every VW is idle: push what each applied, mirror w_global into the model."""
        for w, s in enumerate(self.syncs):
            self._on_vw(w, s.flush)
        self.servers.pull_into(self._from_servers)
        self._run_open = False
        if self._on_run_end is not None:
            self._on_run_end()

    def abort(self) -> None:
        """Drop queued batches and minibatches in flight, keep what was applied, close the
        run (module docstring). Clears a failure: the next `submit` starts afresh."""
        if self.guard is not None and not self.guard.inside():
            return self.guard.call_or_abandon(self.abort, self._abandon)
        with self._lock:
            self._aborting = True
            self._generation += 1
        try:
            while True:  # queued batches: never handed to a VW
                try:
                    self._queue.get_nowait()
                    self._queue.task_done()
                except queue.Empty:
                    break
            self.servers.end_run()  # no VW may keep waiting for a wave
            with self._lock:
                while any(self._feeding[w] for w in self.live):
                    self._lock.wait(0.05)
            for w, rt in enumerate(self.runtimes):
                self._on_vw(w, rt.abort)
            if self._run_open:
                self._close_run()
        finally:
            with self._lock:
                self._aborting = False
                self._error = None

    def close(self) -> None:
        """Abort, then stop and join every thread."""
        if self._closed:
            return
        if self.guard is not None:
            self.guard.close()
            if self.guard.fatal is not None:
                return self._abandon(close=True)
        self.abort()
        self._closed = True
        live = self.live
        for _ in live:
            self._queue.put(_STOP)
        for w in live:
            self._feeders[w].join()
        for w, rt in enumerate(self.runtimes):
            if w in self.dropped:   # may hang in its lost task: left behind
                threading.Thread(target=rt.close, daemon=True).start()
            else:
                rt.close()
        self._close_vw_workers()

    def _abandon(self, close: bool = False) -> None:
        """A task is lost (the guard's fatal error): stop taking batches and leave the run
        without remote work (the model keeps w_global as of the last run's end); threads
        stuck in remote ops stay behind (daemons). `close`: also stop what can stop."""
        with self._lock:
            self._aborting = True
            self._generation += 1
        while True:
            try:
                self._queue.get_nowait()
                self._queue.task_done()
            except queue.Empty:
                break
        self._run_open = False
        if close:
            self._closed = True
            for rt in self.runtimes:
                threading.Thread(target=rt.close, daemon=True).start()
            self._close_vw_workers()

    # --- internals -------------------------------------------------------------------
    def _start_run(self) -> None:
        self.servers.start_run(self._to_servers)
        for w, (rt, s) in enumerate(zip(self.runtimes, self.syncs)):
            self._on_vw(w, s.start_run, rt.submitted + 1)
        self.run_starts.append(self._steps)
        self._run_open = True

    def _new_queue(self):
        """Where `submit` puts batches: one queue all feeders take from (a fast VW takes
        more batches). ps/split.py: one queue per VW."""
        return queue.Queue(maxsize=1)

    def _enqueue(self, step: int, inputs: list, y, sample_weight) -> None:
        self._queue.put((self._generation, step, inputs, y, sample_weight))

    def _source(self, w: int) -> queue.Queue:
        """The queue VW w's feeder takes from."""
        return self._queue

    def _feed(self, w: int) -> None:
        with thread_scope():   # its own eager executor in a cluster job (pipeline/executor.py)
            self._feed_loop(w)

    def _feed_loop(self, w: int) -> None:
        rt = self.runtimes[w]
        source = self._source(w)
        while True:
            if self._error is None and w not in self.dropped:
                try:
                    rt.wait_for_room()
                except BaseException as e:  # noqa: BLE001 - re-raised by submit/drain
                    self._fail(e, w)
            item = source.get()
            if w in self.dropped:   # hand the batch (or stop marker) to the others
                source.put(item)
                source.task_done()
                return
            if item is _STOP:
                source.task_done()
                return
            with self._lock:
                take = (self._error is None and not self._aborting
                        and item[0] == self._generation)
                if take:
                    self._feeding[w] += 1
            try:
                if take:
                    _, step, inputs, y, sw, *scale = item   # scale: a split batch's share
                    self.assignment[w].append(step)
                    rt.submit(inputs, y, sw, *scale)
            except BaseException as e:  # noqa: BLE001 - re-raised by submit/drain
                self._fail(e, w)
            finally:
                if take:
                    with self._lock:
                        self._feeding[w] -= 1
                        self._lock.notify_all()
                source.task_done()

    def _fail(self, e: BaseException, w: int | None = None) -> None:
        if w is not None and self._lost_with(w, e):
            return   # a consequence of VW w's lost task: the job goes on without it
        with self._lock:
            if self._error is None:
                self._error = e
        # The failed VW will push no more waves: nobody may keep waiting for them.
        self.servers.end_run()
