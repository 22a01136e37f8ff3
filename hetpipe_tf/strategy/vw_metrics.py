"""The model's metrics with a copy of their state per virtual worker (VW).

Several one-stage VWs (each on its own task in a cluster job) update the model's metrics
every minibatch. Keras' metrics update their variables by read-modify-write, so on the
model's own variables the VWs' updates have to run one at a time, each as a call of its
own under a lock they share. Here each VW keeps its own copy of the metric STATE (the loss
tracker, the per-output loss trackers, the compiled metrics' variables) on its stage's
device, and its stage's task updates that copy inside the same compiled call as its
forward, backward and update (`StageWeights.apply_in_task`): no lock, since each VW writes
only its own copy. The call returns the copy's new values packed into one vector (one host
read: the read of the logs it replaces); the chief keeps each VW's latest state on the host.

What Keras sees: the logs (each train step's, `StepLogs`) are the metrics' results on the
SUM over VWs of their latest states, computed on the chief when Keras reads them (one
local compiled call, no variable touched: Keras' `StatelessScope`), and `get_metrics_result`
after a drain first assigns that sum to the model's metric variables (`publish`), so
epoch-end logs, callbacks and anything that reads the metric objects see every VW's
minibatches. A reset (`reset_metrics`: each epoch, each evaluate) clears the host states
and tells each VW to zero its copy at the start of its next call (inside that call: no
remote call at the reset); a VW's call that started before the reset is not counted after
it. The sum equals the state the shared path reaches (the same counts; the same sums up to
the order of float additions) when every metric's state ADDS across VWs: it starts at
zeros and each update adds the minibatch's contribution. That holds for Keras' own metric
classes (keras/src/metrics: Mean, Sum, every MeanMetricWrapper, the confusion-matrix
metrics with Precision, Recall and AUC, FBetaScore, IoU, R2Score: each update is
`var + value`, each reset zeros), so `additive_metrics` accepts a metric whose
`update_state` and `reset_state` are Keras' own (a subclass that changes only `__init__`
or `result` qualifies); any other metric (a user's class with its own update) keeps the
shared path for the whole model (strategy/build.py).
"""

from __future__ import annotations

import functools
import threading
from typing import Any, Callable, Sequence

import keras
import numpy as np
import tensorflow as tf

from hetpipe_tf import _shim as _keras_shim
from hetpipe_tf._shim import keras_metrics
from hetpipe_tf.cluster.local import host_cpu_device

_KERAS_METRICS = "keras.src.metrics."


@functools.cache
def _reset_flags() -> tuple:
    """(False, True) as host bool tensors, made once: the calls' `reset` argument (a
    tensor, so both values share one trace)."""
    with tf.init_scope():
        return tf.constant(False), tf.constant(True)


def _keras_own(metric, method: str) -> bool:
    fn = getattr(type(metric), method, None)
    return getattr(fn, "__module__", "").startswith(_KERAS_METRICS)


def state_metrics(model) -> list:
    """The metrics whose state the update of `build.py` writes: the loss tracker, the
    compiled loss's per-output trackers, the compiled metrics (each one, not their
    container)."""
    out = [_keras_shim.loss_tracker(model)]
    closs = _keras_shim.compile_loss(model)
    if closs is not None:
        out += list(closs.metrics)
    cm = _keras_shim.compile_metrics(model)
    if cm is not None:
        out += list(cm.metrics)
    return [m for m in out if m is not None]


def additive_metrics(metrics: Sequence) -> bool:
    """Whether every metric's state adds across VWs (module docstring): its update and
    reset are Keras' own, it has made its variables already (R2Score, F1Score and an AUC
    with multi_label and no num_labels make them at their first update), and its reset
    state is zeros."""
    for m in metrics:
        if not (_keras_own(m, "update_state") and _keras_own(m, "reset_state")):
            return False
        if not (m.variables and keras_metrics.state_built(m)):
            return False   # its variables are made at its first update (R2Score, F1Score)
        with tf.init_scope():
            if any(np.any(np.asarray(v) != 0) for v in m.stateless_reset_state()):
                return False
    return True


