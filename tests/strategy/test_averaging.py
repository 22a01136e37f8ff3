"""Compensation.AVERAGE (strategy/averaging.py): each of N VWs' updates scaled by 1/N.

The reference is the rule written independently in NumPy: synchronous data parallelism
(2 VWs x 1 stage, N_m = 1, D = 0), each worker with its own momentum buffer
v_k <- mu v_k - (lr / N) g_k at the common weights, w <- w + sum_k v_k (gradients from a
tape on a probe model; no Keras optimizer in the reference).
"""

import keras
import numpy as np
import pytest
import tensorflow as tf

from hetpipe_tf.strategy import HetPipeStrategy, even_plan
from hetpipe_tf.strategy.averaging import (averaging_adjustment, averaging_scale,
                                           scale_learning_rate)
from hetpipe_tf.strategy.compensation import Compensation, optimizer_adjustment
from tests.strategy.helpers import DEVICES, assert_weights_close, regression_data, skip_model

BATCH, LR, MU = 8, 0.05, 0.9


def _two_vws(compensation, make_opt):
    plans = [even_plan(skip_model(0), DEVICES[w:w + 1], n_m=1) for w in range(2)]
    strategy = HetPipeStrategy(plan=plans, clock_distance=0, compensation=compensation)
    with strategy.scope():
        model = skip_model(0)
        model.compile(make_opt(), "mse")
    return strategy, model


def _grads(probe, weights, batch):
    x, y = batch
    probe.set_weights(weights)
    with tf.GradientTape() as tape:
        loss = keras.losses.MeanSquaredError()(y, probe(x, training=True))
    return [g.numpy() for g in tape.gradient(loss, probe.trainable_variables)]


def averaged_momentum_reference(w0, batches, assignment, n_workers):
    probe = skip_model(0)
    w = [a.copy() for a in w0]
    velocity = [[np.zeros_like(a) for a in w] for _ in range(n_workers)]
    for t in range(len(assignment[0])):
        total = [np.zeros_like(a) for a in w]
        for k, steps in enumerate(assignment):
            g = _grads(probe, w, batches[steps[t]])
            velocity[k] = [MU * v - (LR / n_workers) * gi for v, gi in zip(velocity[k], g)]
            total = [a + v for a, v in zip(total, velocity[k])]
        w = [a + b for a, b in zip(w, total)]
    return w


def test_scale_and_adjustment():
    assert averaging_scale(4) == 0.25
    assert averaging_adjustment(1) is None
    with pytest.raises(ValueError, match="num_vws=0"):
        averaging_scale(0)
    # Only AVERAGE and ALL average; NONE/PREDICT/MOMENTUM/BOTH leave the rate alone.
    assert optimizer_adjustment(Compensation.AVERAGE, 1, 2) is not None
    assert optimizer_adjustment(Compensation.AVERAGE, 1, 1) is None
    assert optimizer_adjustment(Compensation.BOTH, 1, 2, 0) is None
    assert Compensation.parse("all").averages and Compensation.ALL.predicts
    assert Compensation.ALL.reduces_momentum and not Compensation.BOTH.averages


def test_a_schedule_is_scaled_at_the_optimizers_own_step():
    sched = keras.optimizers.schedules.ExponentialDecay(0.1, decay_steps=1, decay_rate=0.5)
    opt = keras.optimizers.SGD(sched)
    w = keras.Variable(np.zeros(2, "float32"))
    opt.build([w])
    scale_learning_rate(opt, 0.5)
    opt.apply_gradients([(tf.ones(2), w)])   # step 0: rate 0.1 * 0.5
    opt.apply_gradients([(tf.ones(2), w)])   # step 1: rate 0.05 * 0.5
    np.testing.assert_allclose(w.numpy(), [-0.075, -0.075], rtol=1e-6)


def test_two_vws_average_equals_the_numpy_rule():
    x, y = regression_data(96, 4)
    strategy, model = _two_vws("average", lambda: keras.optimizers.SGD(LR, momentum=MU))
    w0 = model.get_weights()
    with strategy:
        model.fit(x, y, batch_size=BATCH, epochs=1, shuffle=False, verbose=0)
        assignment = [list(a) for a in strategy.coordinator(model).assignment]
    assert [len(a) for a in assignment] == [6, 6]   # lockstep at N_m = 1, D = 0
    batches = [(x[i:i + BATCH], y[i:i + BATCH]) for i in range(0, len(x), BATCH)]
    ref = averaged_momentum_reference(w0, batches, assignment, 2)
    assert_weights_close(model.get_weights(), ref, atol=2e-5)
    # The rule could fail: summing (no averaging) is another result.
    strategy_sum, model_sum = _two_vws("none", lambda: keras.optimizers.SGD(LR, momentum=MU))
    model_sum.set_weights(w0)
    with strategy_sum:
        model_sum.fit(x, y, batch_size=BATCH, epochs=1, shuffle=False, verbose=0)
    assert max(np.abs(a - b).max() for a, b in zip(model_sum.get_weights(), ref)) > 1e-3
    # The model's optimizer keeps the user's rate.
    assert float(model.optimizer.learning_rate.numpy()) == pytest.approx(LR)


def test_a_learning_rate_callback_still_reaches_every_vw():
    x, y = regression_data(64, 3)
    strategy, model = _two_vws("average", lambda: keras.optimizers.SGD(LR, momentum=0.0))
    after = []
    cbs = [keras.callbacks.LearningRateScheduler(lambda e, lr: LR if e == 0 else 0.0),
           keras.callbacks.LambdaCallback(on_epoch_end=lambda e, logs: after.append(
               model.get_weights()))]
    w0 = model.get_weights()
    with strategy:
        model.fit(x, y, batch_size=BATCH, epochs=2, shuffle=False, verbose=0, callbacks=cbs)
    assert max(np.abs(a - b).max() for a, b in zip(after[0], w0)) > 1e-3
    assert_weights_close(after[1], after[0], atol=0)
