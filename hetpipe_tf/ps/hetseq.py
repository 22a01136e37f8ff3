"""HetSeq-style synchronous data parallelism: unequal shares of every batch, one update.

Every device holds the whole model as a one-stage pipeline (`ShareStage`, a `Stage` whose
compiled task also takes the share's weight). A batch of N samples is cut into the shares
n_1..n_K that `partitioner.shares` chose (in order: device k takes rows
offsets[k]..offsets[k+1]); device k's thread computes the gradient of its share's loss
times n_k / N. Keras' default loss reduction ("sum_over_batch_size") divides a share's
weighted sum by n_k, so the weighted losses add up to the loss of the whole batch, sample
weights (and class weights, which Keras turns into sample weights) included; the added
losses (weight regularizers counted once per share, activity regularizers a mean over the
share) add up to the whole batch's too, since the weights sum to 1. The gradients are summed
and applied ONCE by one optimizer (a clone of the model's, as `strategy/training_state.py`
makes them, on the model's own variables): a step equals one step of that optimizer on the
concatenated batch, for any optimizer (summing each device's own Adam update would not).

Metrics: each share updates the model's loss tracker (with its unweighted loss and n_k as
the weight, so the mean is the whole batch's) and compiled metrics (accumulators: one
update per share equals one on the concatenation), one share at a time under a lock; the
logs are read after the last share's update. Float non-trainable state (BatchNorm moving
statistics): each share's change weighted by n_k / N (exact for a moving mean; the forward
normalises with each share's own statistics, as MirroredStrategy without SyncBN).
Integer state (random seed generators) is read once per step and written back from the
first share.

Flow: `submit` splits the batch and hands each share to its device's thread, then returns;
the device that finishes last sums, applies on the variables' device and completes the
step. The next `submit` waits for that (its weights are the applied ones). A batch smaller
than the shares' (an epoch's remainder) is split in proportion (`Shares.split`); a device
may then sit out. Emulation: a device with emulated_speed_factor f < 1 sleeps (1/f - 1)
times its task's time after it, as pipeline stages do; with `emulate_speeds` (one
`DeviceSpeed` per device) every share instead takes the time they predict for it: logical
devices that share a machine's cores slow each other's measured times down unevenly, which
the first rule multiplies (docs/hetseq.md, benchmarks/hetseq_benchmark.py).

`drain`, `abort`, `close`, runs and errors as `PipelineRuntime`'s (an aborted step is never
applied: the last finisher checks its run).
"""

from __future__ import annotations

import functools
import threading
import time
from typing import Any, Callable, Sequence

import tensorflow as tf

from hetpipe_tf.partitioner.shares import Shares
from hetpipe_tf.pipeline.executor import PipelineError, ThreadedExecutor
from hetpipe_tf.pipeline.compiled import compiled_method
from hetpipe_tf.pipeline.stage import Stage, compiled_loss
from hetpipe_tf.pipeline.weights import StageWeights
from hetpipe_tf.pipeline.window import DEFAULT_HISTORY, Window
from hetpipe_tf.pipeline.workers import Loop
from hetpipe_tf.ps.lost_workers import DroppableLock



