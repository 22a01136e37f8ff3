"""The synchronous executor (GPipe, 1F1B) run directly on stages: one minibatch split into
micro-batches equals one Keras step on the whole minibatch (an independent reference:
Keras' own train_on_batch on a copy of the model), sample weights and an uneven last
batch included; each stage runs exactly its action list; BatchNorm statistics are updated
once per micro-batch in order; re-materialization recomputes the same dropout mask."""

import keras
import numpy as np
import pytest
import tensorflow as tf

from hetpipe_tf.core.sync_schedule import ActionKind, Schedule
from hetpipe_tf.pipeline.program import Program
from hetpipe_tf.pipeline.stage import Stage
from hetpipe_tf.pipeline.sync_runtime import SyncPipelineRuntime
from hetpipe_tf.pipeline.weights import StageWeights, WeightVersions
from hetpipe_tf.strategy.plans import even_plan
from tests.strategy.helpers import DEVICES, assert_weights_close, regression_data, skip_model


def _runtime(model, k, schedule, m, make_opt, remat=False):
    program = Program.from_model(model)
    stages = Stage.for_plan(even_plan(model, DEVICES[:k], n_m=1), program, model)
    weights = []
    for s in stages:
        opt = make_opt()
        opt.build(s.trainable)
        weights.append(StageWeights(s.device, s.trainable, s.versioned_nt, opt, 1))
    tracker = keras.metrics.Mean()

    @tf.function(reduce_retracing=True)
    def update_metrics(loss, y, y_pred, sample_weight):
        tracker.update_state(loss, sample_weight=tf.shape(y_pred)[0])
        return {"loss": tracker.result()}

    rt = SyncPipelineRuntime(stages, WeightVersions(weights), schedule, m, update_metrics,
                             rematerialize=remat)
    return rt, tracker


def _reference(build, weights0, make_opt, batches):
    ref = build()
    ref.set_weights(weights0)
    ref.compile(make_opt(), "mse")
    losses = []
    for x, y, sw in batches:
        pred = ref(x).numpy()
        per = ((pred - y) ** 2).mean(axis=-1)
        w = np.ones(len(x)) if sw is None else sw
        losses.append(float((per * w).sum() / len(x)))
        ref.train_on_batch(x, y, sample_weight=sw)
    return ref.get_weights(), losses


def _train(rt, batches):
    for x, y, sw in batches:
        rt.submit([tf.constant(x)], tf.constant(y),
                  None if sw is None else tf.constant(sw, tf.float32))
    rt.drain()


CASES = [(k, s, "sgd") for k in (1, 2, 4) for s in (Schedule.GPIPE, Schedule.ONE_F_ONE_B)]
CASES += [(2, s, "adam") for s in (Schedule.GPIPE, Schedule.ONE_F_ONE_B)]


@pytest.mark.parametrize("k, schedule, opt", CASES)
def test_equals_one_step_on_the_whole_minibatch(k, schedule, opt):
    make = {"sgd": lambda: keras.optimizers.SGD(0.1),
            "adam": lambda: keras.optimizers.Adam(0.01)}[opt]
    x, y = regression_data(38, seed=k)
    sw = np.random.RandomState(1).uniform(0.2, 2.0, size=len(x)).astype("float32")
    # Two full minibatches of 16 in 4 micro-batches, then an uneven one of 6 (2+2+1+1).
    batches = [(x[:16], y[:16], sw[:16]), (x[16:32], y[16:32], None),
               (x[32:], y[32:], sw[32:])]
    model = skip_model(0)
    model.compile(make(), "mse")
    w0 = model.get_weights()
    rt, tracker = _runtime(model, k, schedule, 4, make)
    try:
        _train(rt, batches)
    finally:
        rt.close()
    want, losses = _reference(lambda: skip_model(0), w0, make, batches)
    assert_weights_close(model.get_weights(), want)
    # The loss tracker, weighted by rows, ends at the row-weighted mean of minibatch losses.
    np.testing.assert_allclose(tracker.result().numpy(),
                               np.average(losses, weights=[16, 16, 6]), rtol=1e-5)
    assert rt.completed == 3 and rt.record[3] == (1, 2)


@pytest.mark.parametrize("schedule", [Schedule.GPIPE, Schedule.ONE_F_ONE_B])
def test_each_stage_runs_its_action_list(schedule):
    model = skip_model(0)
    model.compile(keras.optimizers.SGD(0.1), "mse")
    rt, _ = _runtime(model, 4, schedule, 3, lambda: keras.optimizers.SGD(0.1))
    x, y = regression_data(24)
    try:
        _train(rt, [(x[:12], y[:12], None), (x[12:], y[12:], None)])
    finally:
        rt.close()
    for p in (1, 2):
        for j in range(4):
            ran = [a for mb, a, _, _ in rt.action_trace if mb == p and a.stage == j]
            assert tuple(ran) == rt.actions_for(3)[j]
    # Traced micro-batches are numbered globally: (p - 1) * M + m + 1.
    assert {e.task.minibatch for e in rt.trace} == set(range(1, 7))


def _bn_model():
    inp = keras.Input((8,), name="x")
    h = keras.layers.BatchNormalization(momentum=0.8, name="bn")(inp)
    h = keras.layers.Dense(8, activation="tanh", name="d1",
                           kernel_initializer=keras.initializers.GlorotUniform(1))(h)
    out = keras.layers.Dense(1, name="out",
                             kernel_initializer=keras.initializers.GlorotUniform(2))(h)
    return keras.Model(inp, out)


