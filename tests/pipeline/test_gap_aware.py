"""Gap-Aware gradients (pipeline/gap_aware.py) against a NumPy reference of the rule with the
gap estimated from the last updates."""

import numpy as np
import pytest
import tensorflow as tf

from hetpipe_tf.pipeline.gap_aware import GapAwarePredictor
from tests.pipeline.corrections import (LR, W0, assert_run_matches, difference,
                                        expected_reads, gradients, run_stage)
from tests.strategy.helpers import DEVICES


def reference(grads, n_m, scale, m, look_ahead):
    """w after each update q and the values minibatch p's forward reads, for plain SGD
    (tests/pipeline/corrections.run_stage's run)."""
    after, u = {0: W0.astype("float64")}, {}
    c2 = np.zeros_like(after[0])
    for q in range(1, len(grads) + 1):
        gap = np.abs(difference(u, q, n_m, scale, look_ahead))
        c = np.sqrt(c2)
        penalty = 1.0 + np.where(c > 0, gap / np.where(c > 0, c, 1.0), 0.0)
        after[q] = after[q - 1] - LR * grads[q] / penalty
        u[q] = after[q] - after[q - 1]
        c2 = np.where(c2 > 0, m * c2 + (1 - m) * u[q] ** 2, u[q] ** 2)
    return after, expected_reads(after, u, n_m, scale, look_ahead)


@pytest.mark.parametrize("n_m,look_ahead", [(2, True), (3, True), (3, False)])
def test_stage_weights_apply_the_penalized_gradient(n_m, look_ahead):
    pred = GapAwarePredictor(DEVICES[0], n_m=n_m, scale=2.0, look_ahead=look_ahead,
                             step_decay=0.9)
    grads = gradients()
    w, reads = run_stage(pred, n_m, grads)
    after, expect_reads = reference(grads, n_m, 2.0, 0.9, look_ahead)
    assert_run_matches(w, reads, after, expect_reads, grads)


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
