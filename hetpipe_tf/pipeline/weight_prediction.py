"""Staleness compensation that acts on weight versions: weight prediction (look-ahead).

Under HetPipe's local staleness (Section 4) minibatch p's gradient is taken at the version
w_v that reflects updates 1..p-N_m and applied to w_local, which by then also holds the
N_m - 1 updates in between. Weight prediction (Chen et al. 2018, the paper's reference
[6]; SpecTrain; PipeMare's look-ahead) takes the gradient at an estimate of the weights it
will be applied to instead:

    w^_p = w_v + k_p * d,   k_p = (p - 1) - v   (the local updates w_v misses),

where d is the stage's recent per-minibatch change of its weights (u_q = w after update q
minus w before it, measured, so it works for any Keras optimizer: for momentum SGD it is
the velocity SpecTrain extrapolates with, for Adam the moment-normalised step), smoothed
as d <- beta d + (1 - beta) u_q. d is snapshot with the version (right after update
p - N_m), so every stage predicts p's weights from the same point in time (no
layer-by-layer mixing). The stored versions, pushes, pulls and `rebase` are untouched:
only the values a forward reads move, and the update is applied to w_local as before.
Pulled global weights move w_local, not d (d is this VW's own velocity).

Gated (`gated=True`, what Compensation.PREDICT makes): each tensor looks ahead only while d
before its last update predicted that update with at most half the squared error of no
prediction, |u_q - d|^2 < |u_q|^2 / 2; else k_p is 0 for it. Momentum SGD's and Adam's
steps repeat and pass; RMSprop's without momentum are each minibatch's gradient scaled per
coordinate, do not repeat, and would move the forward away from the weights the update
lands on (docs/convergence.md "The defaults"). The gates are scalars kept after d's
tensors in the same state list.

This is an option (`Compensation.PREDICT`, pipeline/compensation.py); with
`Compensation.NONE` no predictor exists and `StageWeights` runs the paper's rules exactly
(docs/convergence.md). `delay_compensation.py` and `gap_aware.py` subclass it to also
correct each gradient.
"""

from __future__ import annotations

from typing import Sequence

import tensorflow as tf

from hetpipe_tf.pipeline.compiled import compiled_method


class WeightPredictor:
    """d (the smoothed per-minibatch change of one stage's trainable weights) and the
    look-ahead of a version by k steps of it. State is plain tensors on the stage's device
    (not variables: it is an estimate, rebuilt from zero at a new executor, never in a
    checkpoint). Calls happen under the owning StageWeights' lock."""

    def __init__(self, device: str, beta: float = 0.0, scale: float = 1.0,
                 gated: bool = False):
        if not 0.0 <= beta < 1.0:
            raise ValueError(f"The predictor's smoothing must be in [0, 1). Received: "
                             f"beta={beta!r}.")
        self.device = device
        self.beta = float(beta)
        self.scale = float(scale)
        self.gated = bool(gated)
        self.d: list | None = None   # zeros until the first update
        self.predicted = 0            # forwards that ran at predicted weights
        self._predict_fn = compiled_method(self._predict_impl, reduce_retracing=True)
        self._k: dict[float, tf.Tensor] = {}   # horizons as tensors (few distinct values)

    def observe_ops(self, d: Sequence, before: Sequence, after: Sequence) -> list:
        """d after one update, from d before it (ops for the caller's compiled apply;
        `before`/`after` are the trainable values around the update)."""
        u = [a - b for a, b in zip(after, before)]
        n = len(u)
        new = u if self.beta == 0.0 else [
            self.beta * x + (1.0 - self.beta) * y for x, y in zip(d[:n], u)]
        if not self.gated:
            return new
        # Each tensor's gate: whether its d before this update predicted the update with at
        # most half the squared error of no prediction, |u - d|^2 < |u|^2 / 2 (a cosine
        # above 3/4 between equal steps). Steps that carry momentum pass (SGD's velocity,
        # Adam's first moment); steps that do not repeat (RMSprop without momentum on noisy
        # gradients, an oscillation) fail, and their versions are read as they are.
        gates = [tf.cast(2.0 * tf.reduce_sum(tf.square(y - x)) < tf.reduce_sum(tf.square(y)),
                         y.dtype) for x, y in zip(d[:n], u)]
        return new + gates

    def correct_ops(self, grads: Sequence, before: Sequence, d: Sequence) -> list:
        """The gradients the optimizer applies (ops for the caller's compiled update):
        as they are here; `delay_compensation.DelayCompensatedPredictor` corrects them."""
        return list(grads)

    def initial(self, values: Sequence) -> list:
        """d before any update: zeros shaped as the stage's values."""
        if self.d is None:
            with tf.device(self.device):
                self.d = [tf.zeros_like(v) for v in values]
                if self.gated:   # closed until an update is predicted by the one before
                    self.d += [tf.zeros((), v.dtype) for v in values]
        return self.d

    def horizon(self, p: int, last: int) -> float:
        """Steps of d to look ahead for minibatch p whose version reflects updates 1..last."""
        return self.scale * max(0, p - 1 - last)

    def _predict_impl(self, values, d, k):
        if self.gated:
            n = len(values)
            return [v + tf.cast(k, v.dtype) * g * x
                    for v, x, g in zip(values, d[:n], d[n:])]
        return [v + tf.cast(k, v.dtype) * x for v, x in zip(values, d)]

    def predict(self, values: tuple, d: Sequence, k: float) -> tuple:
        """values + k * d on the stage's device (values unchanged when k == 0)."""
        if k == 0 or not values:
            return values
        self.predicted += 1
        with tf.device(self.device):
            if k not in self._k:   # one eager op per distinct horizon, not per minibatch
                self._k[k] = tf.constant(k, tf.float32)
            return tuple(self._predict_fn(list(values), list(d), self._k[k]))