class ShareStage(Stage):
    """The whole model on one device; its task returns the gradient of the share's loss
    times the share's weight (a tensor: one trace for every weight)."""

    def __init__(self, program, device: str, emulated_speed_factor: float, model):
        super().__init__(0, 1, program, 0, len(program.graph) - 1, device,
                         emulated_speed_factor, model)
        self._share_fn = compiled_method(self._share_impl, reduce_retracing=True)
        self.emulation_overruns = 0   # tasks whose work outlasted their `emulated_s`

    def _share_impl(self, tvals, vvals, svals, inputs, y, sample_weight, weight):
        with tf.GradientTape(watch_accessed_variables=False) as tape:
            tape.watch(tvals)
            outputs, extra, deltas, new_s = self._forward_impl(tvals, vvals, svals, inputs)
            y_pred = self.program.pack_outputs(outputs)
            c = compiled_loss(self._model, y, y_pred, sample_weight)
            loss = extra if c is None else extra + tf.cast(c, tf.float32)
            weighted = loss * weight
        grads = tape.gradient(weighted, tvals)
        deltas = [d * tf.cast(weight, d.dtype) for d in deltas]
        return grads, loss, outputs, deltas, new_s

    def share_task(self, tvals, vvals, svals, inputs, y, sample_weight, weight,
                   emulated_s: float | None = None):
        """(weighted grads, unweighted loss, outputs, weighted nt deltas, new sequential
        state) of one share, on this device (call on its thread). `emulated_s`: EMULATE a
        device whose task takes that long (sleep for the rest, if any) instead of the
        measured time / the speed factor."""
        t0 = time.perf_counter()
        with tf.device(self.device):
            out = self._share_fn(list(tvals), list(vvals), list(svals), list(inputs), y,
                                 sample_weight, weight)
        if emulated_s is None:
            self._emulate(t0)
        else:
            rest = t0 + emulated_s - time.perf_counter()
            if rest > 0:
                time.sleep(rest)   # EMULATION of a slower device, not real work
                self.emulated_sleep_s += rest
            else:
                self.emulation_overruns += 1   # the real work took longer than emulated
        return out


class _Step:
    def __init__(self, p: int, run: int, active: int):
        self.p, self.run, self.active = p, run, active
        self.grads: dict[int, list] = {}
        self.deltas: dict[int, list] = {}
        self.new_s = None
        self.left = active          # shares not finished
        self.metrics_left = active  # shares whose metrics are not updated


def _rows(nest, a: int, b: int):
    return tf.nest.map_structure(lambda t: None if t is None else t[a:b], nest)


