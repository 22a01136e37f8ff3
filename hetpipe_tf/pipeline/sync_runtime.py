"""The executor of synchronous schedules (GPipe, 1F1B): one virtual worker, a thread per
stage, each running its stage's action list (`core/sync_schedule.py`) for every minibatch.

`submit` hands over minibatch p; it is split into M micro-batches along the batch axis (an
uneven split, e.g. an epoch's smaller last batch, gives the first micro-batches one row
more; a batch of B < M rows runs as B micro-batches). Every stage takes p's weight version
(w_local after update p - 1: one minibatch in flight, N_m = 1) and runs its actions:

* F(m): a non-last stage runs its forward (kept on a tape, or with `rematerialize` only
  its inputs, recomputed in B(m)) and sends the outputs to the next stage; the last stage
  runs forward, loss and backward of m as one task (its B(m) then only sends the input
  gradients) and updates the loss tracker and compiled metrics on micro-batch m.
* B(m): the backward with the next stage's gradients; weight gradients are summed in the
  stage's own memory (on its device), in micro-batch order.
* APPLY: when every stage has reached its APPLY for p (all backwards done) p is committed
  and each stage applies its summed gradients once with its own optimizer; an abort before
  that drops p on every stage, never on some only.

Loss: micro-batch m's gradients are those of (n_m / N) x its loss, n_m its rows and N the
minibatch's, so with Keras' default reduction ("sum_over_batch_size": sum of weighted
per-sample losses / rows) the sum over micro-batches is the gradient of the whole
minibatch's loss, sample weights included; the loss tracker, weighted by rows, and Keras'
accumulating metrics end as after one update on the whole minibatch. BatchNorm-style float
non-trainable state is updated once per micro-batch in order (micro-batch m starts from the
state after m - 1 on that stage; GPipe Section 2.2) and the summed change is added at APPLY.

p + 1 starts when p completed (on every stage, and with `update_thread` after the wave
hook: push, wait, pull), so each minibatch is one synchronous step. Lifecycle, errors,
records and `wait_for_room` are as in `runtime.py` (`PipelineRuntime`); `action_trace`
holds (minibatch, Action, start, end) of every action, `trace` the same as `TraceEvent`s
with micro-batches numbered globally ((p - 1) x M + m + 1, as `sim/gpipe.py` does).
"""

from __future__ import annotations

import dataclasses
import functools
import threading
import time
from typing import Any, Callable, Sequence

import tensorflow as tf

from hetpipe_tf._args import check_int
from hetpipe_tf.core.schedule import Task, TaskKind
from hetpipe_tf.core.sync_schedule import Action, ActionKind, Schedule, actions
from hetpipe_tf.pipeline import tied
from hetpipe_tf.pipeline.executor import ThreadedExecutor
from hetpipe_tf.pipeline.micro_batches import Adder, split, split_sizes
from hetpipe_tf.pipeline.runtime import RecordView, TraceEvent
from hetpipe_tf.pipeline.stage import Stage
from hetpipe_tf.pipeline.weights import WeightVersions
from hetpipe_tf.pipeline.window import DEFAULT_HISTORY, Window
from hetpipe_tf.pipeline.workers import Loop

_KIND = {ActionKind.FORWARD: TaskKind.FORWARD, ActionKind.BACKWARD: TaskKind.BACKWARD,
         ActionKind.APPLY: TaskKind.APPLY}


class _Dropped(Exception):
    """The minibatch was aborted (or another stage failed) while this stage worked on it."""


@dataclasses.dataclass
class _Minibatch:
    id: int
    inputs: list     # per micro-batch: stage 0's input tensors
    y: list          # per micro-batch
    sample_weight: list
    scales: list     # per micro-batch: rows / minibatch rows (float32 scalars)
    run: int
    extra: dict = dataclasses.field(default_factory=dict)   # m -> earlier stages' losses
    mail: dict = dataclasses.field(default_factory=dict)    # (kind, stage, m) -> tensors
    at_apply: int = 0
    committed: bool = False
    dropped: bool = False
    applied: int = 0


