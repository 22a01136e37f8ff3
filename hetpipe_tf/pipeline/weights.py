"""w_local and its versions, stage by stage (paper Section 4, "Considering Staleness").

In HetPipe every GPU updates its own partition: each stage's `StageWeights` holds its part of
w_local (the model's variables with one virtual worker, the VW's copies with several), its
own optimizer (a clone of the model's, so per-stage step counts equal the minibatch count)
and the versions of its part. The stage applies u_q to its part on its own thread and device
and snapshots the version of q + N_m there. A version is the variables' values read inside
the same compiled function as the update (one call, no eager op per variable): a read
shares the variable's buffer, and TensorFlow's copy-on-write keeps it intact when the
variable is later updated, so a version costs a copy only of a variable that changes while
the version is alive (docs/performance.md).

A minibatch is applied on every stage or on none: stage 0 commits q when it finishes q's
backward (the runtime then hands each other stage an apply task, FIFO before any later
forward of that stage), so an abort never leaves a partial update.

With several VWs the wave sync needs w_local as it stood right after update q
(`state_after(q)`, the version snapshot of q + N_m) while later updates may already be
applied on some stages, and replaces that state by pulled global weights with `rebase`:
every stage's part and its later versions move by (pulled - state_after(q)), so the local
updates after q are kept exactly.
"""

from __future__ import annotations

import functools
import threading
import time
from typing import Sequence

import keras
import tensorflow as tf

from hetpipe_tf._shim import keras_graph, keras_optimizer
from hetpipe_tf.pipeline import transport
from hetpipe_tf.pipeline.compiled import compiled_method
from hetpipe_tf.pipeline.emulation import emulate_slowdown
from hetpipe_tf.pipeline.window import DEFAULT_HISTORY