class VwMetrics:
    """The metric state of `metrics` (`state_metrics`), one copy per VW (module docstring).

    Args:
      update_state: update_state(loss, y, y_pred, sample_weight): the model's metrics
        update (build.py), traced here inside each VW's call against its copy.
      results: the model class's own `get_metrics_result`, bound (the logs' values).
      num_vws: the VWs that must each enroll an eligible pipeline (`enroll`) for the
        copies to be used; with fewer, `active` is False and the shared path runs.
      place_locally: the strategy's context keeping the caller's device scope.
      per_output: whether the state has per-output loss trackers (which weigh by the
        static batch size: one trace of the VWs' calls per batch size).
      shown: the model's metrics (`model.metrics`, what `results` reads): when each is
        one of `metrics` with Keras' `Mean.result` (the loss tracker alone, per-output
        trackers), the logs are computed on the host, without a call.
    """

    def __init__(self, metrics: Sequence, update_state: Callable, results: Callable,
                 num_vws: int, place_locally: Callable, per_output: bool = False,
                 shown: Sequence | None = None):
        self.variables = [v for m in metrics for v in m.variables]
        self._means = _host_means(metrics, self.variables, shown)
        self.per_output = per_output
        self._update_state = update_state
        self._results = results
        self._num_vws = num_vws
        self._place_locally = place_locally
        self._sizes = [int(np.prod(v.shape)) for v in self.variables]
        self._shapes = [tuple(v.shape) for v in self.variables]
        self._dtypes = [np.dtype(tf.as_dtype(v.dtype).as_numpy_dtype) for v in self.variables]
        self._lock = threading.Lock()
        self._copies: dict[int, _Copy] = {}
        self._eligible: dict[int, bool] = {}
        self._active: bool | None = None
        self._generation = 1
        self._seen: dict[int, int] = {}         # VW -> generation its copy counts from
        self._states: dict[int, np.ndarray] = {}   # VW -> its latest state (float64)
        self._version = 0
        self._logs: tuple[int, dict | None] = (0, None)
        self._result_fn = tf.function(self._result_impl)
        self._assign_fn = tf.function(self._assign_impl)

    # --- built with the runtimes ---------------------------------------------------------
    def enroll(self, vw: int, device: str, eligible: bool) -> None:
        """VW `vw`'s pipeline: `eligible` if its only stage (on `device`) updates the
        copy inside its task's call (`PipelineRuntime`); its copy is made here."""
        self._eligible[vw] = bool(eligible)
        if eligible and vw not in self._copies:
            with tf.init_scope(), self._place_locally(), tf.device(device):
                self._copies[vw] = _Copy(self, [
                    tf.Variable(tf.zeros(v.shape, v.dtype), trainable=False,
                                name=f"vw{vw}_metric_{i}")
                    for i, v in enumerate(self.variables)])

    @property
    def active(self) -> bool:
        """Every VW enrolled an eligible pipeline (fixed once all have enrolled)."""
        if self._active is None:
            if len(self._eligible) < self._num_vws:
                return False
            self._active = all(self._eligible.values())
        return self._active

    # --- a VW's minibatch (its stage thread) ---------------------------------------------
    def begin(self, vw: int) -> tuple[int, Any, "_Copy"]:
        """(generation, reset, copy) for VW `vw`'s next call: `reset` (a host bool tensor)
        is true when its copy still counts from before the last reset."""
        with self._lock:
            g = self._generation
            return g, _reset_flags()[self._seen.get(vw) != g], self._copies[vw]

    def store(self, vw: int, generation: int, values: np.ndarray) -> None:
        """VW `vw`'s state after its call (the call's packed output, read to the host);
        dropped if a reset came since `begin` (the next call zeroes the copy first)."""
        with self._lock:
            if generation != self._generation:
                return
            self._seen[vw] = generation
            self._states[vw] = np.asarray(values, np.float64)
            self._version += 1

    # --- what Keras reads (its thread) ---------------------------------------------------
    def _sums(self) -> list | None:
        """The sum over VWs of their latest states, one array per variable (None when no
        VW stored a state since the last reset). Call under `_lock`."""
        if not self._states:
            return None
        total = np.sum(list(self._states.values()), axis=0)
        out, k = [], 0
        for n, shape, dtype in zip(self._sizes, self._shapes, self._dtypes):
            out.append(total[k:k + n].reshape(shape).astype(dtype))
            k += n
        return out

    def logs(self) -> dict | None:
        """The metrics' results on the summed states, as host values (the same dict until
        a VW stores a new state or a reset comes); None before any state since a reset."""
        with self._lock:
            version, logs = self._logs
            if version == self._version:
                return logs
            sums = self._sums()
            if sums is None:
                logs = None
            elif self._means is not None:   # Mean.result on the host: no call
                logs = {name: _divide_no_nan(sums[i], sums[j]) for name, i, j in self._means}
            else:
                with tf.device(host_cpu_device()):
                    logs = {k: v.numpy() for k, v in self._result_fn(sums).items()}
            self._logs = (self._version, logs)
            return logs

    def _result_impl(self, sums):
        with keras.StatelessScope(state_mapping=list(zip(self.variables, sums))):
            return self._results()

    def _assign_impl(self, sums):
        for v, s in zip(self.variables, sums):
            v.assign(s)

    def publish(self) -> None:
        """The model's metric variables := the summed states (after a drain, before Keras
        reads them); nothing when no VW stored a state since the last reset."""
        with self._lock:
            sums = self._sums()
            if sums is not None:
                self._assign_fn(sums)

    def reset(self) -> None:
        """The model's metrics were reset: forget the states; each VW zeroes its copy at
        its next call."""
        with self._lock:
            self._generation += 1
            self._states.clear()
            self._version += 1