class SyncPipelineRuntime(ThreadedExecutor):
    """Runs a synchronous `schedule` with `micro_batches` per minibatch (module docstring).

    Args:
      stages, weights: as for `PipelineRuntime`; `weights` built with n_m = 1.
      schedule: Schedule.GPIPE or Schedule.ONE_F_ONE_B.
      micro_batches: M.
      update_metrics: update_metrics(loss, y, y_pred, sample_weight) -> logs.
      rematerialize: non-last stages keep only their inputs and recompute the forward.
      after_apply, update_thread, metrics_lock, vw, history, plan, on_run_start,
      on_run_end, trace: as for `PipelineRuntime`.
    """

    n_m = 1

    def __init__(self, stages: Sequence[Stage], weights: WeightVersions, schedule: Schedule,
                 micro_batches: int, update_metrics: Callable[[Any, Any, Any, Any], dict],
                 rematerialize: bool = False, trace: bool = True,
                 after_apply: Callable[[int], None] | None = None,
                 update_thread: bool = False, metrics_lock: threading.Lock | None = None,
                 vw: int = 0, history: int = DEFAULT_HISTORY, plan=None,
                 on_run_start: Callable[[], None] | None = None,
                 on_run_end: Callable[[], None] | None = None):
        self.schedule = Schedule.parse(schedule)
        tied.refuse_borrowed(stages, f"the {self.schedule.name} schedule")
        if not self.schedule.synchronous:
            raise ValueError(f"SyncPipelineRuntime runs synchronous schedules. Received: "
                             f"schedule={self.schedule}; use PipelineRuntime for HETPIPE.")
        check_int("micro_batches", micro_batches, minimum=1)
        self._init_pipeline(stages, weights, vw=vw, history=history, plan=plan,
                            update_metrics=update_metrics, metrics_lock=metrics_lock,
                            after_apply=after_apply, on_run_start=on_run_start,
                            on_run_end=on_run_end, trace=trace)
        self.micro_batches = micro_batches
        self.rematerialize = bool(rematerialize)
        self._actions: dict[int, tuple] = {}
        self._scales: dict[tuple, list] = {}
        self._adders = [Adder() for _ in self.stages]
        self._repeatable: set[int] = set()   # stages checked for re-materialization
        self.action_trace = Window(history * 4)
        self._start_workers(
            [Loop(f"hetpipe-vw{vw}-sync-stage-{j}", functools.partial(self._work, j),
                  functools.partial(self._where, j), self._done, scoped=False)
             for j in range(len(self.stages))],
            Loop(f"hetpipe-vw{vw}-sync-updater", self._update,
                 lambda mb: f"the wave sync after minibatch {mb.id}", self._updated,
                 scoped=False)
            if update_thread else None)

    @property
    def record(self) -> RecordView:
        return RecordView(self.versions.record)

    @property
    def in_flight(self) -> int:
        return self.submitted - self.completed

    def actions_for(self, micro_batches: int) -> tuple:
        """The per-stage action lists for a minibatch of `micro_batches` micro-batches."""
        if micro_batches not in self._actions:
            self._actions[micro_batches] = actions(self.schedule, len(self.stages),
                                                   micro_batches)
        return self._actions[micro_batches]

    # --- called by the Keras step / the strategy ----------------------------------------
    def submit(self, inputs: list, y, sample_weight) -> None:
        rows = int(tf.shape(tf.nest.flatten(inputs)[0])[0])
        sizes = split_sizes(rows, self.micro_batches)
        key = (rows, tuple(sizes))
        if key not in self._scales:
            self._scales[key] = [tf.constant(n / rows, tf.float32) for n in sizes]
        split_in = split(list(inputs), sizes)
        with self._cond:
            mb = _Minibatch(self._admit(), split_in, split(y, sizes),
                            split(sample_weight, sizes), self._scales[key], self._run)
            self._start_or_wait(mb)

    def _start(self, mb: _Minibatch) -> None:
        """Hand p to every stage (call under `_cond`; p - 1 has completed)."""
        for q in self._queues:
            self._outstanding += 1
            q.put(mb)

    def abort(self) -> None:
        self._drop_uncommitted()

    # --- messages between stages ----------------------------------------------------------
    def _live(self, mb: _Minibatch) -> bool:
        return mb.run == self._run and self._error is None

    def _send(self, mb: _Minibatch, key: tuple, value) -> None:
        with self._cond:
            mb.mail[key] = value
            self._cond.notify_all()

    def _recv(self, mb: _Minibatch, key: tuple):
        with self._cond:
            while key not in mb.mail:
                if not self._live(mb):
                    raise _Dropped
                self._cond.wait(0.5)
            return mb.mail.pop(key)

    def _barrier(self, mb: _Minibatch) -> None:
        """Every stage reached APPLY: commit p (or drop it on every stage)."""
        k = len(self.stages)
        with self._cond:
            mb.at_apply += 1
            if mb.at_apply == k:
                if self._live(mb):
                    mb.committed = True
                else:
                    mb.dropped = True
                self._cond.notify_all()
            while not (mb.committed or mb.dropped):
                if not self._live(mb):
                    mb.dropped = True
                    self._cond.notify_all()
                    break
                self._cond.wait(0.5)
            if mb.dropped:
                raise _Dropped

    # --- stage threads (workers.Loop) ------------------------------------------------------
    def _work(self, j: int, mb: _Minibatch) -> None:
        try:
            if self._live(mb):
                self._run_minibatch(j, mb)
        except _Dropped:
            pass

    def _where(self, j: int, mb: _Minibatch) -> str:
        return f"stage {j} on {self.stages[j].device} (minibatch {mb.id})"

    def _record(self, j: int, mb: _Minibatch, a: Action, t0: float, m_count: int) -> None:
        if not self.trace_enabled:
            return
        t1 = time.perf_counter()
        self.action_trace.append((mb.id, a, t0, t1))
        if a.kind is ActionKind.APPLY:   # updates are in update_s, as PipelineRuntime's
            return
        num = (mb.id - 1) * m_count + a.micro_batch + 1
        self.trace.append(TraceEvent(Task(j, num, _KIND[a.kind]), t0, t1))

    def _run_minibatch(self, j: int, mb: _Minibatch) -> None:
        stage, add = self.stages[j], self._adders[j]
        last = j == len(self.stages) - 1
        count = len(mb.scales)
        tvals, nvals0 = self.versions.take(mb.id, j)
        nvals = list(nvals0)
        grads = deltas = None
        saved, out_grads = {}, {}
        for a in self.actions_for(count)[j]:
            # An action's span starts when its inputs are there (waiting is bubble).
            m = a.micro_batch
            if a.kind is ActionKind.FORWARD:
                inputs = mb.inputs[m] if j == 0 else self._recv(mb, ("F", j, m))
                t0 = time.perf_counter()
                if last:
                    extra = mb.extra.get(m) if j > 0 else None
                    wg, ig, total, outputs, d, logs = self._last_task(
                        stage, tvals, nvals, inputs, mb, m, extra)
                    grads = add(grads, wg)
                    out_grads[m] = ig
                else:
                    if self.rematerialize and j not in self._repeatable:
                        self._check_repeatable(stage, tvals, nvals, inputs)
                    fwd = stage.forward_remat if self.rematerialize else stage.forward
                    outputs, extra, d, saved[m] = fwd(tvals, nvals, inputs)
                    mb.extra[m] = extra if j == 0 else mb.extra[m] + extra
                    self._send(mb, ("F", j + 1, m), outputs)
                if d:   # BatchNorm statistics: micro-batch m + 1 starts from m's
                    deltas = add(deltas, d)
                    nvals = add(nvals, d)
            elif a.kind is ActionKind.BACKWARD:
                if last:
                    t0 = time.perf_counter()
                    ig = out_grads.pop(m)
                else:
                    bwd = stage.backward_remat if self.rematerialize else stage.backward
                    out = self._recv(mb, ("B", j, m))
                    t0 = time.perf_counter()
                    wg, ig = bwd(saved.pop(m), out, mb.scales[m])
                    grads = add(grads, wg)
                if j > 0:
                    self._send(mb, ("B", j - 1, m), ig)
            else:
                self._barrier(mb)
                t0 = time.perf_counter()
                del tvals   # no version alive while the update writes (copy-on-write)
                t_apply = time.perf_counter()
                self.versions.apply(j, mb.id, grads or [], deltas or [])
                if j == 0:
                    self.update_s.append(time.perf_counter() - t_apply)
                self._record(j, mb, a, t0, count)
                self._applied(mb)
                return
            self._record(j, mb, a, t0, count)

    def _check_repeatable(self, stage: Stage, tvals, nvals, inputs) -> None:
        """Refuse re-materialization of a stage whose forward draws from a stateful random
        generator (its recomputation would not repeat it: silently wrong gradients)."""
        ops = stage.stateful_random_ops(tvals, nvals, inputs)
        if ops:
            raise ValueError(
                "Re-materialization recomputes a stage's forward in its backward, but stage "
                f"{stage.index} draws from a stateful random generator, so the recomputation "
                f"would draw other numbers. Received: ops {ops[:5]}; use Keras' random layers "
                "or keras.random with a seed / SeedGenerator (repeatable), or "
                "rematerialize=False.")
        self._repeatable.add(stage.index)

    def _last_task(self, stage: Stage, tvals, nvals, inputs, mb: _Minibatch, m: int, extra):
        y, sw, scale = mb.y[m], mb.sample_weight[m], mb.scales[m]
        final = m == len(mb.scales) - 1
        if self._fuse_metrics:
            with self._metrics_lock:
                out = stage.forward_backward_scaled(tvals, nvals, inputs, y, sw, scale,
                                                    extra_loss=extra,
                                                    metrics=self._update_metrics)
                if final:
                    self._set_logs(out[5])
            return out
        out = stage.forward_backward_scaled(tvals, nvals, inputs, y, sw, scale,
                                            extra_loss=extra)
        with self._metrics_lock, tf.device(stage.device):
            logs = self._update_metrics(out[2], y, stage.program.pack_outputs(out[3]), sw)
            if final:
                self._set_logs(logs)
        return out

    def _set_logs(self, logs: dict) -> None:
        self.logs = {k: v.numpy() for k, v in logs.items()}   # host values (runtime.py)
        self.logs_time = time.perf_counter()

    def _applied(self, mb: _Minibatch) -> None:
        with self._cond:
            mb.applied += 1
            if mb.applied < len(self.stages):
                return
        if self._updates is not None:
            self._put(self._updates, mb)
        else:
            self._completed(mb)

    def _update(self, mb: _Minibatch) -> None:
        """The updater's work on a committed minibatch (never dropped): its wave hook."""
        if self._error is None and self._after_apply is not None:
            self._after_apply(mb.id)

    def _updated(self, mb: _Minibatch) -> None:
        self._completed(mb)
        self._done()
