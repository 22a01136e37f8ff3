"""Keras features around a pipelined fit: validation, evaluate, predict, callbacks,
checkpoints; the pipeline is drained before anything reads weights or metrics."""

import os

import keras
import numpy as np
import tensorflow as tf

from hetpipe_tf.strategy import HetPipeStrategy, even_plan
from tests.strategy.helpers import DEVICES, assert_weights_close, regression_data, skip_model


def _strategy(n_m=2, k=2):
    return HetPipeStrategy(plan=lambda m: even_plan(m, DEVICES[:k], n_m=n_m))


def _dataset(x, y, batch=8):
    return tf.data.Dataset.from_tensor_slices((x, y)).batch(batch, drop_remainder=True)


def test_fit_validation_evaluate_predict_and_callbacks(tmp_path):
    x, y = regression_data(64)
    xv, yv = regression_data(32, seed=1)
    strategy = _strategy()
    with strategy.scope():
        model = skip_model()
        model.compile(keras.optimizers.SGD(0.05), "mse", metrics=["mae"])
    epoch_weights = []

    class Probe(keras.callbacks.Callback):
        def on_epoch_end(self, epoch, logs=None):
            rt = strategy.pipeline(self.model)
            # Epoch-end callbacks run after the drain: nothing in flight, weights final.
            assert rt.in_flight == 0 and rt.completed == 8 * (epoch + 1)
            epoch_weights.append(self.model.get_weights())

    ckpt = str(tmp_path / "best.weights.h5")
    callbacks = [
        Probe(),
        keras.callbacks.ModelCheckpoint(ckpt, save_weights_only=True, monitor="val_loss"),
        keras.callbacks.EarlyStopping(monitor="loss", patience=5),
        keras.callbacks.BackupAndRestore(str(tmp_path / "backup")),
    ]
    hist = model.fit(_dataset(x, y), validation_data=_dataset(xv, yv), epochs=3,
                     callbacks=callbacks, verbose=0)
    assert set(hist.history) == {"loss", "mae", "val_loss", "val_mae"}
    assert len(hist.history["loss"]) == 3
    assert hist.history["loss"][-1] < hist.history["loss"][0]
    # The epoch's logged loss is the mean over all 8 minibatches (every one completed).
    rt = strategy.pipeline(model)
    assert rt.completed == rt.submitted == 24
    # Validation metrics equal evaluate() on the weights at the end of the epoch.
    final = model.get_weights()
    assert_weights_close(epoch_weights[-1], final, atol=0)
    ev = model.evaluate(_dataset(xv, yv), return_dict=True, verbose=0)
    np.testing.assert_allclose(ev["loss"], hist.history["val_loss"][-1], rtol=1e-5)
    plain = skip_model()
    plain.set_weights(final)
    np.testing.assert_allclose(model.predict(xv, batch_size=8, verbose=0),
                               plain.predict(xv, batch_size=8, verbose=0), rtol=1e-5, atol=1e-6)
    # ModelCheckpoint saved the trained weights; load_weights restores them.
    assert os.path.exists(ckpt)
    with strategy.scope():
        other = skip_model(seed=7)
        other.compile(keras.optimizers.SGD(0.05), "mse")
    other.load_weights(ckpt)
    assert_weights_close(other.get_weights(), final, atol=0)
    model.save_weights(str(tmp_path / "final.weights.h5"))
    plain.load_weights(str(tmp_path / "final.weights.h5"))
    assert_weights_close(plain.get_weights(), final, atol=0)
    strategy.close()


def test_second_fit_continues_and_steps_per_epoch():
    x, y = regression_data(64)
    strategy = _strategy(n_m=3, k=3)
    with strategy.scope():
        model = skip_model()
        model.compile(keras.optimizers.Adam(0.01), "mse")
    ds = _dataset(x, y).repeat()
    model.fit(ds, epochs=2, steps_per_epoch=5, verbose=0)
    rt = strategy.pipeline(model)
    # Drained at each epoch end even though the dataset was not exhausted.
    assert rt.run_starts == [1, 6] and rt.completed == 10
    model.fit(ds, epochs=1, steps_per_epoch=3, verbose=0)
    assert rt.run_starts == [1, 6, 11] and rt.completed == 13 and rt.in_flight == 0
    assert int(model.optimizer.iterations.numpy()) == 13
    strategy.close()


def test_batchnorm_and_dropout_equal_plain_keras_at_n_m_1():
    x, y = regression_data(64)

    def build():
        keras.utils.set_random_seed(3)
        inp = keras.Input((8,))
        h = keras.layers.Dense(16, activation="relu", name="d1")(inp)
        h = keras.layers.BatchNormalization(name="bn")(h)
        h = keras.layers.Dropout(0.3, seed=11, name="drop")(h)
        h = keras.layers.Dense(8, activation="relu", name="d2")(h)
        out = keras.layers.Dense(1, name="out")(h)
        return keras.Model(inp, out)

    strategy = _strategy(n_m=1, k=3)
    with strategy.scope():
        model = build()
        model.compile(keras.optimizers.SGD(0.05), "mse")
    ref = build()
    ref.set_weights(model.get_weights())
    ref.compile(keras.optimizers.SGD(0.05), "mse")
    model.fit(x, y, batch_size=8, epochs=2, shuffle=False, verbose=0)
    ref.fit(x, y, batch_size=8, epochs=2, shuffle=False, verbose=0)
    # Weights, BatchNorm moving statistics and the dropout seed state all match.
    assert_weights_close(model.get_weights(), ref.get_weights(), atol=1e-5)
    bn = model.get_layer("bn")
    assert not np.allclose(bn.moving_mean.numpy(), 0.0)  # the statistics did move
    strategy.close()


def test_batchnorm_n_m_2_trains_and_keeps_statistics_finite():
    x, y = regression_data(64)
    strategy = _strategy(n_m=2, k=2)
    with strategy.scope():
        inp = keras.Input((8,))
        h = keras.layers.Dense(16, activation="relu")(inp)
        h = keras.layers.BatchNormalization(name="bn")(h)
        h = keras.layers.Dropout(0.2)(h)
        out = keras.layers.Dense(1)(h)
        model = keras.Model(inp, out)
        model.compile(keras.optimizers.Adam(0.01), "mse")
    hist = model.fit(x, y, batch_size=8, epochs=4, verbose=0)
    assert hist.history["loss"][-1] < hist.history["loss"][0]
    mv = model.get_layer("bn").moving_variance.numpy()
    assert np.all(np.isfinite(mv)) and np.all(mv > 0)
    strategy.close()
