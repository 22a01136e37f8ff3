"""Mixed precision (issue 8 point 8; docs/validation.md).

`mixed_bfloat16` (no loss scaling) trains like plain Keras under the same policy: at N_m = 1
one virtual worker of 1 or 2 stages equals the model trained by Keras' own `fit`, within a
tolerance fitting bfloat16, and that tolerance is tight enough to tell bfloat16 from float32
training (so the test fails if the policy were ignored). `mixed_float16` (a
LossScaleOptimizer) is refused before training: tests/strategy/test_bad_inputs.py.
"""

import keras
import numpy as np
import pytest

from hetpipe_tf.strategy import HetPipeStrategy, even_plan
from tests.strategy.helpers import DEVICES, regression_data, skip_model

OPTIMIZERS = {
    "sgd": lambda: keras.optimizers.SGD(0.05),
    "adam": lambda: keras.optimizers.Adam(0.01),
}
BATCH, EPOCHS, EXAMPLES = 8, 2, 64
# Tolerance on the weight updates (w - w0), relative to the largest update: one bfloat16
# step (8 significant bits, 2**-8 = 0.004), so the pipeline and Keras may round a value
# differently, while bfloat16 and float32 training differ by more (checked below).
TOL = 2.0 ** -8


@pytest.fixture
def bfloat16_policy():
    keras.mixed_precision.set_global_policy("mixed_bfloat16")
    try:
        yield
    finally:
        keras.mixed_precision.set_global_policy("float32")


def _plain_keras(w0, opt, x, y):
    ref = skip_model(0)
    ref.set_weights(w0)
    ref.compile(OPTIMIZERS[opt](), "mse")
    hist = ref.fit(x, y, batch_size=BATCH, epochs=EPOCHS, shuffle=False, verbose=0)
    return ref, hist.history["loss"]


def _update_gap(w, ref, w0) -> float:
    """max |(w - w0) - (ref - w0)| / max |ref - w0| over every weight."""
    scale = max(float(np.max(np.abs(r - a))) for r, a in zip(ref, w0))
    return max(float(np.max(np.abs(u - r))) for u, r in zip(w, ref)) / scale


def _data():
    # Inputs offset by 8: bfloat16 rounds them (a step of 1/16 near 8), so training under
    # the policy differs clearly from float32 training.
    x, y = regression_data(EXAMPLES, 0)
    return x + 8.0, y


@pytest.mark.parametrize("num_stages,opt", [(1, "sgd"), (2, "sgd"), (2, "adam")])
def test_bfloat16_at_n_m_1_equals_plain_keras_under_the_same_policy(
        bfloat16_policy, num_stages, opt):
    x, y = _data()
    strategy = HetPipeStrategy(plan=lambda m: even_plan(m, DEVICES[:num_stages], n_m=1))
    try:
        with strategy.scope():
            model = skip_model(0)
            model.compile(OPTIMIZERS[opt](), "mse")
        # The policy reached the strategy's model: bfloat16 compute, float32 weights.
        dense = model.get_layer("d1")
        assert dense.compute_dtype == "bfloat16" and dense.variable_dtype == "float32"
        w0 = model.get_weights()
        hist = model.fit(x, y, batch_size=BATCH, epochs=EPOCHS, shuffle=False, verbose=0)
    finally:
        strategy.close()
    ref, ref_loss = _plain_keras(w0, opt, x, y)
    assert ref.get_layer("d1").compute_dtype == "bfloat16"
    assert _update_gap(model.get_weights(), ref.get_weights(), w0) <= TOL
    np.testing.assert_allclose(hist.history["loss"], ref_loss, rtol=TOL)
    assert all(w.dtype == np.float32 for w in model.get_weights())

    # Guard against a vacuous tolerance: the same training in float32 lands farther from
    # the bfloat16 reference than the tolerance, so ignoring the policy would fail above.
    keras.mixed_precision.set_global_policy("float32")
    f32, _ = _plain_keras(w0, opt, x, y)
    assert f32.get_layer("d1").compute_dtype == "float32"
    assert _update_gap(f32.get_weights(), ref.get_weights(), w0) > 2 * TOL
