"""HetSeq mode: a synchronous step over unequal shares equals one step of plain Keras on
the concatenated batch on one device (weights, optimizer state, loss and metrics)."""

import keras
import numpy as np
import pytest

from hetpipe_tf.cluster.spec import Cluster
from hetpipe_tf.strategy import HetPipeStrategy
from tests.strategy.helpers import assert_weights_close, regression_data, skip_model

SPEEDS = [1.0, 1.0, 1.0, 0.5]


def _cluster(speeds=SPEEDS):
    return Cluster.local(["LOCAL_CPU"] * len(speeds), emulated_speed_factors=speeds)


def _classifier(seed=0, name="clf"):
    init = keras.initializers.GlorotUniform(seed=seed)
    inp = keras.Input((8,), name="x")
    h = keras.layers.Dense(16, activation="tanh", kernel_initializer=init, name="h",
                           kernel_regularizer=keras.regularizers.L2(1e-3))(inp)
    h = keras.layers.Dense(16, activation="relu", kernel_initializer=init, name="h2",
                           activity_regularizer=keras.regularizers.L1(1e-3))(h)
    out = keras.layers.Dense(3, activation="softmax", kernel_initializer=init, name="out")(h)
    return keras.Model(inp, out, name=name)


def _both(build, optimizer, loss, metrics, fit_kwargs, shares=None, speeds=SPEEDS):
    """(strategy, hetseq model, its history, reference model, its history)."""
    strategy = HetPipeStrategy(_cluster(speeds), data_parallel="hetseq", shares=shares)
    with strategy.scope():
        model = build()
        model.compile(optimizer(), loss, metrics=metrics)
    ref = build()
    ref.compile(optimizer(), loss, metrics=metrics)
    ref.set_weights(model.get_weights())
    h = model.fit(shuffle=False, verbose=0, **fit_kwargs)
    r = ref.fit(shuffle=False, verbose=0, **fit_kwargs)
    return strategy, model, h.history, ref, r.history


def _same_history(a, b):
    assert a.keys() == b.keys()
    for k in a:
        np.testing.assert_allclose(a[k], b[k], rtol=2e-5, atol=1e-6, err_msg=k)


@pytest.mark.parametrize("opt", [lambda: keras.optimizers.SGD(0.05),
                                 lambda: keras.optimizers.Adam(0.01)],
                         ids=["sgd", "adam"])
def test_a_step_over_unequal_shares_is_one_step_on_the_whole_batch(opt):
    x, y = regression_data(60, 0)   # 60 = 5 batches of 12, split [5, 3, 2, 2]
    strategy, model, h, ref, r = _both(lambda: skip_model(0), opt, "mse", ["mae"],
                                       dict(x=x, y=y, batch_size=12, epochs=2),
                                       shares=[5, 3, 2, 2])
    assert_weights_close(model.get_weights(), ref.get_weights())
    assert_weights_close(model.optimizer.variables, [v.numpy() for v in ref.optimizer.variables])
    _same_history(h, r)
    ex = strategy.executor(model)
    assert ex.completed == 10 and set(ex.splits) == {(5, 3, 2, 2)}
    strategy.close()


def test_sample_weights_class_weights_regularizers_and_metrics():
    rs = np.random.RandomState(1)
    x = rs.randn(48, 8).astype("float32")
    y = rs.randint(0, 3, size=(48,))
    sw = rs.uniform(0.1, 2.0, size=(48,)).astype("float32")
    metrics = ["accuracy"]
    opt = lambda: keras.optimizers.Adam(0.01)  # noqa: E731
    strategy, model, h, ref, r = _both(_classifier, opt, "sparse_categorical_crossentropy",
                                       metrics, dict(x=x, y=y, sample_weight=sw,
                                                     batch_size=16, epochs=2),
                                       shares=[7, 4, 3, 2])
    assert_weights_close(model.get_weights(), ref.get_weights())
    _same_history(h, r)
    strategy.close()
    strategy, model, h, ref, r = _both(_classifier, opt, "sparse_categorical_crossentropy",
                                       metrics, dict(x=x, y=y, class_weight={0: 0.5, 1: 2.0,
                                                                             2: 1.0},
                                                     batch_size=16, epochs=1),
                                       shares=[7, 4, 3, 2])
    assert_weights_close(model.get_weights(), ref.get_weights())
    _same_history(h, r)
    strategy.close()


def test_an_epochs_remainder_batch_is_split_in_proportion_and_trains():
    x, y = regression_data(30, 0)   # batches of 12, 12, 6
    strategy, model, h, ref, r = _both(lambda: skip_model(0),
                                       lambda: keras.optimizers.SGD(0.05), "mse", [],
                                       dict(x=x, y=y, batch_size=12, epochs=1),
                                       shares=[5, 3, 2, 2])
    ex = strategy.executor(model)
    assert list(ex.splits) == [(5, 3, 2, 2), (5, 3, 2, 2), (3, 1, 1, 1)]
    assert_weights_close(model.get_weights(), ref.get_weights())
    _same_history(h, r)
    strategy.close()


