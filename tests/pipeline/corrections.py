"""What the tests of the gradient corrections (test_delay_compensation.py, test_gap_aware.py)
share: a run of one stage's weight versions under a predictor, and the parts of the NumPy
references that do not depend on the correction (written from the rules, not the code)."""

import keras
import numpy as np
import tensorflow as tf

from hetpipe_tf.pipeline.weights import StageWeights
from tests.strategy.helpers import DEVICES

W0 = np.array([1.0, -1.0, 0.5], "float32")
LR, UPDATES = 0.1, 8


def gradients() -> dict[int, np.ndarray]:
    rs = np.random.RandomState(0)
    return {q: rs.randn(3).astype("float32") for q in range(1, UPDATES + 1)}


def run_stage(predictor, n_m: int, grads: dict) -> tuple[np.ndarray, dict]:
    """Plain SGD on one stage: minibatch q applied once the pipeline holds N_m - 1 younger
    ones. The final weights, and the values each minibatch's forward read."""
    w = keras.Variable(W0)
    opt = keras.optimizers.SGD(LR)
    opt.build([w])
    sw = StageWeights(DEVICES[0], [w], [], opt, n_m=n_m, predictor=predictor)
    sw.start_run(1, 0)
    reads = {}
    for p in range(1, UPDATES + n_m):
        _, (t,), _ = sw.take(p)
        reads[p] = np.asarray(t)
        q = p - (n_m - 1)
        if 1 <= q <= UPDATES:
            sw.apply(q, [tf.constant(grads[q])], [])
    return w.numpy(), reads


def difference(u: dict, q: int, n_m: int, scale: float, look_ahead: bool) -> np.ndarray:
    """The estimate of w_now - w_read for update q from the last N_m updates u."""
    k = n_m - 1
    prev = [u.get(q - j, np.zeros_like(W0, "float64")) for j in range(1, n_m + 1)]
    return scale * (sum(prev[:k]) - (k * prev[n_m - 1] if look_ahead else 0.0))


def expected_reads(after: dict, u: dict, n_m: int, scale: float, look_ahead: bool) -> dict:
    """The values minibatch p's forward reads: its version, moved ahead when predicting."""
    reads = {}
    for p in range(1, len(after) + n_m - 1):
        last = max(0, p - n_m)
        h = scale * (p - 1 - last) if look_ahead else 0.0
        reads[p] = after[last] + h * u.get(last, np.zeros_like(W0, "float64"))
    return reads


def assert_run_matches(w, reads, after, expect_reads, grads) -> None:
    np.testing.assert_allclose(w, after[UPDATES], rtol=1e-5, atol=1e-6)
    for p, t in reads.items():
        np.testing.assert_allclose(t, expect_reads[p], rtol=1e-5, atol=1e-6, err_msg=f"p={p}")
    # The correction did something (the same run uncorrected ends elsewhere).
    plain = W0 - LR * sum(grads.values())
    assert np.abs(w - plain).max() > 1e-3