def _host_means(metrics: Sequence, variables: list, shown: Sequence | None):
    """[(name, index of total, index of count)] when every shown metric is one of
    `metrics` whose result is Keras' `Mean.result` (total / count, 0 for no count), else
    None."""
    if shown is None:
        return None
    at = {id(v): k for k, v in enumerate(variables)}
    out = []
    for m in shown:
        if (not any(m is x for x in metrics) or type(m).result is not keras.metrics.Mean.result
                or len(m.variables) != 2):
            return None
        total, count = m.variables   # Mean's own order (keras/src/metrics/reduction_metrics)
        out.append((m.name, at[id(total)], at[id(count)]))
    return out


def _divide_no_nan(total: np.ndarray, count: np.ndarray) -> np.ndarray:
    """`ops.divide_no_nan(total, cast(count))` as Mean.result computes it, on the host
    (the same IEEE division in the variables' dtype)."""
    count = count.astype(total.dtype)
    safe = np.where(count == 0, np.ones_like(count), count)
    return np.asarray(np.where(count == 0, np.zeros_like(total), total / safe))[()]


class _Copy:
    """One VW's copy of the metric state (variables on its stage's device)."""

    def __init__(self, owner: VwMetrics, variables: list):
        self.owner = owner
        self.variables = variables

    @property
    def per_output(self) -> bool:
        return self.owner.per_output

    def update_ops(self, reset, loss, y, y_pred, sample_weight):
        """Ops for the VW's compiled call: the copy (zeroed first if `reset`) updated by
        the model's metrics update, written back; returns its new values packed into one
        float64 vector (exact for float32 and int32 state)."""
        cur = [tf.where(reset, tf.zeros_like(r), r)
               for r in (v.read_value() for v in self.variables)]
        owner = self.owner
        with keras.StatelessScope(state_mapping=list(zip(owner.variables, cur))) as scope:
            owner._update_state(loss, y, y_pred, sample_weight)
        new = []
        for mv, c, x in zip(owner.variables, self.variables, cur):
            value = scope.get_current_value(mv)
            value = x if value is None else tf.cast(value, c.dtype)
            c.assign(value)
            new.append(value)
        return tf.concat([tf.reshape(tf.cast(x, tf.float64), [-1]) for x in new], 0)
