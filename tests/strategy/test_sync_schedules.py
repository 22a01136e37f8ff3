"""GPipe and 1F1B under model.fit: each minibatch split into micro-batches equals plain
Keras' fit on one device (weights, loss and metrics), for 1, 2 and 4 stages, SGD and
Adam, a model with skips across stages and a nested backbone, with and without
re-materialization; several VWs with D = 0 are synchronous data parallelism; bad input
is refused before training."""

import keras
import numpy as np
import pytest
import tensorflow as tf

import hetpipe_tf as hp
from hetpipe_tf.core.sync_schedule import Schedule
from hetpipe_tf.pipeline.sync_runtime import SyncPipelineRuntime
from hetpipe_tf.strategy import HetPipeStrategy, even_plan
from tests.strategy.helpers import (DEVICES, assert_weights_close, nested_model,
                                    regression_data, skip_model)

OPTS = {"sgd": lambda: keras.optimizers.SGD(0.05),
        "adam": lambda: keras.optimizers.Adam(0.01)}


def _fit_both(build, k, schedule, m, opt, remat=False, n=40, batch=8, epochs=1):
    x, y = regression_data(n, seed=k)
    strategy = HetPipeStrategy(plan=even_plan(build(), DEVICES[:k], n_m=1),
                               schedule=schedule, micro_batches=m, rematerialize=remat)
    with strategy.scope():
        model = build()
        model.compile(OPTS[opt](), "mse", metrics=["mae"])
    w0 = model.get_weights()
    got = model.fit(x, y, batch_size=batch, epochs=epochs, shuffle=False, verbose=0)
    ref = build()
    ref.set_weights(w0)
    ref.compile(OPTS[opt](), "mse", metrics=["mae"])
    want = ref.fit(x, y, batch_size=batch, epochs=epochs, shuffle=False, verbose=0)
    return strategy, model, ref, got.history, want.history


CASES = [(skip_model, k, s, "sgd", False) for k in (1, 2, 4)
         for s in (Schedule.GPIPE, Schedule.ONE_F_ONE_B)]
CASES += [(skip_model, 2, s, "adam", False) for s in (Schedule.GPIPE, Schedule.ONE_F_ONE_B)]
CASES += [(nested_model, 4, Schedule.ONE_F_ONE_B, "adam", False),
          (nested_model, 2, Schedule.GPIPE, "sgd", True),
          (skip_model, 4, Schedule.ONE_F_ONE_B, "sgd", True)]


@pytest.mark.parametrize("build, k, schedule, opt, remat", CASES)
def test_fit_equals_plain_keras(build, k, schedule, opt, remat):
    strategy, model, ref, got, want = _fit_both(build, k, schedule, 4, opt, remat, epochs=2)
    assert isinstance(strategy.pipeline(model), SyncPipelineRuntime)
    assert_weights_close(model.get_weights(), ref.get_weights())
    for key in ("loss", "mae"):
        np.testing.assert_allclose(got[key], want[key], rtol=1e-5, atol=1e-6)
    assert model.optimizer.iterations.numpy() == ref.optimizer.iterations.numpy() == 10
    strategy.close()


def _embedding_model():
    keras.utils.set_random_seed(3)
    x = keras.Input((6,), dtype="int32")
    h = keras.layers.Embedding(20, 4, name="emb")(x)
    h = keras.layers.GlobalAveragePooling1D(name="pool")(h)
    h = keras.layers.Dense(8, activation="tanh", name="mid")(h)
    return keras.Model(x, keras.layers.Dense(1, name="out")(h))


@pytest.mark.parametrize("schedule", [Schedule.GPIPE, Schedule.ONE_F_ONE_B])
@pytest.mark.parametrize("opt", ["sgd", "adam"])
def test_sparse_gradients_of_an_embedding_are_summed_over_micro_batches(schedule, opt):
    """An Embedding's gradient is IndexedSlices, which has no `+`: the micro-batches' rows
    are put side by side (as TensorFlow aggregates them) and equal plain Keras; they raised
    a TypeError before."""
    rng = np.random.default_rng(0)
    x = rng.integers(0, 20, size=(32, 6))
    y = rng.normal(size=(32, 1)).astype("float32")
    strategy = HetPipeStrategy(plan=even_plan(_embedding_model(), DEVICES[:2], n_m=1),
                               schedule=schedule, micro_batches=4)
    with strategy.scope():
        model = _embedding_model()
        model.compile(OPTS[opt](), "mse")
    ref = _embedding_model()
    ref.compile(OPTS[opt](), "mse")
    got = model.fit(x, y, batch_size=8, epochs=2, shuffle=False, verbose=0).history
    want = ref.fit(x, y, batch_size=8, epochs=2, shuffle=False, verbose=0).history
    np.testing.assert_allclose(got["loss"], want["loss"], rtol=1e-5, atol=1e-6)
    assert_weights_close(model.get_weights(), ref.get_weights())
    strategy.close()


