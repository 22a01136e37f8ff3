"""hetpipe_tf/strategy/vw_metrics.py: the metric state per virtual worker (VW), updated
inside each one-stage VW's in-task call, gives Keras the metrics of the shared-lock path
(the same counts exactly, the same values up to the order of float additions); a metric
whose state does not add keeps the shared path for the whole model."""

import keras
import numpy as np
import pytest

from hetpipe_tf.strategy import HetPipeStrategy, build, even_plan
from hetpipe_tf.strategy.vw_metrics import additive_metrics
from tests.strategy.helpers import DEVICES

SAMPLES, BATCH = 96, 8


def _model(name="clf") -> keras.Model:
    init = keras.initializers.GlorotUniform(seed=3)
    inp = keras.Input((6,))
    h = keras.layers.Dense(8, activation="tanh", kernel_initializer=init, name="h")(inp)
    return keras.Model(inp, keras.layers.Dense(1, activation="sigmoid",
                                               kernel_initializer=init, name="out")(h),
                       name=name)


def _data():
    rs = np.random.RandomState(0)
    x = rs.randn(SAMPLES, 6).astype("float32")
    y = (x[:, :1] + 0.3 * rs.randn(SAMPLES, 1) > 0).astype("float32")
    return x, y


class MaxSeen(keras.metrics.Metric):
    """A user's metric whose state does not add across VWs (a running maximum)."""

    def __init__(self, name="max_seen", **kwargs):
        super().__init__(name=name, **kwargs)
        self.top = self.add_variable(shape=(), initializer="zeros", name="top")

    def update_state(self, y_true, y_pred, sample_weight=None):
        self.top.assign(keras.ops.maximum(self.top, keras.ops.max(y_pred)))

    def result(self):
        return self.top


class Renamed(keras.metrics.MeanMetricWrapper):
    """A subclass that changes only __init__: Keras' update, additive."""

    def __init__(self, name="renamed_acc", **kwargs):
        super().__init__(fn=keras.metrics.binary_accuracy, name=name, **kwargs)


def _two_vw_plans(make=None) -> list:
    """2 one-stage VWs of the model `make()` builds (`_model` by default), N_m = 1."""
    probe = (make or _model)()
    return [even_plan(probe, [DEVICES[0]], n_m=1), even_plan(probe, [DEVICES[1]], n_m=1)]


def _fit(metrics, *, epochs=2, learning_rate=0.0):
    """2 one-stage VWs (N_m = 1, D = 1); SGD at `learning_rate` (0: every minibatch sees the
    same weights, so which VW takes which batch does not matter)."""
    x, y = _data()
    plans = _two_vw_plans()
    strategy = HetPipeStrategy(plan=plans, clock_distance=1, compensation="none")
    with strategy.scope():
        model = _model()
        model.compile(keras.optimizers.SGD(learning_rate), "binary_crossentropy",
                      metrics=metrics())
    history = model.fit(x, y, batch_size=BATCH, epochs=epochs, shuffle=False, verbose=0)
    counts = {v.path: float(v.numpy()) for m in model.metrics for v in m.variables
              if v.path.endswith("count")}
    training = strategy.extended.pipelines[id(model)]
    ev = model.evaluate(x, y, batch_size=BATCH, verbose=0, return_dict=True)
    strategy.close()
    return history.history, counts, training.vw_metrics, ev


def _metrics():
    return ["accuracy", keras.metrics.AUC(name="auc"), keras.metrics.Precision(name="prec"),
            Renamed()]


def test_per_vw_metrics_equal_the_shared_lock_paths(monkeypatch):
    per_vw, per_vw_counts, vm, per_vw_eval = _fit(_metrics)
    assert vm is not None and vm.active
    monkeypatch.setattr(build, "_vw_metrics", lambda *a, **k: None)   # the shared path
    shared, shared_counts, none, shared_eval = _fit(_metrics)
    assert none is None
    assert set(per_vw) == set(shared) == {"loss", "accuracy", "auc", "prec", "renamed_acc"}
    for key in shared:
        np.testing.assert_allclose(per_vw[key], shared[key], rtol=1e-5, err_msg=key)
    # Every minibatch of the last epoch counted once (the reset of epoch 2 reached the
    # VWs' copies), exactly.
    assert per_vw_counts == shared_counts
    assert set(per_vw_counts.values()) == {float(SAMPLES)}, per_vw_counts
    np.testing.assert_allclose(list(per_vw_eval.values()), list(shared_eval.values()),
                               rtol=1e-6)


def test_the_loss_alone_is_computed_on_the_host_and_matches(monkeypatch):
    per_vw, counts, vm, _ = _fit(lambda: None)
    assert vm is not None and vm.active and vm._means == [("loss", 0, 1)]
    monkeypatch.setattr(build, "_vw_metrics", lambda *a, **k: None)
    shared, shared_counts, _, _ = _fit(lambda: None)
    np.testing.assert_allclose(per_vw["loss"], shared["loss"], rtol=1e-6)
    assert counts == shared_counts == {"loss/count": float(SAMPLES)}


