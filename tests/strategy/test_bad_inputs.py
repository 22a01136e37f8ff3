"""Bad input raises a clear ValueError before training starts (nothing half-trained)."""

import keras
import numpy as np
import pytest
import tensorflow as tf

from hetpipe_tf.strategy import HetPipeStrategy, StageSpec, even_plan, manual_plan
from tests.strategy.helpers import DEVICES, assert_weights_close, regression_data, skip_model


def _strategy(n_m=2, k=2):
    return HetPipeStrategy(plan=lambda m: even_plan(m, DEVICES[:k], n_m=n_m))


def _fit_raises(model, match, x=None, y=None, **kw):
    if x is None:
        x, y = regression_data(32)
    w0 = model.get_weights()
    with pytest.raises(ValueError, match=match) as info:
        model.fit(x, y, batch_size=kw.pop("batch_size", 8), epochs=1, verbose=0, **kw)
    assert "Received:" in str(info.value)
    assert_weights_close(model.get_weights(), w0, atol=0)  # nothing was trained
    return info.value


def test_model_overriding_train_step():
    class Custom(keras.Model):
        def train_step(self, data):
            return super().train_step(data)

    strategy = _strategy()
    with strategy.scope():
        inp = keras.Input((8,))
        model = Custom(inp, keras.layers.Dense(1)(keras.layers.Dense(4)(inp)))
        model.compile("sgd", "mse")
    _fit_raises(model, "overrides train_step")


def test_dataset_with_varying_batch_size():
    strategy = _strategy()
    with strategy.scope():
        model = skip_model()
        model.compile("sgd", "mse")
    x, y = regression_data(70)  # 70 = 4 x 16 + 6: the last batch is smaller
    err = _fit_raises(model, "batch size", x, y, batch_size=16)
    assert "drop_remainder=True" in str(err)
    ds = tf.data.Dataset.from_tensor_slices((x, y)).batch(16)
    with pytest.raises(ValueError, match="drop_remainder"):
        model.fit(ds, epochs=1, verbose=0)


def test_n_m_larger_than_max_m():
    with pytest.raises(ValueError, match=r"N_m exceeds Max_m.*Received: n_m=5, max_m=3"):
        HetPipeStrategy(plan=even_plan(skip_model(), DEVICES[:2], n_m=5), max_m=3)
    with pytest.raises(ValueError, match="larger than the N_m the plan was made for"):
        HetPipeStrategy(plan=even_plan(skip_model(), DEVICES[:2], n_m=2), n_m=4)
    with pytest.raises(ValueError, match="positive integer"):
        HetPipeStrategy(plan=even_plan(skip_model(), DEVICES[:2], n_m=2), n_m=0)


def test_plan_that_does_not_match_the_model():
    inp = keras.Input((8,))
    other = keras.Model(inp, keras.layers.Dense(1, name="only")(inp))
    strategy = HetPipeStrategy(plan=manual_plan(other, [StageSpec(DEVICES[0], 1)], n_m=1))
    with strategy.scope():
        model = skip_model()
        model.compile("sgd", "mse")
    _fit_raises(model, "does not match the model")


@pytest.mark.parametrize("bad", ["stateful", "mask", "shared"])
def test_layers_the_runtime_cannot_place(bad):
    strategy = _strategy(k=2)
    with strategy.scope():
        if bad == "stateful":
            inp = keras.Input((3, 8), batch_size=8)
            h = keras.layers.SimpleRNN(4, stateful=True)(inp)
            match = "stateful=True"
        elif bad == "mask":
            inp = keras.Input((3,))
            h = keras.layers.Embedding(10, 4, mask_zero=True)(inp)
            h = keras.layers.Flatten()(h)
            match = "mask_zero=True"
        else:
            inp = keras.Input((8,))
            shared = keras.layers.Dense(8, name="shared")
            h = shared(shared(inp))
            match = "shared layer"
        model = keras.Model(inp, keras.layers.Dense(1)(h))
        model.compile("sgd", "mse")
    if bad == "stateful":
        x = np.zeros((16, 3, 8), "float32")
    elif bad == "mask":
        x = np.ones((16, 3), "int32")
    else:
        x = np.zeros((16, 8), "float32")
    _fit_raises(model, match, x, np.zeros((16, 1), "float32"))


def test_model_created_outside_scope_or_subclassed():
    strategy = _strategy()
    model = skip_model()
    with strategy.scope():
        model.compile("sgd", "mse")
    _fit_raises(model, "scope")

    class Sub(keras.Model):
        def __init__(self):
            super().__init__()
            self.d = keras.layers.Dense(1)

        def call(self, x):
            return self.d(x)

    with strategy.scope():
        sub = Sub()
        sub.compile("sgd", "mse")
        sub(np.zeros((1, 8), "float32"))
    _fit_raises(sub, "Functional")


def test_strategy_without_devices():
    with pytest.raises(ValueError, match="needs the virtual worker's devices"):
        HetPipeStrategy()
