"""Delay-compensated gradients (pipeline/delay_compensation.py) against a NumPy reference of
DC-ASGD-a's rule with the difference estimated from the last updates."""

import numpy as np
import pytest
import tensorflow as tf

from hetpipe_tf.pipeline.delay_compensation import DelayCompensatedPredictor
from tests.pipeline.corrections import (LR, W0, assert_run_matches, difference,
                                        expected_reads, gradients, run_stage)
from tests.strategy.helpers import DEVICES


def reference(grads, n_m, scale, lam, m, look_ahead):
    """w after each update q and the values minibatch p's forward reads, for plain SGD
    (tests/pipeline/corrections.run_stage's run)."""
    eps = 1e-7
    after, u = {0: W0.astype("float64")}, {}
    ms = np.zeros_like(after[0])
    for q in range(1, len(grads) + 1):
        g = grads[q]
        diff = difference(u, q, n_m, scale, look_ahead)
        ms = np.where(ms > 0, m * ms + (1 - m) * g * g, g * g)
        g_c = g + lam / np.sqrt(ms + eps) * g * g * diff
        after[q] = after[q - 1] - LR * g_c
        u[q] = after[q] - after[q - 1]
    return after, expected_reads(after, u, n_m, scale, look_ahead)


@pytest.mark.parametrize("n_m,look_ahead", [(2, True), (3, True), (3, False)])
def test_stage_weights_apply_the_corrected_gradient(n_m, look_ahead):
    pred = DelayCompensatedPredictor(DEVICES[0], n_m=n_m, scale=2.0, look_ahead=look_ahead,
                                     lambda_0=0.5, ms_decay=0.9)
    grads = gradients()
    w, reads = run_stage(pred, n_m, grads)
    after, expect_reads = reference(grads, n_m, 2.0, 0.5, 0.9, look_ahead)
    assert_run_matches(w, reads, after, expect_reads, grads)


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