def test_a_converged_task_reports_accuracy_exactly_one():
    x, y = _data()
    y = (x[:, :1] > 0).astype("float32")   # separable
    plans = _two_vw_plans()
    with HetPipeStrategy(plan=plans, clock_distance=0, compensation="none") as strategy:
        with strategy.scope():
            model = _model()
            model.compile(keras.optimizers.Adam(0.05), "binary_crossentropy",
                          metrics=["accuracy"])
        history = model.fit(x * 3, y, batch_size=BATCH, epochs=8, shuffle=False, verbose=0)
        assert strategy.extended.pipelines[id(model)].vw_metrics.active
    assert history.history["accuracy"][-1] == 1.0, history.history
    assert max(history.history["accuracy"]) <= 1.0


def test_a_non_additive_metric_keeps_the_shared_path_for_the_whole_model():
    history, counts, vm, _ = _fit(lambda: ["accuracy", MaxSeen()], epochs=1)
    assert vm is None
    assert counts == {"accuracy/count": float(SAMPLES), "loss/count": float(SAMPLES)}
    assert 0.0 < history["max_seen"][0] <= 1.0


def test_additive_metrics_accepts_keras_own_updates_only():
    keras_own = [keras.metrics.Mean(), keras.metrics.Sum(), keras.metrics.AUC(),
                 keras.metrics.Precision(), keras.metrics.Recall(),
                 keras.metrics.BinaryAccuracy(), keras.metrics.MeanIoU(num_classes=2),
                 Renamed()]
    assert additive_metrics(keras_own)
    assert not additive_metrics([keras.metrics.Mean(), MaxSeen()])
    # Variables made at their first update: nothing to copy yet.
    assert not additive_metrics([keras.metrics.R2Score()])
    assert not additive_metrics([keras.metrics.F1Score()])


def test_a_reset_mid_epoch_counts_from_there():
    """`reset_metrics` from a batch callback: the logs and the epoch's metrics count only
    the minibatches after it (none counted twice, none from before)."""
    x, y = _data()
    plans = _two_vw_plans()
    with HetPipeStrategy(plan=plans, clock_distance=1, compensation="none") as strategy:
        with strategy.scope():
            model = _model()
            model.compile(keras.optimizers.SGD(0.0), "binary_crossentropy",
                          metrics=["accuracy"])

        class ResetAt(keras.callbacks.Callback):
            def on_train_batch_end(self, batch, logs=None):
                if batch == 3:
                    strategy.extended.drain()
                    model.reset_metrics()

        model.fit(x, y, batch_size=BATCH, epochs=1, shuffle=False, verbose=0,
                  callbacks=[ResetAt()])
        counts = {v.path: float(v.numpy()) for m in model.metrics for v in m.variables
                  if v.path.endswith("count")}
    assert counts == {"accuracy/count": SAMPLES - 4.0 * BATCH,
                      "loss/count": SAMPLES - 4.0 * BATCH}, counts


def _two_outputs(name="two") -> keras.Model:
    init = keras.initializers.GlorotUniform(seed=5)
    inp = keras.Input((6,))
    h = keras.layers.Dense(8, activation="tanh", kernel_initializer=init, name="h")(inp)
    a = keras.layers.Dense(1, activation="sigmoid", kernel_initializer=init, name="a")(h)
    b = keras.layers.Dense(1, kernel_initializer=init, name="b")(h)
    return keras.Model(inp, [a, b], name=name)


def _fit_two_outputs():
    x, y = _data()
    plans = _two_vw_plans(_two_outputs)
    with HetPipeStrategy(plan=plans, clock_distance=1, compensation="none") as strategy:
        with strategy.scope():
            model = _two_outputs()
            model.compile(keras.optimizers.SGD(0.0), ["binary_crossentropy", "mse"],
                          metrics=[["accuracy"], ["mae"]])
        # Batch 10: a remainder batch of 6, which the per-output trackers weigh by its
        # own size.
        history = model.fit(x, [y, x[:, :1]], batch_size=10, epochs=2, shuffle=False,
                            verbose=0)
        vm = strategy.extended.pipelines[id(model)].vw_metrics
        active = vm is not None and vm.active
    return history.history, active


def test_per_output_loss_trackers_and_metrics_of_two_outputs(monkeypatch):
    per_vw, active = _fit_two_outputs()
    assert active
    monkeypatch.setattr(build, "_vw_metrics", lambda *a, **k: None)
    shared, active = _fit_two_outputs()
    assert not active
    assert set(per_vw) == set(shared) and len(shared) >= 5, shared
    for key in shared:
        np.testing.assert_allclose(per_vw[key], shared[key], rtol=1e-5, err_msg=key)


if __name__ == "__main__":
    pytest.main([__file__])
