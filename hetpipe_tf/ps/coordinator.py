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
"""

from __future__ import annotations

import queue
import threading
from typing import Any, Sequence

import tensorflow as tf

from hetpipe_tf import _keras_shim
from hetpipe_tf.ps.server import ParameterServers
from hetpipe_tf.ps.wave_sync import WaveSync

_STOP = object()


class Coordinator:
    """Dispatch, runs and the end-of-run protocol of several VWs.

    Args:
      runtimes: one `PipelineRuntime` per VW (built with `update_thread=True` and
        `after_apply=syncs[w].after_apply`).
      syncs: the VWs' `WaveSync`s, same order.
      servers: the parameter servers (variables in `model_variables` order).
      model_variables: the model's versioned variables, mirrored from w_global after runs.
    """

    def __init__(self, runtimes: Sequence[Any], syncs: Sequence[WaveSync],
                 servers: ParameterServers, model_variables: Sequence[Any]):
        if not (len(runtimes) == len(syncs) == servers.num_workers):
            raise ValueError(f"One runtime and one WaveSync per worker are needed. Received: "
                             f"{len(runtimes)} runtimes, {len(syncs)} syncs, "
                             f"{servers.num_workers} workers.")
        self.runtimes = list(runtimes)
        self.syncs = list(syncs)
        self.servers = servers
        self.model_variables = list(model_variables)
        self.assignment: list[list[int]] = [[] for _ in self.runtimes]
        self.run_starts: list[int] = []      # step number of each run's first batch
        self._queue: queue.Queue = queue.Queue(maxsize=1)
        self._run_open = False
        self._steps = 0
        self._error: BaseException | None = None
        self._lock = threading.Lock()
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
    def logs(self) -> dict | None:
        """The metrics as of the most recently completed minibatch of any VW."""
        done = [rt for rt in self.runtimes if rt.logs is not None]
        return max(done, key=lambda rt: rt.logs_time).logs if done else None

    # --- called by the strategy ----------------------------------------------------------
    def submit(self, inputs: list, y, sample_weight) -> None:
        self._raise_if_failed()
        if not self._run_open:
            self._start_run()
        self._queue.put((self._steps, inputs, y, sample_weight))
        self._steps += 1

    def drain(self) -> None:
        if not self._run_open:
            self._raise_if_failed()
            return
        self._queue.join()
        self.servers.end_run()
        for rt in self.runtimes:
            rt.drain()
        for s in self.syncs:
            s.flush()
        values, _ = self.servers.pull()
        for v, x in zip(self.model_variables, values):
            _keras_shim.variable_handle(v).assign(x)
        self._run_open = False
        self._raise_if_failed()

    def close(self) -> None:
        self.servers.end_run()  # no VW may stay blocked waiting for a wave
        for _ in self._feeders:
            try:  # feeders are daemon threads: never block the caller on a full queue
                self._queue.put(_STOP, timeout=5)
            except queue.Full:
                break
        for rt in self.runtimes:
            rt.close()

    # --- internals -------------------------------------------------------------------
    def _raise_if_failed(self) -> None:
        if self._error is not None:
            raise self._error

    def _start_run(self) -> None:
        values = []
        for v in self.model_variables:
            values.append(tf.identity(_keras_shim.variable_handle(v)))
        self.servers.start_run(values)
        for rt, s in zip(self.runtimes, self.syncs):
            s.start_run(rt.submitted + 1)
        self.run_starts.append(self._steps)
        self._run_open = True

    def _feed(self, w: int) -> None:
        rt = self.runtimes[w]
        while True:
            if self._error is None:
                try:
                    rt.wait_for_room()
                except BaseException as e:  # noqa: BLE001 - re-raised by submit/drain
                    self._fail(e)
            item = self._queue.get()
            try:
                if item is _STOP:
                    return
                if self._error is None:
                    step, inputs, y, sw = item
                    self.assignment[w].append(step)
                    rt.submit(inputs, y, sw)
            except BaseException as e:  # noqa: BLE001 - re-raised by submit/drain
                self._fail(e)
            finally:
                self._queue.task_done()

    def _fail(self, e: BaseException) -> None:
        with self._lock:
            if self._error is None:
                self._error = e
        # The failed VW will push no more waves: nobody may keep waiting for them.
        self.servers.end_run()
