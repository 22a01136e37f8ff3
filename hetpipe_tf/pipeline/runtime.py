"""The pipeline runtime of one virtual worker: a thread per stage.

`submit` hands minibatch p to stage 0 once p - N_m has completed (at most N_m in flight);
it returns at once, so the Keras step that called it does not wait for p. When N_m are in
flight, p waits in a one-place waiting room and whoever completes p - N_m (stage 0's
thread, or the updater) queues its forward at once: the Keras thread's wake-up is off the
pipeline's critical path, and only its next `submit` blocks. Each stage thread
takes tasks from its FIFO queue in the order they became ready: a forward task when the
previous stage sent p's activations, a backward task when the next stage sent p's output
gradients; the last stage runs forward, loss and backward of p as one task and updates the
loss and compiled metrics, in minibatch order (with one virtual worker inside the same
compiled call; with several, as a call of its own under their shared metrics lock, or,
for one-stage VWs whose metrics all add, each VW's own copy of their state inside its
task's call: `vw_metrics`, strategy/vw_metrics.py). When
stage 0 finishes p's backward, p is committed: stage 0 applies its own part of u_p and
snapshots its part of the version of p + N_m on its thread and device, and every other stage
gets an apply task that does the same for its part on its own thread and device (each GPU
updates its own weights, as in HetPipe), FIFO before any later forward of that stage (no
drain between waves; `weights.py`). A VW of one stage among several applies u_p inside
its task's compiled call instead (`StageWeights.apply_in_task`, the same numerics bit for
bit, one remote call fewer in a cluster job): p is committed when that task starts. With
its own metric state a wave is one call: the stage waits until the rest of p's wave is
queued (or the run drains: a short last wave runs one call each) and runs them in p's
call: N_m minibatches, their updates and versions in one call with the numerics of one
call each, and one read of the state (`_wave_rest`, `_take_queued`; `joined` counts
them). `drain` waits until every submitted minibatch completed; the next `submit` then
starts a new run whose first N_m minibatches use the drained weights.

With `update_thread=True` (several virtual workers under WSP) a committed minibatch is
handed to an updater thread that waits until every stage applied it and runs the wave hook
(`after_apply`: push, wait, pull) in order, so that the stages keep computing while the
updater waits for global weights (Section 5: the VW "may start s_local minibatches of the
next wave while it waits"); p counts as complete after its hook.

Lifecycle: the runtime owns its threads; `close()` (or leaving `with runtime:`) stops and
joins them. `abort()` drops every minibatch in flight that was not committed (a committed one is
applied on every stage, never on some only), waits until no stage works any more and leaves w_local at
the last applied state; the next `submit` starts a fresh run from it. A failing task stops
the pipeline and is re-raised to the caller as its own exception, with a note naming the
stage, its device, the virtual worker and the minibatch.

Records (trace, completions, update times, the weight-version record) keep the last
`history` minibatches only, so memory stays flat in long runs.
"""

from __future__ import annotations

import dataclasses
import functools
import threading
import time
from typing import Any, Callable, Iterator, Mapping, Sequence

import tensorflow as tf

from hetpipe_tf.core.schedule import Task, TaskKind
from hetpipe_tf.pipeline import tied, transport
from hetpipe_tf.pipeline.executor import PipelineError, ThreadedExecutor  # noqa: F401 - public here
from hetpipe_tf.pipeline.minibatch import Minibatch, scaled
from hetpipe_tf.pipeline.stage import Stage
from hetpipe_tf.pipeline.weights import WeightVersions
from hetpipe_tf.pipeline.workers import Loop, take_queued
from hetpipe_tf.pipeline.window import DEFAULT_HISTORY

_APPLY = "apply"   # a stage's task: apply its part of a committed minibatch's update


class RecordView(Mapping):
    """Minibatch id -> the update ids its weights reflected, built on access (a window)."""

    def __init__(self, last_update: Mapping[int, int]):
        self._last = last_update

    def __getitem__(self, p: int) -> tuple[int, ...]:
        return tuple(range(1, self._last[p] + 1))

    def __iter__(self) -> Iterator[int]:
        return iter(sorted(self._last))

    def __len__(self) -> int:
        return len(self._last)


