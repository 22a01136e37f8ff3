"""What a weight version costs (docs/performance.md): no copy of a variable that did not
change, a version that keeps the buffer it read while the variable takes a new one, updates
written by value (never in place over a buffer a version may share: copy-on-write would
copy first), and values equal bit for bit to the optimizer's own in-place update. Buffers
are compared by address (a CPU tensor's numpy view shares its buffer)."""

import keras
import numpy as np
import pytest
import tensorflow as tf

from hetpipe_tf.pipeline.weights import StageWeights
from tests.strategy.helpers import DEVICES, regression_data, threaded_one_stage


def _address(t) -> int:
    return np.asarray(t).__array_interface__["data"][0]


def test_a_version_keeps_its_buffer_and_shares_what_does_not_change():
    a = keras.Variable(np.full((8, 4), 2.0, "float32"))
    b = keras.Variable(np.full((4,), 3.0, "float32"))
    opt = keras.optimizers.SGD(0.5)
    opt.build([a, b])
    weights = StageWeights(DEVICES[0], [a, b], [], opt, n_m=2)
    weights.start_run(1, 0)
    _, (a1, b1), _ = weights.take(1)
    _, (a2, _), _ = weights.take(2)                     # alive while update 1 is applied
    where = _address(a2)
    weights.apply(1, [tf.ones((8, 4)), None], [])       # b gets no gradient: unchanged
    _, (a3, b3), _ = weights.take(3)
    assert _address(b3) == _address(b1)                 # unchanged: the same buffer
    assert _address(a1) == _address(a2) == where        # versions 1, 2 kept their buffer
    assert _address(a3) != where                        # the variable took a new one
    np.testing.assert_array_equal(a2, np.full((8, 4), 2.0))   # version 2 kept intact
    np.testing.assert_array_equal(a3, np.full((8, 4), 1.5))   # 2 - 0.5 * 1
    np.testing.assert_array_equal(b3, np.full((4,), 3.0))


def _written_in_place(concrete, variables) -> list[str]:
    """Ops of `concrete` that update one of `variables` in place (AssignAdd/AssignSub)."""
    handles = {id(keras.Variable.value.fget(v).handle) if isinstance(v, keras.Variable)
               else id(v.handle) for v in variables}
    inner = {id(internal) for external, internal in concrete.graph.captures
             if id(external) in handles}
    return [op.name for op in concrete.graph.get_operations()
            if op.type in ("AssignAddVariableOp", "AssignSubVariableOp")
            and id(op.inputs[0]) in inner]


@pytest.mark.parametrize("make", [lambda: keras.optimizers.SGD(0.1, momentum=0.9),
                                  lambda: keras.optimizers.Adam(0.01),
                                  lambda: keras.optimizers.RMSprop(0.01)],
                         ids=["sgd_momentum", "adam", "rmsprop"])
def test_updates_write_by_value_and_equal_the_optimizers_own(make):
    """The stage's update writes its versioned variables (trainable and the float
    non-trainable ones) with whole-value assigns, and lands on the same values, bit for
    bit, as the optimizer updating in place."""
    rng = np.random.default_rng(0)
    init = [rng.normal(size=s).astype("float32") for s in ((16, 8), (8,))]
    grads = [[tf.constant(rng.normal(size=x.shape).astype("float32")) for x in init]
             for _ in range(4)]
    mine = [keras.Variable(x) for x in init]
    stat = keras.Variable(np.zeros((8,), "float32"), trainable=False)
    opt = make()
    opt.build(mine)
    weights = StageWeights(DEVICES[0], mine, [stat], opt, n_m=2)
    ref = [keras.Variable(x) for x in init]
    ref_opt = make()
    ref_opt.build(ref)
    ref_step = tf.function(lambda g: ref_opt.apply_gradients(zip(g, ref)))
    weights.start_run(1, 0)
    for q, g in enumerate(grads, start=1):
        weights.take(q)
        weights.apply(q, g, [tf.ones((8,))])
        ref_step(g)
    for a, b in zip(mine, ref):
        np.testing.assert_array_equal(a.numpy(), b.numpy())
    np.testing.assert_array_equal(stat.numpy(), np.full((8,), 4.0))
    concrete = weights._apply_fn.get_concrete_function(grads[0], [tf.ones((8,))])
    assert _written_in_place(concrete, [*mine, stat]) == []
    # The control: the optimizer on its own writes the same variables in place.
    assert _written_in_place(ref_step.get_concrete_function(grads[0]), ref) != []


def test_at_n_m_1_updates_stay_in_place():
    """No version is alive at an update with N_m = 1: in place, no second buffer."""
    a = keras.Variable(np.ones((8, 4), "float32"))
    stat = keras.Variable(np.zeros((4,), "float32"), trainable=False)
    opt = keras.optimizers.SGD(0.1)
    opt.build([a])
    weights = StageWeights(DEVICES[0], [a], [stat], opt, n_m=1)
    weights.start_run(1, 0)
    weights.take(1)
    weights.apply(1, [tf.ones((8, 4))], [tf.ones((4,))])
    concrete = weights._apply_fn.get_concrete_function([tf.ones((8, 4))], [tf.ones((4,))])
    assert len(_written_in_place(concrete, [a, stat])) == 2
    np.testing.assert_allclose(a.numpy(), np.full((8, 4), 0.9))


def test_one_stage_pipeline_takes_a_version_per_minibatch_threaded():
    """The threaded runtime at N_m = 1 (in_graph=False): one version a minibatch, each
    reflecting every earlier update."""
    x, y = regression_data(64, 3)
    strategy, model, runtime = threaded_one_stage(x, y, warmup_rows=16)
    seen = []
    original = runtime.versions.take

    def take(p, j):
        seen.append(p)
        return original(p, j)

    runtime.versions.take = take
    with strategy:
        model.fit(x, y, batch_size=8, epochs=1, shuffle=False, verbose=0)
    assert seen == list(range(3, 11))
    assert [runtime.record[p] for p in seen] == [tuple(range(1, p)) for p in seen]


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
