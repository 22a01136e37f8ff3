"""Weight prediction on weight versions (pipeline/weight_prediction.py): the values a forward
reads are its version moved ahead by the missing local updates times the last update,
while the stored versions, and so the updates, stay the paper's."""

import keras
import numpy as np
import pytest
import tensorflow as tf

from hetpipe_tf.pipeline.weight_prediction import WeightPredictor
from hetpipe_tf.pipeline.weights import StageWeights
from tests.strategy.helpers import DEVICES


def test_a_smoothing_outside_zero_to_one_is_refused():
    with pytest.raises(ValueError, match="beta"):
        WeightPredictor(DEVICES[0], beta=1.0)


def test_observe_is_the_update_or_its_average():
    before, after, d = [tf.constant([1.0, 2.0])], [tf.constant([0.0, 4.0])], [tf.ones(2)]
    np.testing.assert_array_equal(WeightPredictor(DEVICES[0]).observe_ops(d, before, after)[0],
                                  [-1.0, 2.0])
    np.testing.assert_array_equal(
        WeightPredictor(DEVICES[0], beta=0.5).observe_ops(d, before, after)[0], [0.0, 1.5])
    p = WeightPredictor(DEVICES[0], scale=2.0)
    assert p.horizon(p=5, last=3) == 2.0 and p.horizon(p=4, last=3) == 0.0


def test_stage_weights_predict_from_the_last_update_and_keep_versions_exact():
    """N_m = 3, SGD: take(p) = w after update p-3 + (2 or fewer) x (that update); the
    updates themselves are applied to the unpredicted w_local."""
    w = keras.Variable(np.array([1.0, -1.0], "float32"))
    opt = keras.optimizers.SGD(0.5)
    opt.build([w])
    sw = StageWeights(DEVICES[0], [w], [], opt, n_m=3, predictor=WeightPredictor(DEVICES[0]))
    sw.start_run(1, 0)
    live = np.array([1.0, -1.0])
    versions, grads = {}, {}
    for p in range(1, 9):
        last, (t,), _ = sw.take(p)
        versions[p] = (last, np.asarray(t))
        g = np.array([p, -2.0 * p], "float32")
        grads[p] = g
        if p >= 3:   # complete minibatch p - 2 (two in flight behind p): u = -0.5 g
            q = p - 2
            sw.apply(q, [tf.constant(grads[q])], [])
            live = live - 0.5 * grads[q]
    # Reference: w after q and u_q from the gradients, independently of the code.
    after = {0: np.array([1.0, -1.0])}
    for q in range(1, 7):
        after[q] = after[q - 1] - 0.5 * grads[q]
    for p, (last, t) in versions.items():
        expect_last = max(0, p - 3)
        assert last == expect_last
        u = after[last] - after[last - 1] if last >= 1 else 0.0
        np.testing.assert_allclose(t, after[last] + (p - 1 - last) * u, rtol=1e-6)
    np.testing.assert_allclose(w.numpy(), live, rtol=1e-6)   # w_local itself unpredicted
    assert sw.predictor.predicted == 8 - 1   # p = 1 misses nothing: read as it is
