"""compile(jit_compile=...) under the strategy (hetpipe_tf/strategy/xla.py): each stage's
tasks compiled with XLA, training equal to jit_compile=False within float tolerance."""

import keras
import numpy as np
import pytest
import tensorflow as tf

from hetpipe_tf.cluster.spec import Cluster
from hetpipe_tf.core.sync_schedule import Schedule
from hetpipe_tf.pipeline.in_graph import InGraphRuntime
from hetpipe_tf.pipeline.sync_runtime import SyncPipelineRuntime
from hetpipe_tf.strategy import HetPipeStrategy, even_plan
from tests.strategy.helpers import DEVICES, assert_weights_close, regression_data, skip_model

TOL = 1e-5   # float32: XLA fuses and reorders the same arithmetic


def _train(jit, k=2, n_m=2, **strategy_kw):
    """(model, strategy, fit history, evaluate, predict) of skip_model trained 2 epochs."""
    x, y = regression_data(48, 0)
    strategy = HetPipeStrategy(plan=lambda m: even_plan(m, DEVICES[:k], n_m=n_m),
                               **strategy_kw)
    with strategy.scope():
        model = skip_model(0)
        model.compile(keras.optimizers.SGD(0.05, momentum=0.9), "mse", metrics=["mae"],
                      jit_compile=jit)
    history = model.fit(x, y, batch_size=8, epochs=2, shuffle=False, verbose=0,
                        validation_data=(x[:16], y[:16]))
    return (model, strategy, history.history, model.evaluate(x, y, verbose=0),
            model.predict(x[:8], verbose=0))


def _assert_same_training(off, on):
    assert on[0].jit_compile is True and off[0].jit_compile is False
    assert_weights_close(on[0].get_weights(), off[0].get_weights(), atol=TOL)
    for key in off[2]:
        np.testing.assert_allclose(on[2][key], off[2][key], atol=TOL)
    np.testing.assert_allclose(on[3], off[3], atol=TOL)
    np.testing.assert_allclose(on[4], off[4], atol=TOL)


def _stages(strategy, model):
    return strategy.extended.pipelines[id(model)].executor.stages


def test_two_stage_pipeline_with_xla_trains_as_without():
    off, on = _train(False), _train(True)
    _assert_same_training(off, on)
    assert [s.jit_compile for s in _stages(on[1], on[0])] == [True, True]
    assert [s.jit_compile for s in _stages(off[1], off[0])] == [False, False]


@pytest.mark.parametrize("schedule", [Schedule.GPIPE, Schedule.ONE_F_ONE_B])
def test_synchronous_schedule_with_xla_trains_as_without(schedule):
    kw = dict(n_m=1, schedule=schedule, micro_batches=2)
    off, on = _train(False, **kw), _train(True, **kw)
    _assert_same_training(off, on)
    assert isinstance(on[1].extended.pipelines[id(on[0])].executor, SyncPipelineRuntime)


def test_one_stage_in_keras_step_with_xla_trains_as_without():
    off, on = _train(False, k=1, n_m=1), _train(True, k=1, n_m=1)
    _assert_same_training(off, on)
    assert isinstance(on[1].extended.pipelines[id(on[0])].executor, InGraphRuntime)


def test_stage_functions_carry_xla_must_compile():
    model, strategy = _train(True)[:2]
    first = _stages(strategy, model)[0]
    concretes = list(first._forward_fn._concrete.values())
    assert concretes, "stage 0's forward was never called through its concrete function"
    for c in concretes:
        assert c.function_def.attr["_XlaMustCompile"].b


def _with_string_op(position: int) -> keras.Model:
    """skip_model's Dense chain with an op XLA cannot compile (AsString) at `position`."""
    through_strings = keras.layers.Lambda(
        lambda t: tf.strings.to_number(tf.strings.as_string(t)), name="strings")
    x = keras.Input((8,))
    h = keras.layers.Dense(8, activation="tanh", name="d1")(x)
    h = keras.layers.Dense(8, activation="tanh", name="d2")(h)
    if position == 0:
        h = through_strings(h)
    h = keras.layers.Dense(8, activation="tanh", name="d3")(h)
    if position == 1:
        h = through_strings(h)
    return keras.Model(x, keras.layers.Dense(1, name="out")(h))