@dataclasses.dataclass(frozen=True)
class TraceEvent:
    task: Task
    start: float
    end: float


class PipelineRuntime(ThreadedExecutor):
    def __init__(self, stages: Sequence[Stage], weights: WeightVersions, n_m: int,
                 update_metrics: Callable[[Any, Any, Any, Any], dict], trace: bool = True,
                 after_apply: Callable[[int], None] | None = None,
                 update_thread: bool = False, metrics_lock: threading.Lock | None = None,
                 vw: int = 0, history: int = DEFAULT_HISTORY, plan=None,
                 on_run_start: Callable[[], None] | None = None,
                 on_run_end: Callable[[], None] | None = None, vw_metrics=None):
        self.n_m = n_m
        self._init_pipeline(stages, weights, vw=vw, history=history, plan=plan,
                            update_metrics=update_metrics, metrics_lock=metrics_lock,
                            after_apply=after_apply, on_run_start=on_run_start,
                            on_run_end=on_run_end, trace=trace)
        # Several VWs whose metric state is kept per VW (`vw_metrics`,
        # strategy/vw_metrics.py): a one-stage VW updates its copy inside its task's call
        # (`_run_and_commit`); every VW must, or none does.
        self._vw_metrics = None if self._fuse_metrics else vw_metrics
        self.joined = 0   # minibatches run in the call of an earlier one (`_take_queued`)
        self._flushed_run = 0   # len(run_starts) when `drain` began: its run gets no more
        if self._vw_metrics is not None:
            self._vw_metrics.enroll(vw, self.stages[-1].device, len(self.stages) == 1
                                    and self.versions.stages[0].applies_in_task)
        self._start_workers(
            [Loop(f"hetpipe-vw{vw}-stage-{j}", functools.partial(self._execute, j),
                  functools.partial(self._where, j), self._done)
             for j in range(len(self.stages))],
            Loop(f"hetpipe-vw{vw}-updater", self._update,
                 lambda mb: f"the wave sync after minibatch {mb.id}", self._updated)
            if update_thread else None)

    # --- called by the Keras step / the strategy ----------------------------------------
    def submit(self, inputs: list, y, sample_weight, loss_scale: float | None = None) -> None:
        with self._cond:
            mb = Minibatch(self._admit(), inputs, y, sample_weight, run=self._run,
                           loss_scale=loss_scale)
            self._start_or_wait(mb)

    def _start(self, mb: Minibatch) -> None:
        """Queue p's first task (call under `_cond`; p - N_m has completed)."""
        self._outstanding += 1
        kind = TaskKind.FORWARD_BACKWARD if len(self.stages) == 1 else TaskKind.FORWARD
        self._queues[0].put((kind, mb, None))
        self._cond.notify_all()   # a stage waiting for the rest of its wave (`_wave_rest`)

    def drain(self) -> None:
        with self._cond:
            # No more minibatches come in this run: a stage waiting for the rest of its
            # wave runs what it has, one call a minibatch.
            self._flushed_run = len(self.run_starts)
            self._cond.notify_all()
            while self.completed < self.submitted and self._error is None:
                self._cond.wait()
            target = self.submitted
        # Every stage's apply task of the completed minibatches has run.
        self.versions.wait_applied(target, stop=lambda: self._error is not None)
        with self._cond:
            self._raise_if_failed()
        self._end_run()

    @property
    def logs(self) -> dict | None:
        """The metrics' logs as of the latest completed minibatch (host values): with
        the metric state per VW, those of every VW's latest state summed."""
        if self._per_vw_metrics:
            return self._vw_metrics.logs()
        return self._logs

    @logs.setter
    def logs(self, value: dict | None) -> None:
        self._logs = value

    @property
    def _per_vw_metrics(self) -> bool:
        vm = getattr(self, "_vw_metrics", None)
        return vm is not None and vm.active

    @property
    def record(self) -> RecordView:
        """Minibatch id -> the update ids its weights reflected (the last `history`
        minibatches; for tests and debugging)."""
        return RecordView(self.versions.record)

    @property
    def in_flight(self) -> int:
        return self.submitted - self.completed

    def abort(self) -> None:
        """Drop every minibatch in flight that was not committed (a committed one finishes
        on every stage) and end the run; returns when no stage works any more. w_local is the
        last applied state. Clears a failure, so the runtime can run again from there."""
        self._drop_uncommitted()

    # --- stage threads (workers.Loop: counted in `_outstanding` by whoever queued) -------
    def _execute(self, j: int, item) -> None:
        """Run one task of stage j."""
        kind, mb, payload = item
        t0 = time.perf_counter()
        # Unlocked reads: an abort or failure that lands just after them is handled at
        # the commit (under the lock), as one that lands during the task.
        drop = kind != _APPLY and (self._error is not None or mb.run != self._run)
        if not drop:   # else failed or aborted before commit: dropped
            self._run_task(j, self.stages[j], kind, mb, payload, t0)

    def _where(self, j: int, item) -> str:
        kind, mb, _ = item
        what = "the update" if kind == _APPLY else kind.value
        return f"stage {j} on {self.stages[j].device} ({what} of minibatch {mb.id})"

    def _record(self, j: int, kind: TaskKind, p: int, t0: float) -> None:
        if self.trace_enabled:
            self.trace.append(TraceEvent(Task(j, p, kind), t0, time.perf_counter()))

    def _run_task(self, j: int, stage: Stage, kind, mb: Minibatch, payload, t0):
        if kind == _APPLY:
            self.versions.apply(j, mb.id, *scaled(mb, j, stage.device))
            return
        if kind is TaskKind.FORWARD:
            inputs = mb.inputs if j == 0 else payload
            tvals, nvals = self.versions.take(mb.id, j)
            tvals = tied.with_borrowed(stage, mb.tied, tvals)
            outputs, extra, deltas, saved = stage.forward(tvals, nvals, inputs)
            mb.saved[j] = saved
            mb.deltas[j] = deltas
            mb.extra_loss = extra if j == 0 else mb.extra_loss + extra
            self._record(j, kind, mb.id, t0)
            nxt = TaskKind.FORWARD_BACKWARD if j + 1 == len(self.stages) - 1 else TaskKind.FORWARD
            self._put(self._queues[j + 1], (nxt, mb, outputs))
        elif kind is TaskKind.FORWARD_BACKWARD and self._applies_in_task(mb):
            self._run_and_commit(stage, mb, t0)
        elif kind is TaskKind.FORWARD_BACKWARD:
            inputs = mb.inputs if j == 0 else payload
            tvals, nvals = self.versions.take(mb.id, j)
            tvals = tied.with_borrowed(stage, mb.tied, tvals)
            extra = None if j == 0 else mb.extra_loss
            # The logs are read after the metrics lock is let go: reading waits for the
            # stage's compute, and under the lock every other VW's stage waited for it too
            # (their computes ran one after the other; docs/cluster_jobs.md "Speed of the
            # wire"). The lock orders the metrics updates; their outputs are values.
            if self._fuse_metrics:
                with self._metrics_lock:
                    wg, in_grads, _, _, deltas, logs = stage.forward_backward(
                        tvals, nvals, inputs, mb.y, mb.sample_weight, extra_loss=extra,
                        metrics=self._update_metrics)
                    stamp = time.perf_counter()   # the updates' order, for the latest logs
            else:
                wg, in_grads, loss, outputs, deltas, _ = stage.forward_backward(
                    tvals, nvals, inputs, mb.y, mb.sample_weight)
                # On the stage's device, never the caller's default: in a cluster job the
                # chief ran `loss + extra` itself, and its kernel waiting for a loss from a
                # frozen task held one of the chief's few inter-op threads for good; with
                # Keras' step holding the other, no VW's chief-side work (metrics, optimizer
                # counter) ran any more (docs/cluster_jobs.md "Going on without a lost VW" 6).
                with tf.device(stage.device):
                    total = loss if extra is None else loss + extra
                with self._metrics_lock, tf.device(stage.device):
                    logs = self._update_metrics(
                        total, mb.y, stage.program.pack_outputs(outputs), mb.sample_weight)
                    stamp = time.perf_counter()
            self._set_logs(logs, stamp)
            mb.grads[j] = tied.own_grads(stage, mb.tied_grads, mb.tied, wg)
            mb.deltas[j] = deltas
            # Let go of p's version before the commit applies u_p: a version still alive then
            # makes the update copy every variable it changes (copy-on-write).
            del tvals, nvals
            self._record(j, kind, mb.id, t0)
            if j == 0:
                self._commit(mb)
            else:
                self._put(self._queues[j - 1], (TaskKind.BACKWARD, mb, in_grads))
        else:
            wg, in_grads = stage.backward(mb.saved.pop(j), payload)
            mb.grads[j] = tied.own_grads(stage, mb.tied_grads, mb.tied, wg)
            self._record(j, kind, mb.id, t0)
            if j == 0:
                self._commit(mb)
            else:
                self._put(self._queues[j - 1], (TaskKind.BACKWARD, mb, in_grads))

    def _applies_in_task(self, mb: Minibatch) -> bool:
        """Whether p's only stage applies u_p inside its task's call (`_run_and_commit`):
        one stage, several VWs (their metrics are a call of their own), not a split
        batch's share, and weights that allow it (`StageWeights.applies_in_task`)."""
        return (len(self.stages) == 1 and not self._fuse_metrics and mb.loss_scale is None
                and self.versions.stages[0].applies_in_task)

    def _run_and_commit(self, stage: Stage, mb: Minibatch, t0: float) -> None:
        """The only stage's task with u_p applied in the same compiled call
        (`StageWeights.apply_in_task`: one call to the stage's task, not two): p is
        committed when the task starts (an abort that comes later waits for it, as for a
        committed minibatch), then the metrics are updated, then p goes to the updater."""
        with self._cond:
            rest = self._wave_rest(mb) if self._per_vw_metrics else 0
            if mb.run != self._run:
                return   # aborted before its commit: dropped
        if self._per_vw_metrics:
            self._run_queued_in_one_call(stage, mb, t0, rest)
            return
        tvals, nvals = self.versions.take(mb.id, 0)
        loss, y_pred = self.versions.apply_in_task(mb.id, stage, tvals, nvals,
                                                   mb.inputs, mb.y, mb.sample_weight)
        del tvals, nvals
        self._record(0, TaskKind.FORWARD_BACKWARD, mb.id, t0)
        # Before p completes: Keras reads the metrics once the run drained.
        with self._metrics_lock, tf.device(stage.device):
            logs = self._update_metrics(loss, mb.y, y_pred, mb.sample_weight)
            stamp = time.perf_counter()
        self._set_logs(logs, stamp)
        self.update_s.append(0.0)   # the update ran inside the task's span
        self._applied(mb)

    def _wave_rest(self, mb: Minibatch) -> int:
        """Under `_cond`: how many minibatches join p's call. When p starts a wave (waves
        numbered from the run's first minibatch, as WSP numbers them), wait until the
        wave's N_m - 1 others are queued behind p, or until no more can come now (the run
        drains, an abort, a failure): N_m - 1 if they are queued, else none (a run's short
        last wave runs one call a minibatch, so a VW traces calls of 1 and of N_m only).
        A wave is one call: the stage waits instead of running what it has one call each
        (docs/cluster_jobs.md, "A wave in one call")."""
        want = self.n_m - 1
        if not want or (mb.id - self.run_starts[-1]) % self.n_m:
            return 0
        while (self._queues[0].qsize() < want and mb.run == self._run
               and self._error is None and self._flushed_run != len(self.run_starts)):
            self._cond.wait()
        return want if self._queues[0].qsize() >= want else 0

    def _run_queued_in_one_call(self, stage: Stage, mb: Minibatch, t0: float,
                                rest: int) -> None:
        """`_run_and_commit` with the VW's own metric state (vw_metrics.py): p and the
        `rest` minibatches queued behind it, committed now, in one call with the numerics
        of one call each (`apply_in_task`'s `more`); the state is read once, after the
        last."""
        batch, after = self._take_queued(mb, rest)
        ran = False
        try:
            vm = self._vw_metrics
            generation, reset, copy = vm.begin(self.vw)
            taken = [self.versions.take(m.id, 0) for m in batch]
            (tvals, nvals), more = taken[0], [
                (t, n, m.inputs, m.y, m.sample_weight) for m, (t, n) in zip(batch[1:], taken[1:])]
            state = self.versions.apply_in_task(mb.id, stage, tvals, nvals, mb.inputs,
                                                mb.y, mb.sample_weight, metrics=copy,
                                                reset=reset, more=more)
            del taken, tvals, nvals, more
            for m in batch:
                self._record(0, TaskKind.FORWARD_BACKWARD, m.id, t0)
            # Before they complete: Keras reads the metrics once the run drained.
            vm.store(self.vw, generation, state.numpy())
            self.logs_time = time.perf_counter()
            self.joined += len(batch) - 1
            for m in batch:
                self.update_s.append(0.0)   # the update ran inside the task's span
                self._applied(m)
            ran = True
        finally:
            for item in batch[1:]:
                self._done(item)   # taken off the queue here, not by the stage's loop
            for item in after:     # not for this call: as the loop runs (or drops) it
                try:
                    if ran:
                        self._execute(0, item)
                except BaseException as e:  # noqa: BLE001 - as Workers forwards it
                    self._fail(e, self._where(0, item))
                finally:
                    self._done(item)

    def _take_queued(self, mb: Minibatch, rest: int) -> tuple[list, list]:
        """p and, of the next `rest` queued items, those that join p's call (consecutive,
        this run's); and the items taken that do not (run after the call, in order).
        Nothing of another run can be queued while p's task runs: an abort waits for it."""
        batch, after = [mb], []
        items = take_queued(self._queues[0], rest)
        with self._cond:
            for item in items:
                kind, nxt, _ = item
                joins = (not after and kind is TaskKind.FORWARD_BACKWARD
                         and nxt.run == self._run and nxt.id == batch[-1].id + 1
                         and self._error is None and self._applies_in_task(nxt))
                (batch if joins else after).append(nxt if joins else item)
        return batch, after

    def _set_logs(self, logs: dict, stamp: float) -> None:
        # Host values, read here: handing the eager tensors to the Keras step's thread
        # crashed TensorFlow now and then when the stage runs on a remote task (absl
        # "Mutex corrupt" aborts and segfaults in 3 of 12 loaded chief_traffic runs; 0 of
        # 24 with values).
        self.logs = transport.host_values(logs)   # one round trip for all of them
        self.logs_time = stamp   # taken under the metrics lock: the latest are the newest

    def _update(self, mb: Minibatch) -> None:
        """The updater's work on a committed minibatch (never dropped): its wave hook once
        every stage applied it."""
        self.versions.wait_applied(mb.id, stop=lambda: self._error is not None)
        if self._error is None and self._after_apply is not None:
            self._after_apply(mb.id)

    def _updated(self, mb: Minibatch) -> None:
        self._completed(mb)
        self._done()

    def _commit(self, mb: Minibatch) -> None:
        """Stage 0 finished p's backward: p is applied on every stage (or, if an abort came
        first, on none)."""
        with self._cond:
            if mb.run != self._run:
                return  # aborted before its commit: dropped
            for j in range(1, len(self.stages)):   # FIFO before the stage's later forwards
                self._put(self._queues[j], (_APPLY, mb, None))
        t0 = time.perf_counter()
        self.versions.apply(0, mb.id, *scaled(mb, 0, self.stages[0].device))
        # Seconds of stage 0's own update (optimizer + its next snapshot): work outside every
        # task span on stage 0's thread.
        self.update_s.append(time.perf_counter() - t0)
        self._applied(mb)

    def _applied(self, mb: Minibatch) -> None:
        """p's update is applied on stage 0: the updater's (its wave hook), or complete."""
        if self._updates is not None:
            self._put(self._updates, mb)
        else:
            self._completed(mb)