def test_schedule_is_exported_and_hetpipe_stays_default():
    assert hp.Schedule is Schedule
    strategy = HetPipeStrategy(plan=even_plan(skip_model(0), DEVICES[:2], n_m=2))
    assert strategy.options.schedule.schedule is Schedule.HETPIPE and strategy.n_m == 2


def test_two_vws_d0_are_synchronous_data_parallelism():
    x, y = regression_data(48, 0)
    probe = skip_model(0)
    plans = [even_plan(probe, DEVICES[0:2], n_m=1), even_plan(probe, DEVICES[2:4], n_m=1)]
    strategy = HetPipeStrategy(plan=plans, clock_distance=0, schedule=Schedule.GPIPE,
                               micro_batches=2)
    with strategy.scope():
        model = skip_model(0)
        model.compile(keras.optimizers.SGD(0.05), "mse")
    w0 = model.get_weights()
    model.fit(x, y, batch_size=8, epochs=1, shuffle=False, verbose=0)
    coord = strategy.coordinator(model)
    assert all(isinstance(strategy.pipeline(model, v), SyncPipelineRuntime) for v in (0, 1))
    assert [len(a) for a in coord.assignment] == [3, 3]
    # Each clock both VWs train one minibatch at the same w_global; updates are summed.
    batches = [(x[i:i + 8], y[i:i + 8]) for i in range(0, 48, 8)]
    w = [a.copy() for a in w0]
    for c in range(3):
        us = []
        for v in range(2):
            probe.set_weights(w)
            bx, by = batches[coord.assignment[v][c]]
            with tf.GradientTape() as tape:
                loss = keras.losses.MeanSquaredError()(by, probe(bx, training=True))
            us.append([-0.05 * g.numpy() for g in
                       tape.gradient(loss, probe.trainable_variables)])
        w = [a + b + c_ for a, b, c_ in zip(w, *us)]
    assert_weights_close(model.get_weights(), w)
    strategy.close()


def _strategy(**kw):
    return HetPipeStrategy(plan=even_plan(skip_model(0), DEVICES[:2], n_m=1), **kw)


def test_bad_arguments_are_refused_when_the_strategy_is_made():
    with pytest.raises(ValueError, match=r"Received: schedule=Schedule.GPIPE, n_m=2"):
        _strategy(schedule=Schedule.GPIPE, micro_batches=2, n_m=2)
    with pytest.raises(ValueError, match="micro_batches=None"):
        _strategy(schedule=Schedule.ONE_F_ONE_B)
    with pytest.raises(ValueError, match="micro_batches=0"):
        _strategy(schedule=Schedule.GPIPE, micro_batches=0)
    with pytest.raises(ValueError, match="belong to the synchronous schedules"):
        _strategy(micro_batches=4)
    with pytest.raises(ValueError, match="belong to the synchronous schedules"):
        _strategy(rematerialize=True)
    with pytest.raises(ValueError, match="Received: schedule='zero_bubble'"):
        _strategy(schedule="zero_bubble")
    with pytest.raises(ValueError, match="data_parallel='hetseq'"):
        HetPipeStrategy(schedule=Schedule.GPIPE, micro_batches=2, data_parallel="hetseq")


@pytest.mark.parametrize("m, batch, loss, match", [
    (16, 8, "mse", "micro_batches=16, batch size 8"),
    (3, 8, "mse", r"batch size 8, micro_batches=3; pass one of \[1, 2, 4, 8\]"),
    (2, 8, keras.losses.MeanSquaredError(reduction="sum"), "reduction='sum'")])
def test_bad_training_input_is_refused_before_any_step(m, batch, loss, match):
    x, y = regression_data(32)
    strategy = _strategy(schedule=Schedule.GPIPE, micro_batches=m)
    with strategy.scope():
        model = skip_model(0)
        model.compile(keras.optimizers.SGD(0.05), loss)
    w0 = model.get_weights()
    with pytest.raises(ValueError, match=match):
        model.fit(x, y, batch_size=batch, epochs=1, verbose=0)
    assert_weights_close(model.get_weights(), w0, atol=0)
    strategy.close()


class _Noise(keras.layers.Layer):
    """Adds noise from TensorFlow's stateful generator: not repeatable."""

    def call(self, x, training=False):
        return x + tf.random.uniform(tf.shape(x)) if training else x


