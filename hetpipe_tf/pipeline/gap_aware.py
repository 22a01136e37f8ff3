"""Gap-Aware staleness mitigation (Barkai, Hakimi and Schuster, ICLR 2020) on a stage's
weight versions.

A stale gradient g = grad f(w_read) is applied to w_now. Gap-Aware measures, per
coordinate, how far the weights moved in between in units of the average step, and divides
the gradient by it:

    g' = g / G,   G = 1 + |w_now - w_read| / C,   C = sqrt(EMA(u * u))   (elementwise),

C the root of an exponential moving average (decay 0.99) of the squared update u = w after
- w before the stage's own updates (measured, so the learning rate and the optimizer's
momentum or moments are in it and it works for any Keras optimizer; it starts at the first
u * u). A coordinate that moved as much as one average step since w_read has its gradient
halved; one that did not move (or whose moves cancelled) keeps it. The paper reports that
with it momentum helps asynchronous SGD; here it damps the coordinates that one stale
gradient would push furthest from where it was taken.

w_now - w_read is the estimate delay compensation uses (pipeline/delay_compensation.py):
nothing is kept per minibatch, it is built from the stage's last N_m updates, scaled for
the other VWs and less the look-ahead the forward already took. The corrected gradient
goes to the user's optimizer. The extra state (the last N_m updates and C * C) rides in
the predictor's d, as delay compensation's does (never a variable or in a checkpoint).
"""

from __future__ import annotations

from typing import Sequence

import tensorflow as tf

from hetpipe_tf.pipeline.delay_compensation import DelayCompensatedPredictor

DEFAULT_STEP_DECAY = 0.99   # of the EMA of u * u (docs/convergence.md)


class GapAwarePredictor(DelayCompensatedPredictor):
    """A `WeightPredictor` whose stage also divides each gradient by its gap. device,
    n_m, scale and look_ahead as `DelayCompensatedPredictor`'s; `step_decay`: the decay of
    the moving average of the squared update (in place of DC-ASGD's lambda_0, ms_decay)."""

    def __init__(self, device: str, n_m: int, scale: float = 1.0, look_ahead: bool = True,
                 step_decay: float = DEFAULT_STEP_DECAY):
        if not 0.0 <= step_decay < 1.0:
            raise ValueError(f"step_decay must be in [0, 1). Received: "
                             f"step_decay={step_decay!r}.")
        super().__init__(device, n_m, scale=scale, look_ahead=look_ahead)
        self.step_decay = float(step_decay)

    # d = [u_{q-1} (n), ..., u_{q-N_m} (n), C * C (n)]: delay compensation's layout, the
    # last block the mean square of the updates instead of the gradients'.
    def correct_ops(self, grads: Sequence, before: Sequence, d: Sequence) -> list:
        """g / G for each gradient (None stays None), in the compiled update."""
        n = len(d) // (self.n_m + 1)
        out = []
        for g, c2, x in zip(grads, d[self.n_m * n:], self.difference_ops(d)):
            if g is None:
                out.append(None)
                continue
            c = tf.sqrt(c2)
            # C = 0 only where no update has moved the coordinate yet (then x = 0 too).
            gap = tf.where(c > 0, tf.abs(x) / tf.where(c > 0, c, tf.ones_like(c)),
                           tf.zeros_like(c))
            out.append(g / tf.cast(1.0 + gap, g.dtype))
        return out

    def observe_ops(self, d: Sequence, before: Sequence, after: Sequence) -> list:
        n = len(before)
        u = [a - b for a, b in zip(after, before)]
        m = self.step_decay
        c2 = [tf.where(old > 0, m * old + (1.0 - m) * x * x, x * x)
              for old, x in zip(d[self.n_m * n:], u)]
        return u + list(d[:(self.n_m - 1) * n]) + c2