class HetSeqExecutor(ThreadedExecutor):
    """One synchronous HetSeq step per submitted batch (module docstring).

    Args:
      stages: one `ShareStage` per device, in share order.
      weights: the model's variables (on their own device), their optimizer and counter.
      shares: the devices' shares of the planned global batch.
      update_metrics: update_metrics(loss, y, y_pred, sample_weight) -> logs.
      on_run_start, on_run_end, history: as for `PipelineRuntime`.
    """

    n_m = 1

    def __init__(self, stages: Sequence[ShareStage], weights: StageWeights, shares: Shares,
                 update_metrics: Callable[[Any, Any, Any, Any], dict],
                 on_run_start: Callable[[], None] | None = None,
                 on_run_end: Callable[[], None] | None = None,
                 history: int = DEFAULT_HISTORY):
        if len(stages) != len(shares.sizes):
            raise ValueError(f"One stage per share is needed. Received: {len(stages)} stages "
                             f"for shares {list(shares.sizes)}.")
        self.stages = list(stages)
        self.weights = weights
        self.shares = shares
        self._update_metrics = update_metrics
        self._on_run_start = on_run_start
        self._on_run_end = on_run_end
        self._cond = threading.Condition()
        # Held across remote ops (the metrics update, the logs read): droppable, as the
        # VWs' lock is (ps/coordinator.py), for a device thread stuck in a frozen task.
        # Nothing drops it yet: HetSeq on remote tasks is not guarded (docs/cluster_jobs.md).
        self._metrics_lock = DroppableLock()
        self.submitted = 0
        self.completed = 0
        self._run = 0
        self._run_open = False
        self._outstanding = 0       # share tasks queued or being worked on
        self._current: _Step | None = None
        self._closed = False
        self._error: BaseException | None = None
        self.logs: dict | None = None
        self.logs_time = 0.0
        self.splits = Window(history)      # the shares of each step (remainders differ)
        self.step_s = Window(history)      # submit to applied, per step
        self.dropped = 0
        self._t_submit = 0.0
        self._weights = {}                 # batch size -> per-share weight tensors
        # EMULATION by given speeds (one DeviceSpeed per device; None = each device's
        # measured time / its factor): each share takes the time they predict for it.
        self.emulate_speeds = None
        self._sum_fn = compiled_method(self._sum_impl, reduce_retracing=True)
        self._start_workers([Loop(f"hetpipe-hetseq-{k}", functools.partial(self._work, k),
                                  functools.partial(self._where, k), self._done, scoped=False)
                             for k in range(len(self.stages))])

    @property
    def in_flight(self) -> int:
        return self.submitted - self.completed

    # --- the Keras step -----------------------------------------------------------------
    def submit(self, inputs: list, y, sample_weight) -> None:
        with self._cond:
            self._raise_if_failed()
            if self._closed:
                raise PipelineError("The HetSeq executor is closed.")
            while self.completed < self.submitted and self._error is None:
                self._cond.wait()   # the previous step's update comes first
            self._raise_if_failed()
            if not self._run_open:
                if self._on_run_start is not None:
                    self._on_run_start()
                self._run_open = True
                self.weights.start_run(self.submitted + 1, self.weights.applied)
            n = int(inputs[0].shape[0])
            sizes = self.shares.split(n)
            self.submitted += 1
            p = self.submitted
            _, tvals, nvals = self.weights.take(p)
            svals = self.stages[0]._read_sequential()
            offsets = [0]
            for k in sizes:
                offsets.append(offsets[-1] + k)
            active = [k for k, m in enumerate(sizes) if m > 0]
            step = _Step(p, self._run, len(active))
            self._current = step
            self.splits.append(sizes)
            self._t_submit = time.perf_counter()
            weights = self._share_weights(n, sizes)
            for k in active:
                a, b = offsets[k], offsets[k + 1]
                self._outstanding += 1
                self._queues[k].put((step, k == active[0], tvals, nvals, svals,
                                     [x[a:b] for x in inputs], _rows(y, a, b),
                                     _rows(sample_weight, a, b), weights[k]))

    def _share_weights(self, n: int, sizes) -> list:
        key = (n, tuple(sizes))
        if key not in self._weights:
            with tf.init_scope():
                self._weights[key] = [tf.constant(m / n, tf.float32) for m in sizes]
        return self._weights[key]

    def abort(self) -> None:
        with self._cond:
            self._run += 1
            while self._outstanding:
                self._cond.wait(0.05)
            self.dropped += self.submitted - self.completed
            self.submitted = self.completed
            self._current = None
            self._error = None
            self._cond.notify_all()
        self._end_run()

    # --- device threads -----------------------------------------------------------------
    def _work(self, k: int, item: tuple) -> None:
        if self._error is None and item[0].run == self._run:
            self._share(k, *item)

    def _where(self, k: int, item: tuple) -> str:
        return f"HetSeq device {k} ({self.stages[k].device}), step {item[0].p}"

    def _note(self, where: str) -> str:
        return f"hetpipe_tf: raised by {where}."

    def _share(self, k, step, first, tvals, nvals, svals, inputs, y, sw, weight) -> None:
        stage = self.stages[k]
        speeds = self.emulate_speeds
        emulated = None if speeds is None else speeds[k].time(int(inputs[0].shape[0]))
        grads, loss, outputs, deltas, new_s = stage.share_task(tvals, nvals, svals, inputs,
                                                               y, sw, weight, emulated)
        del tvals, nvals
        with self._metrics_lock, tf.device(stage.device):
            logs = self._update_metrics(loss, y, stage.program.pack_outputs(outputs), sw)
            step.metrics_left -= 1
            if step.metrics_left == 0:   # every share's update is in these logs
                self.logs = {key: v.numpy() for key, v in logs.items()}
                self.logs_time = time.perf_counter()
        with self._cond:
            step.grads[k] = grads
            step.deltas[k] = deltas
            if first:
                step.new_s = new_s
            step.left -= 1
            last = step.left == 0
        if last:
            self._apply(step)

    def _sum_impl(self, grads, deltas):
        return ([None if any(g is None for g in gs) else tf.add_n(list(gs))
                 for gs in zip(*grads)],
                [tf.add_n(list(ds)) for ds in zip(*deltas)])

    def _apply(self, step: _Step) -> None:
        with self._cond:
            if step.run != self._run:
                return   # aborted: never applied
        keys = sorted(step.grads)
        with tf.device(self.weights.device):
            grads, deltas = self._sum_fn([step.grads[k] for k in keys],
                                         [step.deltas[k] for k in keys])
        self.weights.apply(step.p, grads, deltas)
        self.stages[0]._write_sequential(step.new_s)
        with self._cond:
            self.completed = step.p
            self.step_s.append(time.perf_counter() - self._t_submit)
            self._cond.notify_all()
