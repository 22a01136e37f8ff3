"""Delay-compensated gradients (DC-ASGD, Zheng et al. 2017) on a stage's weight versions.

A stale gradient g = grad f(w_read) is applied to w_now, which holds updates w_read lacks.
DC-ASGD corrects it to first order, with the diagonal of the outer product g g^T standing
in for the Hessian (cheap and, for a log-likelihood loss, an unbiased estimate of it):

    g' = g + lambda_t * g * g * (w_now - w_read)     (elementwise),
    lambda_t = lambda_0 / sqrt(ms + eps),  ms <- m ms + (1 - m) g^2   (DC-ASGD-a: the
    adaptive variant, free of the gradients' scale; ms starts at the first g^2).

The corrected gradient then goes to the user's own optimizer (momentum SGD, Adam, ...).

DC-ASGD keeps each minibatch's w_read alive until its update; here it is never kept.
The stage's predictor already holds the last updates u_q (w after q - w before q), and
with them the difference is estimated, for minibatch q applied at N_m - 1 = k updates of
this VW after its version v = q - N_m (steady state):

    w_now - w_read ~ N (u_{q-1} + ... + u_{q-k})  -  [look-ahead]  N k u_{q-N_m},

the first term the local updates since v (and, as weight prediction assumes, the other
N - 1 VWs moving w_global about as much), the second the look-ahead the forward already
took (weight prediction, `look_ahead=True`; without it the forward read w_v). The first
N_m minibatches of a run (the pipeline filling) are corrected as if in steady state.

The extra state (the last N_m updates and ms) rides in the predictor's `d` list after the
N entries weight prediction reads, so `StageWeights` carries it with each version as it
carries d; nothing is a variable or in a checkpoint (an estimate, rebuilt from zero).
"""

from __future__ import annotations

from typing import Sequence

import tensorflow as tf

from hetpipe_tf.pipeline.weight_prediction import WeightPredictor

DEFAULT_LAMBDA = 2.0   # lambda_0 (docs/convergence.md: 1, 2, 4 and 8 measured; 2 best)
DEFAULT_MS_DECAY = 0.95   # m, DC-ASGD-a's value
_EPS = 1e-7


class DelayCompensatedPredictor(WeightPredictor):
    """A `WeightPredictor` whose stage also corrects each gradient for its delay.

    Args:
      device: the stage's device.
      n_m: minibatches in flight (the local delay is N_m - 1 updates).
      scale: N, the number of virtual workers (as WeightPredictor's).
      look_ahead: also forward at the predicted weights (weight prediction).
      lambda_0, ms_decay: DC-ASGD-a's constants.
    """

    def __init__(self, device: str, n_m: int, scale: float = 1.0, look_ahead: bool = True,
                 lambda_0: float = DEFAULT_LAMBDA, ms_decay: float = DEFAULT_MS_DECAY):
        super().__init__(device, beta=0.0, scale=scale)
        if n_m < 2:
            raise ValueError(f"Delay compensation needs local staleness. Received: "
                             f"n_m={n_m!r}; use n_m >= 2 or no compensation.")
        if lambda_0 < 0 or not 0.0 <= ms_decay < 1.0:
            raise ValueError(f"lambda_0 must be >= 0 and ms_decay in [0, 1). Received: "
                             f"lambda_0={lambda_0!r}, ms_decay={ms_decay!r}.")
        self.n_m = int(n_m)
        self.look_ahead = bool(look_ahead)
        self.lambda_0 = float(lambda_0)
        self.ms_decay = float(ms_decay)
        self._ms_next = None   # ms after the gradients of the update being traced

    # d = [u_{q-1} (n), u_{q-2} (n), ..., u_{q-N_m} (n), ms (n)]
    def initial(self, values: Sequence) -> list:
        if self.d is None:
            with tf.device(self.device):
                self.d = [tf.zeros_like(v) for v in values] * (self.n_m + 1)
        return self.d

    def horizon(self, p: int, last: int) -> float:
        return super().horizon(p, last) if self.look_ahead else 0.0

    def difference_ops(self, d: Sequence) -> list:
        """The estimate of w_now - w_read (module docstring), one tensor per weight."""
        n = len(d) // (self.n_m + 1)
        k = self.n_m - 1
        hist = [d[j * n:(j + 1) * n] for j in range(self.n_m)]   # hist[j] = u_{q-1-j}
        out = []
        for i in range(n):
            x = tf.add_n([hist[j][i] for j in range(k)])
            if self.look_ahead:
                x = x - k * hist[self.n_m - 1][i]
            out.append(self.scale * x)
        return out

    def correct_ops(self, grads: Sequence, before: Sequence, d: Sequence) -> list:
        """g' for each gradient (None stays None); called in the compiled update, before
        the optimizer applies them. `before` (w_now) is unused: the difference is
        estimated from d."""
        n = len(d) // (self.n_m + 1)
        ms_old = d[self.n_m * n:]
        diff = self.difference_ops(d)
        out, ms_new = [], []
        for g, ms, x in zip(grads, ms_old, diff):
            if g is None:
                out.append(None)
                ms_new.append(ms)
                continue
            g2 = tf.cast(g * g, ms.dtype)
            ms = tf.where(ms > 0, self.ms_decay * ms + (1.0 - self.ms_decay) * g2, g2)
            lam = self.lambda_0 / tf.sqrt(ms + _EPS)
            out.append(g + tf.cast(lam * g2 * x, g.dtype))
            ms_new.append(ms)
        self._ms_next = ms_new   # read by observe_ops in the same trace
        return out

    def observe_ops(self, d: Sequence, before: Sequence, after: Sequence) -> list:
        n = len(before)
        u = [a - b for a, b in zip(after, before)]
        ms = self._ms_next if self._ms_next is not None else list(d[self.n_m * n:])
        self._ms_next = None
        return u + list(d[:(self.n_m - 1) * n]) + list(ms)