class StageWeights:
    """One stage's part of w_local, its optimizer and its versions.

    Args:
      device: the stage's device (snapshots and updates run there).
      trainable, non_trainable: the variables that ARE this stage's w_local (versioned
        non-trainable = float state such as BatchNorm statistics, updated by deltas).
      optimizer: applies this stage's gradients (built on `trainable`).
      n_m: minibatches in flight.
      counter: an int variable incremented once per update (stage 0 only: the model
        optimizer's iterations when the stages apply with optimizers of their own).
      emulated_speed_factor: f < 1 EMULATES a slower device: each update then takes 1/f as
        long (a sleep of (1/f - 1) x its measured time), as the stage's tasks do, so the
        planner's and the simulator's update cost (/ f) hold under emulation too.
      predictor: a `weight_prediction.WeightPredictor` or a subclass (staleness
        compensation by weight prediction, `Compensation.make_predictor`): forwards read
        their version moved ahead by the missing updates. None (the default) runs exactly
        the paper's rule.
    """

    def __init__(self, device: str, trainable: Sequence, non_trainable: Sequence, optimizer,
                 n_m: int, counter=None, emulated_speed_factor: float = 1.0,
                 predictor=None):
        self.device = device
        self.emulated_speed_factor = float(emulated_speed_factor)
        self.emulated_sleep_s = 0.0  # total time slept for emulation (labelled as such)
        self.trainable = list(trainable)
        self.non_trainable = list(non_trainable)
        self.optimizer = optimizer
        self._n_m = n_m
        self._counter = counter
        self._versions: dict[int, tuple[int, tuple, tuple]] = {}
        self._lock = threading.Lock()
        # Held across a write of w_local that runs outside `_lock` (`apply_in_task`:
        # the stage's whole task) and across `rebase`, so they never run at once.
        self._write_lock = threading.Lock()
        self.applied = 0
        # With N_m > 1 a younger version shares a variable's buffer when it is updated:
        # write by value (copy-on-write would copy, then update). With N_m = 1 no version
        # is alive then, and in place needs no second buffer.
        self._by_value = n_m > 1
        if optimizer is not None and self._by_value:
            keras_optimizer.write_by_value(optimizer, self.trainable)
        self._apply_fn = compiled_method(self._apply_impl, reduce_retracing=True)
        self._read_fn = compiled_method(self.read_ops)
        self._rebase_fn = compiled_method(self._rebase_impl, reduce_retracing=True)
        self._task_stage = None   # apply_in_task's stage and calls, made when first needed
        self._task_apply_fn = None
        self._task_metrics = None   # the VW's metric state the metrics call updates
        self._task_metrics_fn = None
        # Compensation (off: None, and nothing below runs): d as of each version.
        self.predictor = predictor
        self._d_of: dict[int, list] = {}
        if predictor is not None:
            self._apply_fn = compiled_method(self._apply_predict_impl, reduce_retracing=True)

    @property
    def variables(self) -> list:
        return self.trainable + self.non_trainable

    def read_ops(self):
        """The variables' current values (trainable, non-trainable): ops for the caller's
        graph. A read shares the variable's buffer (no copy)."""
        return ([tf.identity(keras_optimizer.variable_handle(v)) for v in self.trainable],
                [tf.identity(keras_optimizer.variable_handle(v)) for v in self.non_trainable])

    def snapshot(self) -> tuple[tuple, tuple]:
        with tf.device(self.device):
            t, n = self._read_fn()
        return tuple(t), tuple(n)

    def start_run(self, first: int, applied: int) -> None:
        """Minibatches first..first+N_m-1 use w_local as it is now (reflecting `applied`)."""
        with self._lock:
            self.applied = applied
            t, n = self.snapshot()
            self._versions = {p: (applied, t, n) for p in range(first, first + self._n_m)}
            if self.predictor is not None:
                # d restarts from zero every run: the weights may have been set or restored
                # since the last update (a resumed fit then equals one in a fresh model).
                self.predictor.d = None
                d = self.predictor.initial(t)
                self._d_of = {p: d for p in self._versions}

    def take(self, p: int) -> tuple[int, tuple, tuple]:
        """(last update reflected, trainable values, non-trainable values) of minibatch p."""
        with self._lock:
            if self.predictor is None:
                return self._versions.pop(p)
            last, t, n = self._versions.pop(p)
            d = self._d_of.pop(p)
            return last, self.predictor.predict(t, d, self.predictor.horizon(p, last)), n

    def forget(self, p: int) -> None:
        with self._lock:
            self._versions.pop(p, None)
            self._d_of.pop(p, None)

    def update_ops(self, grads, deltas) -> None:
        """w_local += u (the optimizer step on `grads`, `deltas` added to the versioned
        non-trainable variables, the counter): ops for the caller's graph, no bookkeeping.
        `apply` runs them in a compiled call of their own; the in-graph runtime inside
        Keras' train step."""
        pairs = [(g, v) for g, v in zip(grads, self.trainable) if g is not None]
        if pairs:
            self.optimizer.apply_gradients(pairs)
        for v, d in zip(self.non_trainable, deltas):
            handle = keras_optimizer.variable_handle(v)
            if self._by_value:   # as the optimizer writes (see __init__)
                handle.assign(handle + d)
            else:
                handle.assign_add(d)
        if self._counter is not None:
            keras_optimizer.variable_handle(self._counter).assign_add(1)

    def _apply_impl(self, grads, deltas):
        self.update_ops(grads, deltas)
        # The new version, read after the updates (automatic control dependencies order a
        # read after the writes to the same variable before it).
        return self.read_ops()

    def _apply_predict_impl(self, grads, deltas, d):
        # As _apply_impl, and the predictor's d after this update (u = after - before).
        # The predictor may correct the gradients first (delay compensation; as they are
        # with weight prediction alone).
        before = [tf.identity(keras_optimizer.variable_handle(v)) for v in self.trainable]
        grads = self.predictor.correct_ops(grads, before, d)
        self.update_ops(grads, deltas)
        t, n = self.read_ops()
        return t, n, self.predictor.observe_ops(d, before, t)

    def apply(self, q: int, grads: Sequence, deltas: Sequence) -> None:
        """w_local += u_q on this stage, then the version of q + N_m (call on its thread)."""
        with self._lock:
            if q != self.applied + 1:
                raise RuntimeError(f"Updates must be applied in order: got {q} after "
                                   f"{self.applied}.")
            t0 = time.perf_counter()
            with tf.device(self.device):
                if self.predictor is None:
                    t, n = self._apply_fn(list(grads), list(deltas))
                else:
                    t, n, d = self._apply_fn(list(grads), list(deltas),
                                             list(self.predictor.initial(self.trainable)))
                    self.predictor.d = list(d)
                    self._d_of[q + self._n_m] = self.predictor.d
            self.emulated_sleep_s += emulate_slowdown(t0, self.emulated_speed_factor)
            self.applied = q
            self._versions[q + self._n_m] = (q, tuple(t), tuple(n))

    @property
    def applies_in_task(self) -> bool:
        """Whether `apply_in_task` may run this stage's update inside its task's call: no
        predictor (it keeps a d per update) and no emulated slowdown (the update's sleep
        is its own)."""
        return self.predictor is None and self.emulated_speed_factor >= 1.0

    def _train_and_update_ops(self, tvals, vvals, inputs, y, sample_weight, outputs):
        """The stage's task (`outputs` gives what it returns) and w_local += u, then the
        next version read after the updates (as in _apply_impl): (outputs, t, n)."""
        wg, deltas, out = self._task_stage.train_ops(tvals, vvals, inputs, y, sample_weight,
                                                     outputs)
        self.update_ops(wg, deltas)
        t, n = self.read_ops()
        return out, t, n

    def _task_apply_impl(self, tvals, vvals, inputs, y, sample_weight):
        (loss, y_pred, masks), t, n = self._train_and_update_ops(
            tvals, vvals, inputs, y, sample_weight, _loss_and_outputs)
        return loss, y_pred, masks, t, n

    def _task_metrics_impl(self, minibatches, reset):
        # Consecutive minibatches, each with the VW's metric state updated after it (zeroed
        # first if `reset`); returns the last state packed and each next version, in order.
        versions = []
        for i, (tvals, vvals, inputs, y, sample_weight) in enumerate(minibatches):
            state, t, n = self._train_and_update_ops(
                tvals, vvals, inputs, y, sample_weight,
                functools.partial(self._task_metrics.update_ops,
                                  reset if i == 0 else tf.constant(False)))
            versions.append((t, n))
        return state, versions

    def apply_in_task(self, q: int, stage, tvals: Sequence, vvals: Sequence,
                      inputs: Sequence, y, sample_weight, metrics=None, reset=None,
                      more: Sequence[tuple] = ()):
        """The only stage's task of minibatch q and u_q in one compiled call (one remote
        call, not two): `stage.train_ops` (forward, loss, backward), then w_local += u_q
        and the version of q + N_m, as `Stage.forward_backward` followed by `apply`.
        Returns (loss, y_pred). With `metrics` (a VW's metric state,
        strategy/vw_metrics.py: `update_ops(reset, loss, y, y_pred, sample_weight)` ops
        returning its new state as one vector, `per_output`), the state is updated in the
        same call (zeroed first if the bool tensor `reset` is true) and that vector is
        returned instead; then `more` may hold minibatches q + 1, q + 2, ... as
        (tvals, vvals, inputs, y, sample_weight), run after q in the same call exactly as
        calls of their own would run them (each reads the version it was given; the updates
        and the metric state follow in minibatch order), and the state after the last is
        returned. Call on the stage's thread."""
        with self._write_lock:
            with self._lock:
                if q != self.applied + 1:
                    raise RuntimeError(f"Updates must be applied in order: got {q} after "
                                       f"{self.applied}.")
            if self._task_stage is not stage:   # traced with this stage
                self._task_stage = stage
                self._task_apply_fn = compiled_method(self._task_apply_impl,
                                                      reduce_retracing=True)
                self._task_metrics = None
            if more and metrics is None:
                raise ValueError("Several minibatches in one call need the VW's metric "
                                 f"state. Received: more={len(more)} minibatches, metrics=None.")
            if metrics is not None and self._task_metrics is not metrics:
                self._task_metrics = metrics   # traced with this state
                # Per-output loss trackers weigh by the static batch size: one trace
                # per batch size then (strategy/build.py).
                self._task_metrics_fn = compiled_method(
                    self._task_metrics_impl, reduce_retracing=not metrics.per_output)
            with tf.device(self.device):
                if metrics is not None:
                    batch = [(list(t), list(n), list(x), y_, w) for t, n, x, y_, w in
                             ((tvals, vvals, inputs, y, sample_weight), *more)]
                    out, versions = self._task_metrics_fn(batch, reset)
                else:
                    loss, y_pred, masks, t, n = self._task_apply_fn(
                        list(tvals), list(vvals), list(inputs), y, sample_weight)
                    out, versions = (loss, y_pred), [(t, n)]
                    for x, m in zip(keras.tree.flatten(y_pred), masks):
                        if m is not None:   # Keras masks do not cross a call's boundary
                            keras_graph.set_keras_mask(x, m)
            with self._lock:
                for i, (t, n) in enumerate(versions):
                    self._versions[q + i + self._n_m] = (q + i, tuple(t), tuple(n))
                self.applied = q + len(versions) - 1
        return out

    def state_after(self, q: int) -> tuple[tuple, tuple]:
        with self._lock:
            _, t, n = self._versions[q + self._n_m]
            return t, n

    def _rebase_impl(self, new, old, later):
        """w_local += new - old; every later version moves by the same delta. Returns the
        new values (copies: `new` may be another device's or a pulled tensor) and the
        moved versions."""
        # Pinned: without a device, the placer put these ops next to their input, the pulled
        # values' ps task, so every later version lived there and each forward read its
        # weights over the wire (3 model sizes a wave more; docs/cluster_jobs.md).
        with tf.device(self.device):
            new = [tf.identity(x) for x in new]
            delta = [a - b for a, b in zip(new, old)]
            for v, d in zip(self.variables, delta):
                keras_optimizer.variable_handle(v).assign_add(d)
            return new, [[x + d for x, d in zip(version, delta)] for version in later]

    def rebase(self, q: int, trainable: Sequence, non_trainable: Sequence) -> None:
        """Make w_local as of update q equal the given values, keeping later updates."""
        with self._write_lock, self._lock:
            last, t_old, n_old = self._versions[q + self._n_m]
            # Versions after q already taken: they move too.
            later = [p for p in self._versions if p > q + self._n_m]
            pulled = [*trainable, *non_trainable]
            # Hosted on the stage's task, which must find the pulled tensors (transport.py).
            transport.wait_for_other_tasks(self.device, pulled)
            with tf.device(self.device):
                new, moved = self._rebase_fn(
                    pulled, [*t_old, *n_old],
                    [[*self._versions[p][1], *self._versions[p][2]] for p in later])
            k = len(self.trainable)
            for p, values in zip(later, moved):
                self._versions[p] = (self._versions[p][0], tuple(values[:k]),
                                     tuple(values[k:]))
            self._versions[q + self._n_m] = (last, tuple(new[:k]), tuple(new[k:]))