def test_rematerialization_refuses_a_forward_that_is_not_repeatable():
    x, y = regression_data(16)
    inp = keras.Input((8,), name="x")
    h = keras.layers.Dense(8, name="d1")(inp)
    h = _Noise(name="noise")(h)
    out = keras.layers.Dense(1, name="out")(keras.layers.Dense(8, name="d2")(h))
    build = lambda: keras.Model(inp, out)  # noqa: E731 - one model, built once
    model = build()
    strategy = HetPipeStrategy(plan=even_plan(model, DEVICES[:2], n_m=1),
                               schedule=Schedule.GPIPE, micro_batches=2, rematerialize=True)
    with strategy.scope():
        model = keras.Model.from_config(model.get_config(), custom_objects={"_Noise": _Noise})
        model.compile(keras.optimizers.SGD(0.05), "mse")
    w0 = model.get_weights()
    with pytest.raises(ValueError, match=r"stateful random generator.*noise"):
        model.fit(x, y, batch_size=8, epochs=1, verbose=0)
    assert_weights_close(model.get_weights(), w0, atol=0)
    strategy.close()


def test_pipeline_monitor_reads_the_synchronous_trace():
    from hetpipe_tf.core.schedule import TaskKind
    from hetpipe_tf.observe.callbacks import PipelineMonitor
    x, y = regression_data(32)
    strategy = _strategy(schedule=Schedule.ONE_F_ONE_B, micro_batches=2)
    with strategy.scope():
        model = skip_model(0)
        model.compile(keras.optimizers.SGD(0.05), "mse")
    monitor = PipelineMonitor(strategy)
    model.fit(x, y, batch_size=8, epochs=1, verbose=0, callbacks=[monitor])
    rt = strategy.pipeline(model)
    # Updates are in update_s (as PipelineRuntime's), micro-batches numbered globally.
    assert {e.task.kind for e in rt.trace} == {TaskKind.FORWARD, TaskKind.BACKWARD}
    assert {e.task.minibatch for e in rt.trace} == set(range(1, 9))
    assert len(rt.update_s) == 4 and len(monitor.comparison.stages) == 2
    strategy.close()


def test_fit_with_sample_weights_and_weighted_metrics_equals_plain_keras():
    x, y = regression_data(40, seed=3)
    sw = np.random.RandomState(2).uniform(0.1, 3.0, size=len(x)).astype("float32")
    strategy = _strategy(schedule=Schedule.GPIPE, micro_batches=4)
    with strategy.scope():
        model = skip_model(0)
        model.compile(OPTS["adam"](), "mse", metrics=["mae"], weighted_metrics=["mse"])
    w0 = model.get_weights()
    got = model.fit(x, y, sample_weight=sw, batch_size=8, epochs=2, shuffle=False,
                    verbose=0).history
    ref = skip_model(0)
    ref.set_weights(w0)
    ref.compile(OPTS["adam"](), "mse", metrics=["mae"], weighted_metrics=["mse"])
    want = ref.fit(x, y, sample_weight=sw, batch_size=8, epochs=2, shuffle=False,
                   verbose=0).history
    assert_weights_close(model.get_weights(), ref.get_weights())
    assert set(got) == set(want)
    for key in want:
        np.testing.assert_allclose(got[key], want[key], rtol=1e-5, atol=1e-6, err_msg=key)
    strategy.close()


def test_the_strategys_planner_plans_for_the_schedule():
    from hetpipe_tf.cluster.spec import Cluster
    x, y = regression_data(32)
    strategy = HetPipeStrategy(Cluster.local(["LOCAL_CPU", "LOCAL_CPU"]),
                               schedule=Schedule.ONE_F_ONE_B, micro_batches=4,
                               rematerialize=True)
    with strategy.scope():
        model = skip_model(0)
        model.compile(keras.optimizers.SGD(0.05), "mse")
    model.fit(x, y, batch_size=8, epochs=1, verbose=0)
    plan = strategy.plan
    # Planned with 1F1B's memory model: micro-batches held min(K - j, M), N_m = 1.
    assert plan.n_m == 1 and [s.minibatches_held for s in plan.stages] == [2, 1]
    assert isinstance(strategy.pipeline(model), SyncPipelineRuntime)
    strategy.close()


def test_an_epochs_smaller_last_batch_is_split_unevenly_and_still_equals_keras():
    # 38 rows in batches of 16: the last batch has 6 rows, split 2 + 2 + 1 + 1.
    strategy, model, ref, got, want = _fit_both(skip_model, 2, Schedule.ONE_F_ONE_B, 4,
                                                "adam", n=38, batch=16, epochs=2)
    assert_weights_close(model.get_weights(), ref.get_weights())
    np.testing.assert_allclose(got["loss"], want["loss"], rtol=1e-5, atol=1e-6)
    strategy.close()