@pytest.mark.parametrize("schedule", [Schedule.GPIPE, Schedule.ONE_F_ONE_B])
def test_batchnorm_moving_statistics_once_per_micro_batch(schedule):
    model = _bn_model()
    model.compile(keras.optimizers.SGD(0.1), "mse")
    rt, _ = _runtime(model, 2, schedule, 4, lambda: keras.optimizers.SGD(0.1))
    x, y = regression_data(32, seed=3)
    try:
        _train(rt, [(x[:16], y[:16], None), (x[16:], y[16:], None)])
    finally:
        rt.close()
    # Reference (GPipe Section 2.2): the input's statistics per micro-batch of 4 rows, the
    # moving averages updated once per micro-batch in order.
    mean, var = np.zeros(8), np.ones(8)
    for i in range(0, 32, 4):
        part = x[i:i + 4].astype(np.float64)
        mean = 0.8 * mean + 0.2 * part.mean(axis=0)
        var = 0.8 * var + 0.2 * part.var(axis=0)
    bn = model.get_layer("bn")
    np.testing.assert_allclose(bn.moving_mean.numpy(), mean, rtol=1e-5, atol=1e-6)
    np.testing.assert_allclose(bn.moving_variance.numpy(), var, rtol=1e-5, atol=1e-6)


def _dropout_model():
    inp = keras.Input((8,), name="x")
    h = keras.layers.Dense(16, activation="tanh", name="d1",
                           kernel_initializer=keras.initializers.GlorotUniform(1))(inp)
    h = keras.layers.Dropout(0.5, seed=7, name="drop")(h)
    h = keras.layers.Dense(16, activation="tanh", name="d2",
                           kernel_initializer=keras.initializers.GlorotUniform(2))(h)
    out = keras.layers.Dense(1, name="out",
                             kernel_initializer=keras.initializers.GlorotUniform(3))(h)
    return keras.Model(inp, out)


@pytest.mark.parametrize("schedule", [Schedule.GPIPE, Schedule.ONE_F_ONE_B])
def test_rematerialization_equals_the_kept_forward_with_dropout(schedule):
    x, y = regression_data(32, seed=4)
    batches = [(x[:16], y[:16], None), (x[16:], y[16:], None)]
    results = []
    for remat in (False, True):
        model = _dropout_model()
        model.compile(keras.optimizers.SGD(0.1), "mse")
        rt, _ = _runtime(model, 2, schedule, 4, lambda: keras.optimizers.SGD(0.1), remat)
        try:
            _train(rt, batches)
        finally:
            rt.close()
        results.append(model.get_weights())
        assert not rt.stages[0].stateful_random_ops(
            *[v for v in rt.versions.stages[0].snapshot()], [tf.constant(x[:4])])
    # A recomputation with another dropout mask would give other gradients.
    for a, b in zip(*results):
        np.testing.assert_array_equal(a, b)


@pytest.mark.parametrize("m", [1, 2, 8])
def test_any_micro_batch_count_that_divides_the_batch(m):
    x, y = regression_data(16, seed=5)
    model = skip_model(0)
    model.compile(keras.optimizers.SGD(0.1), "mse")
    w0 = model.get_weights()
    rt, _ = _runtime(model, 2, Schedule.ONE_F_ONE_B, m, lambda: keras.optimizers.SGD(0.1))
    try:
        _train(rt, [(x[:8], y[:8], None), (x[8:], y[8:], None)])
    finally:
        rt.close()
    want, _ = _reference(lambda: skip_model(0), w0, lambda: keras.optimizers.SGD(0.1),
                         [(x[:8], y[:8], None), (x[8:], y[8:], None)])
    assert_weights_close(model.get_weights(), want)


def test_a_failure_before_the_commit_applies_the_minibatch_on_no_stage():
    x, y = regression_data(16, seed=6)
    batches = [(x[:8], y[:8], None), (x[8:], y[8:], None)]
    make = lambda: keras.optimizers.SGD(0.1)  # noqa: E731
    model = skip_model(0)
    model.compile(make(), "mse")
    w0 = model.get_weights()
    rt, _ = _runtime(model, 2, Schedule.GPIPE, 2, make)
    stage0 = rt.stages[0]
    backward, calls = stage0.backward, []

    def failing(saved, grads, extra_grad=None):
        calls.append(1)
        if len(calls) == 4:   # minibatch 2's last backward on stage 0: stage 1 is done
            raise RuntimeError("injected")
        return backward(saved, grads, extra_grad)

    stage0.backward = failing
    try:
        with pytest.raises(RuntimeError, match="injected"):
            _train(rt, batches)
        assert rt.completed == 1
        # Stage 1 had finished minibatch 2's backwards and waited at the commit: it must
        # not have applied it either.
        after_one, _ = _reference(lambda: skip_model(0), w0, make, batches[:1])
        assert_weights_close(model.get_weights(), after_one)
        rt.abort()                      # clears the failure; the next run starts from here
        stage0.backward = backward
        _train(rt, batches[1:])
    finally:
        rt.close()
    want, _ = _reference(lambda: skip_model(0), w0, make, batches)
    assert_weights_close(model.get_weights(), want)
    assert rt.dropped == 1 and rt.completed == 2
