"""The gate of weight prediction (pipeline/weight_prediction.py, `gated=True`, what
Compensation.PREDICT / BOTH give every stage): a tensor's forward looks ahead only while its
last step was predicted by the step before better than by no prediction,
|u_q - u_{q-1}|^2 < |u_q|^2 / 2. Steps that do not repeat (RMSprop without momentum on noisy
gradients, an oscillation) read their version as it is, so the look-ahead cannot overshoot."""

import keras
import numpy as np
import tensorflow as tf

from hetpipe_tf.pipeline.compensation import Compensation
from hetpipe_tf.pipeline.weights import StageWeights
from tests.strategy.helpers import DEVICES


def _stage(values, n_m, lr=0.5, predictor=None):
    ws = [keras.Variable(np.asarray(v, "float32")) for v in values]
    opt = keras.optimizers.SGD(lr)
    opt.build(ws)
    predictor = predictor or Compensation.PREDICT.make_predictor(DEVICES[0], n_m)
    return ws, StageWeights(DEVICES[0], ws, [], opt, n_m=n_m, predictor=predictor)


def _drive(sw, grads, n_m):
    """Minibatches 1..len(grads) through one run: take p, apply p - (n_m - 1) after it;
    returns {p: (last update reflected, the values its forward read)}."""
    reads = {}
    sw.start_run(1, 0)
    for p in range(1, len(grads) + 1):
        last, t, _ = sw.take(p)
        reads[p] = (last, [np.asarray(x) for x in t])
        q = p - (n_m - 1)
        if q >= 1:
            sw.apply(q, [tf.constant(g) for g in grads[q - 1]], [])
    return reads


def test_an_oscillating_step_is_not_extrapolated():
    """SGD on gradients of alternating sign: every step undoes the one before, so the look-
    ahead would double the error of the weights a forward reads. The default's predictor
    reads each version as it is (an ungated one moves it by the last step)."""
    n_m, lr = 2, 0.5
    grads = [[np.array([1.0, -2.0], "float32") * (-1) ** q] for q in range(8)]
    _, sw = _stage([[0.0, 0.0]], n_m, lr)
    after = {0: np.zeros(2)}
    for q in range(1, 8):
        after[q] = after[q - 1] - lr * grads[q - 1][0]
    for p, (last, (t,)) in _drive(sw, grads, n_m).items():
        assert last == max(0, p - n_m)
        np.testing.assert_allclose(t, after[last], atol=1e-6)


def test_a_repeating_step_is_extrapolated():
    n_m, lr = 3, 0.25
    grads = [[np.array([1.0, -2.0], "float32") * (1 + 0.1 * q)] for q in range(9)]
    _, sw = _stage([[1.0, 1.0]], n_m, lr)
    after = {0: np.ones(2)}
    for q in range(1, 9):
        after[q] = after[q - 1] - lr * grads[q - 1][0]
    for p, (last, (t,)) in _drive(sw, grads, n_m).items():
        # The first update of a run has no step before it: no look-ahead from its version.
        k = (p - 1 - last) if last >= 2 else 0
        u = after[last] - after[last - 1] if last >= 1 else 0.0
        np.testing.assert_allclose(t, after[last] + k * u, rtol=1e-6, atol=1e-6)


def test_gates_are_per_tensor_and_equal_a_numpy_reference():
    """Two tensors, random gradients: one repeats its step with noise, the other is noise.
    Each forward reads after[v] + k * gate_v * u_v, gate_v = |u_v - u_{v-1}|^2 < |u_v|^2 / 2
    per tensor (u_0 = 0 at a run's start: closed)."""
    n_m, lr, steps = 2, 0.1, 24
    rs = np.random.RandomState(0)
    grads = [[np.float32(1.0) + 0.3 * rs.randn(3).astype("float32"),
              rs.randn(4).astype("float32")] for _ in range(steps)]
    ws, sw = _stage([np.zeros(3), np.zeros(4)], n_m, lr)
    reads = _drive(sw, grads, n_m)
    after = {0: [np.zeros(3), np.zeros(4)]}
    for q in range(1, steps):
        after[q] = [a - lr * g for a, g in zip(after[q - 1], grads[q - 1])]
    u = {q: [a - b for a, b in zip(after[q], after[q - 1])] for q in range(1, steps)}
    u[0] = [np.zeros(3), np.zeros(4)]
    opened = [0, 0]
    for p, (last, t) in reads.items():
        k = p - 1 - last
        for i in range(2):
            gate = (last >= 1 and 2 * np.sum((u[last][i] - u[last - 1][i]) ** 2)
                    < np.sum(u[last][i] ** 2))
            opened[i] += bool(gate) and k > 0
            np.testing.assert_allclose(t[i], after[last][i] + k * gate * u[last][i],
                                       rtol=1e-5, atol=1e-6)
    assert opened[0] > 15 and opened[1] < 15   # the repeating tensor looks ahead more
