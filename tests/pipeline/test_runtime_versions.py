"""What a weight version costs (docs/performance.md): no copy of a variable that did not
change, a copy of one that changed only while an older version is still alive, and values
equal to the optimizer's own update. Buffers are compared by address (a CPU tensor's numpy
view shares its buffer)."""

import keras
import numpy as np
import tensorflow as tf

from hetpipe_tf.pipeline.weights import StageWeights
from hetpipe_tf.strategy import HetPipeStrategy, even_plan
from tests.strategy.helpers import DEVICES, regression_data, skip_model


def _address(t) -> int:
    return np.asarray(t).__array_interface__["data"][0]


def test_a_version_copies_only_what_changes_while_it_is_alive():
    a = keras.Variable(np.full((8, 4), 2.0, "float32"))
    b = keras.Variable(np.full((4,), 3.0, "float32"))
    opt = keras.optimizers.SGD(0.5)
    opt.build([a, b])
    weights = StageWeights(DEVICES[0], [a, b], [], opt, n_m=1)
    weights.start_run(1, 0)
    _, (a1, b1), _ = weights.take(1)
    weights.apply(1, [tf.ones((8, 4)), None], [])       # b gets no gradient: unchanged
    _, (a2, b2), _ = weights.take(2)
    assert _address(b2) == _address(b1)                 # unchanged: the same buffer
    assert _address(a2) != _address(a1)                 # changed while version 1 lives
    np.testing.assert_array_equal(a1, np.full((8, 4), 2.0))   # version 1 kept intact
    np.testing.assert_array_equal(a2, np.full((8, 4), 1.5))   # 2 - 0.5 * 1
    np.testing.assert_array_equal(b2, np.full((4,), 3.0))
    where = _address(a2)
    del a1, b1, a2, b2                                  # no version alive any more
    weights.apply(2, [tf.ones((8, 4)), None], [])
    _, (a3, _), _ = weights.take(3)
    assert _address(a3) == where                        # updated in place: no copy
    np.testing.assert_array_equal(a3, np.full((8, 4), 1.0))


def test_one_stage_pipeline_updates_in_place_at_n_m_1():
    """N_m = 1: minibatch p's version is dropped before u_p is applied, so the update
    writes the variable's own buffer and every version shares it (no copy per minibatch)."""
    x, y = regression_data(64, 3)
    strategy = HetPipeStrategy(plan=even_plan(skip_model(0), DEVICES[:1], n_m=1))
    with strategy.scope():
        model = skip_model(0)
        model.compile(keras.optimizers.SGD(0.01), "mse")
    model.fit(x[:16], y[:16], batch_size=8, epochs=1, verbose=0)   # builds the runtime
    runtime = strategy.pipeline(model)
    weights = runtime.versions
    seen = []
    original = weights.take

    def take(p, j):
        t, n = original(p, j)
        seen.append(_address(t[0]))   # the address only: holding the tensor would copy
        return t, n

    weights.take = take
    with strategy:
        model.fit(x, y, batch_size=8, epochs=1, shuffle=False, verbose=0)
    assert len(seen) == 8
    assert len(set(seen)) == 1, seen


def test_an_emulated_slower_device_also_updates_slower():
    """Emulation (speed factor f < 1) sleeps (1/f - 1) x the measured update, as for tasks,
    so the cost model's update / f holds; f = 1 sleeps nothing. Values are not changed."""
    def run(factor):
        a = keras.Variable(np.full((64, 64), 2.0, "float32"))
        opt = keras.optimizers.SGD(0.5)
        opt.build([a])
        weights = StageWeights(DEVICES[0], [a], [], opt, n_m=1, emulated_speed_factor=factor)
        weights.start_run(1, 0)
        for q in (1, 2, 3):
            weights.take(q)
            weights.apply(q, [tf.ones((64, 64))], [])
        return weights, a

    plain, a = run(1.0)
    slow, b = run(0.25)
    assert plain.emulated_sleep_s == 0.0 and slow.emulated_sleep_s > 0.0
    np.testing.assert_array_equal(a.numpy(), b.numpy())