@pytest.mark.parametrize("position", [0, 1])
def test_an_op_xla_cannot_compile_fails_the_first_minibatch_as_in_keras(position):
    # Proof that the stage runs under XLA: without it the same model trains.
    x, y = regression_data(16, 0)
    for jit in (False, True):
        strategy = HetPipeStrategy(plan=lambda m: even_plan(m, DEVICES[:2], n_m=2))
        with strategy.scope():
            model = _with_string_op(position)
            model.compile("sgd", "mse", jit_compile=jit)
        w0 = model.get_weights()
        if not jit:
            model.fit(x, y, batch_size=8, epochs=1, verbose=0)
            continue
        with pytest.raises(tf.errors.InvalidArgumentError, match="AsString"):
            model.fit(x, y, batch_size=8, epochs=1, verbose=0)
        assert_weights_close(model.get_weights(), w0, atol=0)   # nothing was applied


def test_auto_is_what_keras_resolves():
    # Keras 3: "auto" is False on a CPU-only machine and under any tf.distribute strategy.
    strategy = HetPipeStrategy(plan=lambda m: even_plan(m, DEVICES[:2], n_m=2))
    with strategy.scope():
        model = skip_model(0)
        model.compile("sgd", "mse", jit_compile="auto")
    assert model.jit_compile is False
    x, y = regression_data(16, 0)
    model.fit(x, y, batch_size=8, epochs=1, verbose=0)
    assert [s.jit_compile for s in _stages(strategy, model)] == [False, False]


def test_hetseq_refuses_jit_compile_before_training():
    strategy = HetPipeStrategy(Cluster.local(["LOCAL_CPU"] * 2), data_parallel="hetseq")
    with strategy.scope():
        model = skip_model(0)
        model.compile("sgd", "mse", jit_compile=True)
    w0 = model.get_weights()
    x, y = regression_data(16, 0)
    with pytest.raises(ValueError, match="HetSeq.*Received: jit_compile=True.*jit_compile=False"):
        model.fit(x, y, batch_size=8, epochs=1, verbose=0)
    assert_weights_close(model.get_weights(), w0, atol=0)
    strategy.close()


def test_two_virtual_workers_with_xla_train_as_without():
    x, y = regression_data(32, 0)
    weights = {}
    for jit in (False, True):
        probe = skip_model(0)
        plans = [even_plan(probe, DEVICES[0:2], n_m=2), even_plan(probe, DEVICES[2:4], n_m=2)]
        # Every batch split over the VWs: which VW trains what does not depend on timing.
        strategy = HetPipeStrategy(plan=plans, clock_distance=0, data_parallel="wsp_split")
        with strategy.scope():
            model = skip_model(0)
            model.compile(keras.optimizers.SGD(0.05), "mse", jit_compile=jit)
        model.fit(x, y, batch_size=8, epochs=1, shuffle=False, verbose=0)
        weights[jit] = model.get_weights()
        stages = [s for v in (0, 1) for s in strategy.pipeline(model, v).stages]
        assert [s.jit_compile for s in stages] == [jit] * 4
        strategy.close()
    assert_weights_close(weights[True], weights[False], atol=TOL)


def test_variables_on_stage_devices_fit_evaluate_and_predict():
    # A Plan given at construction puts each stage's variables on its device: one XLA
    # cluster could not read them all, so evaluate and predict run without XLA.
    x, y = regression_data(32, 0)
    out = {}
    for jit in (False, True):
        strategy = HetPipeStrategy(plan=even_plan(skip_model(0), DEVICES[:2], n_m=2))
        with strategy.scope():
            model = skip_model(0)
            model.compile(keras.optimizers.SGD(0.05), "mse", metrics=["mae"],
                          jit_compile=jit)
        assert {v.value.device[-5:] for v in model.trainable_weights} == {"CPU:0", "CPU:1"}
        model.fit(x, y, batch_size=8, epochs=1, shuffle=False, verbose=0)
        out[jit] = (model.get_weights(), model.evaluate(x, y, verbose=0),
                    model.predict(x[:8], verbose=0))
        assert model.jit_compile is jit
        strategy.close()
    assert_weights_close(out[True][0], out[False][0], atol=TOL)
    np.testing.assert_allclose(out[True][1], out[False][1], atol=TOL)
    np.testing.assert_allclose(out[True][2], out[False][2], atol=TOL)