def test_planned_shares_follow_the_emulated_speed():
    x, y = regression_data(56, 0)
    strategy, model, h, ref, r = _both(lambda: skip_model(0),
                                       lambda: keras.optimizers.SGD(0.05), "mse", [],
                                       dict(x=x, y=y, batch_size=28, epochs=1))
    sizes = strategy.executor(model).shares.sizes
    assert sum(sizes) == 28 and sizes[3] < min(sizes[:3])
    assert sizes[3] == pytest.approx(sizes[0] / 2, abs=1)
    assert_weights_close(model.get_weights(), ref.get_weights())
    strategy.close()


def test_a_failing_device_stops_the_fit_with_its_error_and_training_goes_on_after():
    x, y = regression_data(48, 0)
    strategy = HetPipeStrategy(_cluster(), data_parallel="hetseq", shares=[3, 3, 1, 1])
    with strategy.scope():
        model = skip_model(0)
        model.compile(keras.optimizers.SGD(0.05), "mse")
    model.fit(x[:16], y[:16], batch_size=8, epochs=1, verbose=0)
    ex = strategy.executor(model)
    stage = ex.stages[2]
    original = stage.share_task

    def broken(*args, **kwargs):
        raise RuntimeError("device lost")

    stage.share_task = broken
    w = model.get_weights()
    with pytest.raises(RuntimeError, match="device lost"):
        model.fit(x, y, batch_size=8, epochs=1, verbose=0)
    assert ex.completed == ex.submitted   # the failed step was never applied
    assert ex.completed == 2 and ex.dropped >= 1
    assert_weights_close(model.get_weights(), w)
    stage.share_task = original
    model.fit(x, y, batch_size=8, epochs=1, verbose=0)   # the error was cleared
    assert ex.completed == 2 + 6
    strategy.close()
    assert ex.closed


def test_emulation_by_speeds_makes_each_share_take_its_predicted_time():
    from hetpipe_tf.partitioner.shares import DeviceSpeed
    x, y = regression_data(32, 0)
    strategy = HetPipeStrategy(_cluster([1.0, 1.0]), data_parallel="hetseq", shares=[6, 2])
    with strategy.scope():
        model = skip_model(0)
        model.compile(keras.optimizers.SGD(0.05), "mse")
    model.fit(x[:8], y[:8], batch_size=8, epochs=1, verbose=0)
    ex = strategy.executor(model)
    ex.emulate_speeds = (DeviceSpeed("a", 0.001), DeviceSpeed("b", 0.05))   # 6 ms, 100 ms
    model.fit(x, y, batch_size=8, epochs=1, verbose=0)
    assert min(list(ex.step_s)[-4:]) >= 0.1
    assert ex.stages[1].emulated_sleep_s > 0.3 and ex.stages[1].emulation_overruns == 0
    strategy.close()


def test_batchnorm_moving_mean_of_the_inputs_equals_the_whole_batchs():
    # BatchNorm on the inputs: each share's change of the moving mean, weighted by its
    # share, adds up to the whole batch's (the moving variance and the normalisation use
    # each share's own statistics, as MirroredStrategy without SyncBN: not compared).
    def build():
        inp = keras.Input((8,))
        h = keras.layers.BatchNormalization(name="bn")(inp)
        out = keras.layers.Dense(1, kernel_initializer=keras.initializers.GlorotUniform(0),
                                 name="out")(h)
        return keras.Model(inp, out)

    rs = np.random.RandomState(3)
    x = (rs.randn(24, 8) * 3 + 1).astype("float32")
    y = rs.randn(24, 1).astype("float32")
    strategy, model, h, ref, r = _both(build, lambda: keras.optimizers.SGD(0.05), "mse", [],
                                       dict(x=x, y=y, batch_size=12, epochs=1),
                                       shares=[5, 3, 2, 2])
    mm = model.get_layer("bn").moving_mean.numpy()
    np.testing.assert_allclose(mm, ref.get_layer("bn").moving_mean.numpy(), rtol=1e-5,
                               atol=1e-6)
    assert np.abs(mm).max() > 0.01   # it moved
    strategy.close()


def test_evaluate_and_predict_after_fit_see_the_trained_weights():
    x, y = regression_data(24, 0)
    strategy, model, h, ref, r = _both(lambda: skip_model(0),
                                       lambda: keras.optimizers.SGD(0.05), "mse", ["mae"],
                                       dict(x=x, y=y, batch_size=12, epochs=1,
                                            validation_data=(x[:8], y[:8])),
                                       shares=[5, 3, 2, 2])
    _same_history(h, r)   # val_loss and val_mae included
    np.testing.assert_allclose(model.evaluate(x, y, verbose=0), ref.evaluate(x, y, verbose=0),
                               rtol=1e-5)
    np.testing.assert_allclose(model.predict(x, verbose=0), ref.predict(x, verbose=0),
                               rtol=1e-5, atol=1e-6)
    strategy.close()
