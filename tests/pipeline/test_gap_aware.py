"""Gap-Aware gradients (pipeline/gap_aware.py) against a NumPy reference of the rule with the
gap estimated from the last updates."""

import keras
import numpy as np
import pytest
import tensorflow as tf

from hetpipe_tf.pipeline.gap_aware import GapAwarePredictor
from hetpipe_tf.pipeline.weights import StageWeights
from tests.strategy.helpers import DEVICES


def reference(grads, n_m, scale, lr, m, look_ahead, w0):
    """w after each update q and the values minibatch p's forward reads, for plain SGD,
    minibatch q applied once the pipeline holds N_m - 1 younger ones (written from the
    rule, not from the code)."""
    k = n_m - 1
    after, u = {0: w0.copy()}, {}
    c2 = np.zeros_like(w0)
    for q in range(1, len(grads) + 1):
        prev = [u.get(q - j, np.zeros_like(w0)) for j in range(1, n_m + 1)]
        gap = np.abs(scale * (sum(prev[:k]) - (k * prev[n_m - 1] if look_ahead else 0.0)))
        c = np.sqrt(c2)
        penalty = 1.0 + np.where(c > 0, gap / np.where(c > 0, c, 1.0), 0.0)
        after[q] = after[q - 1] - lr * grads[q] / penalty
        u[q] = after[q] - after[q - 1]
        c2 = np.where(c2 > 0, m * c2 + (1 - m) * u[q] ** 2, u[q] ** 2)
    reads = {}
    for p in range(1, len(grads) + 1 + k):
        last = max(0, p - n_m)
        h = scale * (p - 1 - last) if look_ahead else 0.0
        reads[p] = after[last] + h * u.get(last, np.zeros_like(w0))
    return after, reads


@pytest.mark.parametrize("n_m,look_ahead", [(2, True), (3, True), (3, False)])
def test_stage_weights_apply_the_penalized_gradient(n_m, look_ahead):
    w0 = np.array([1.0, -1.0, 0.5], "float32")
    w = keras.Variable(w0)
    opt = keras.optimizers.SGD(0.1)
    opt.build([w])
    pred = GapAwarePredictor(DEVICES[0], n_m=n_m, scale=2.0, look_ahead=look_ahead,
                             step_decay=0.9)
    sw = StageWeights(DEVICES[0], [w], [], opt, n_m=n_m, predictor=pred)
    sw.start_run(1, 0)
    rs = np.random.RandomState(0)
    grads = {q: rs.randn(3).astype("float32") for q in range(1, 9)}
    reads = {}
    for p in range(1, 9 + n_m - 1):
        _, (t,), _ = sw.take(p)
        reads[p] = np.asarray(t)
        q = p - (n_m - 1)
        if 1 <= q <= 8:
            sw.apply(q, [tf.constant(grads[q])], [])
    after, expect_reads = reference(grads, n_m, 2.0, 0.1, 0.9, look_ahead,
                                    w0.astype("float64"))
    np.testing.assert_allclose(w.numpy(), after[8], rtol=1e-5, atol=1e-6)
    for p, t in reads.items():
        np.testing.assert_allclose(t, expect_reads[p], rtol=1e-5, atol=1e-6, err_msg=f"p={p}")
    # The penalty did something (the same run unpenalized ends elsewhere).
    plain = w0 - 0.1 * sum(grads.values())
    assert np.abs(w.numpy() - plain).max() > 1e-3


def test_no_gap_keeps_the_gradient_and_bad_arguments_are_refused():
    pred = GapAwarePredictor(DEVICES[0], n_m=2)
    g = [tf.constant([1.0, -2.0])]
    # u_{q-1} = u_{q-2}: the look-ahead took the whole move, no gap; C = 0: no penalty.
    d = [tf.constant([0.5, 0.5]), tf.constant([0.5, 0.5]), tf.constant([1.0, 0.0])]
    np.testing.assert_allclose(pred.correct_ops(g, [None], d)[0], [1.0, -2.0])
    # A gap of one average step halves the gradient (scale 1: N = 1).
    d = [tf.constant([1.5, 0.5]), tf.constant([0.5, 0.5]), tf.constant([1.0, 1.0])]
    np.testing.assert_allclose(pred.correct_ops(g, [None], d)[0], [0.5, -2.0])
    assert pred.correct_ops([None], [None], d) == [None]
    with pytest.raises(ValueError, match="n_m=1"):
        GapAwarePredictor(DEVICES[0], n_m=1)
    with pytest.raises(ValueError, match="step_decay=1.0"):
        GapAwarePredictor(DEVICES[0], n_m=2, step_decay=1.0)
