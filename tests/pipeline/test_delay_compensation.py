"""Delay-compensated gradients (pipeline/delay_compensation.py) against a NumPy reference of
DC-ASGD-a's rule with the difference estimated from the last updates."""

import keras
import numpy as np
import pytest
import tensorflow as tf

from hetpipe_tf.pipeline.delay_compensation import DelayCompensatedPredictor
from hetpipe_tf.pipeline.weights import StageWeights
from tests.strategy.helpers import DEVICES


def reference(grads, n_m, scale, lr, lam, m, look_ahead, w0):
    """w after each update q and the values minibatch p's forward reads, for plain SGD,
    minibatch q applied once the pipeline holds N_m - 1 younger ones (written from the
    rule, not from the code)."""
    eps = 1e-7
    k = n_m - 1
    after, u = {0: w0.copy()}, {}
    ms = np.zeros_like(w0)
    for q in range(1, len(grads) + 1):
        g = grads[q]
        prev = [u.get(q - j, np.zeros_like(w0)) for j in range(1, n_m + 1)]
        diff = scale * (sum(prev[:k]) - (k * prev[n_m - 1] if look_ahead else 0.0))
        ms = np.where(ms > 0, m * ms + (1 - m) * g * g, g * g)
        g_c = g + lam / np.sqrt(ms + eps) * g * g * diff
        after[q] = after[q - 1] - lr * g_c
        u[q] = after[q] - after[q - 1]
    reads = {}
    for p in range(1, len(grads) + 1 + k):
        last = max(0, p - n_m)
        h = scale * (p - 1 - last) if look_ahead else 0.0
        reads[p] = after[last] + h * u.get(last, np.zeros_like(w0))
    return after, reads


@pytest.mark.parametrize("n_m,look_ahead", [(2, True), (3, True), (3, False)])
def test_stage_weights_apply_the_corrected_gradient(n_m, look_ahead):
    w0 = np.array([1.0, -1.0, 0.5], "float32")
    w = keras.Variable(w0)
    opt = keras.optimizers.SGD(0.1)
    opt.build([w])
    pred = DelayCompensatedPredictor(DEVICES[0], n_m=n_m, scale=2.0, look_ahead=look_ahead,
                                     lambda_0=0.5, ms_decay=0.9)
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
    after, expect_reads = reference(grads, n_m, 2.0, 0.1, 0.5, 0.9, look_ahead,
                                    w0.astype("float64"))
    np.testing.assert_allclose(w.numpy(), after[8], rtol=1e-5, atol=1e-6)
    for p, t in reads.items():
        np.testing.assert_allclose(t, expect_reads[p], rtol=1e-5, atol=1e-6, err_msg=f"p={p}")
    # The correction did something (the same run uncorrected ends elsewhere).
    plain = w0 - 0.1 * sum(grads.values())
    assert np.abs(w.numpy() - plain).max() > 1e-3


def test_lambda_zero_is_weight_prediction_and_bad_arguments_are_refused():
    pred = DelayCompensatedPredictor(DEVICES[0], n_m=2, lambda_0=0.0)
    g = [tf.constant([1.0, -2.0])]
    d = [tf.constant([0.5, 0.5]), tf.constant([0.1, 0.1]), tf.constant([0.0, 0.0])]
    np.testing.assert_array_equal(pred.correct_ops(g, [None], d)[0], [1.0, -2.0])
    assert pred.correct_ops([None], [None], d) == [None]
    with pytest.raises(ValueError, match="n_m=1"):
        DelayCompensatedPredictor(DEVICES[0], n_m=1)
    with pytest.raises(ValueError, match="lambda_0=-1"):
        DelayCompensatedPredictor(DEVICES[0], n_m=2, lambda_0=-1)