class WeightVersions:
    """The stages' weights of one virtual worker and the record of which local updates
    each minibatch's weights reflected (minibatch id -> last update id)."""

    def __init__(self, stages: Sequence[StageWeights], history: int = DEFAULT_HISTORY):
        self.stages = list(stages)
        self.record: dict[int, int] = {}
        self._history = history
        self._cond = threading.Condition()

    @property
    def applied(self) -> int:
        """The last update applied on every stage."""
        return min(s.applied for s in self.stages)

    def start_run(self, first: int) -> None:
        done = {s.applied for s in self.stages}
        if len(done) != 1:   # a run starts only when every stage applied everything
            raise RuntimeError(f"Stages disagree on the updates applied: {sorted(done)}.")
        applied = done.pop()
        for s in self.stages:
            s.start_run(first, applied)

    def take(self, p: int, j: int) -> tuple[tuple, tuple]:
        """Stage j's version of minibatch p (recorded when stage 0 takes it)."""
        last, t, n = self.stages[j].take(p)
        if j == 0:
            self.record[p] = last
            while len(self.record) > self._history:
                del self.record[next(iter(self.record))]
        return t, n

    def forget(self, p: int) -> None:
        for s in self.stages:
            s.forget(p)
        self.record.pop(p, None)

    def apply(self, j: int, q: int, grads: Sequence, deltas: Sequence) -> None:
        self.stages[j].apply(q, grads, deltas)
        with self._cond:
            self._cond.notify_all()

    def apply_in_task(self, q: int, stage, *args, **kwargs):
        """`StageWeights.apply_in_task` of the only stage (`stage`): (loss, y_pred), or
        the VW's metric state with `metrics`."""
        result = self.stages[0].apply_in_task(q, stage, *args, **kwargs)
        with self._cond:
            self._cond.notify_all()
        return result

    def wait_applied(self, q: int, stop=lambda: False) -> bool:
        """Block until every stage applied update q (False if `stop()` became true)."""
        with self._cond:
            while self.applied < q:
                if stop():
                    return False
                self._cond.wait(0.05)
            return True

    # --- for the wave sync of several VWs ------------------------------------------------
    def state_after(self, q: int) -> dict[int, tf.Tensor]:
        """id(variable) -> its value right after update q, for every stage."""
        out = {}
        for s in self.stages:
            t, n = s.state_after(q)
            out.update(zip(map(id, s.variables), (*t, *n)))
        return out

    def rebase(self, q: int, values: dict[int, tf.Tensor]) -> None:
        """w_local right after update q := values (id(variable) -> value); later local
        updates are kept."""
        for s in self.stages:
            s.rebase(q, [values[id(v)] for v in s.trainable],
                     [values[id(v)] for v in s.non_trainable])


def _loss_and_outputs(total, y, y_pred, sample_weight):
    """`Stage.train_ops`' metrics function for `apply_in_task`: the loss, y_pred and its
    Keras masks (attached again after the call), for the metrics update the runtime makes
    after the call."""
    return total, y_pred, [keras_graph.keras_mask(x) for x in keras.tree.flatten(y_pred)]
