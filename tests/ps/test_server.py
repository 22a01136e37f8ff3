"""ParameterServers' push of a `Difference` (the delta subtracted inside the push's own
compiled call) against a NumPy account of w_global, with and without `settle_pushes`, and
start_run's one-call assignment, and the one-call moves between w_global and the model."""

from __future__ import annotations

import numpy as np
import pytest
import tensorflow as tf

from hetpipe_tf.ps.server import Difference, ParameterServers, VariableCopy

PS = ["/device:CPU:1", "/device:CPU:2"]   # two variables on two server devices
VW = "/device:CPU:3"                      # the VW's own device


def _tensor(x):
    with tf.device(VW):
        return tf.constant(x, tf.float32)


@pytest.mark.parametrize("settle", [False, True])
def test_difference_pushes_add_now_minus_base_and_snapshot_at_the_global_clock(settle):
    rs = np.random.RandomState(0)
    init = [rs.rand(3, 2).astype("float32"), rs.rand(4).astype("float32")]
    servers = ParameterServers([tf.constant(x) for x in init], PS, num_workers=2)
    servers.settle_pushes = settle
    expect = [x.copy() for x in init]

    def push(worker, wave):
        now = [rs.rand(*x.shape).astype("float32") for x in init]
        base = [rs.rand(*x.shape).astype("float32") for x in init]
        if worker == 0:   # the tensors form of a push, as before
            servers.push(worker, wave, [_tensor(a - b) for a, b in zip(now, base)])
        else:
            servers.push(worker, wave, Difference(
                tuple(map(_tensor, now)), tuple(map(_tensor, base)), (VW, VW)))
        return [e + (a - b) for e, a, b in zip(expect, now, base)]

    for wave in range(3):
        for worker in (0, 1):
            expect = push(worker, wave)
        values, clocks = servers.pull()
        assert clocks == (wave + 1, wave + 1)
        for got, want in zip(values, expect):
            np.testing.assert_allclose(got.numpy(), want, rtol=1e-6)
    at_global = expect
    expect = push(0, 3)   # the global clock stays at 3: the snapshot keeps wave 2's state
    values, clocks = servers.pull_wave(1, 2)
    assert clocks == (3, 3)
    for got, want in zip(values, at_global):
        np.testing.assert_allclose(got.numpy(), want, rtol=1e-6)
    values, clocks = servers.pull()
    assert clocks == (4, 3)
    for got, want in zip(values, expect):
        np.testing.assert_allclose(got.numpy(), want, rtol=1e-6)
    assert [p.worker for p in servers.pushes] == [0, 1] * 3 + [0]

def test_start_run_assigns_every_value_and_lifts_the_clocks():
    servers = ParameterServers([tf.zeros([2]), tf.zeros([3])], PS, num_workers=2)
    servers.push(0, 0, [tf.ones([2]), tf.ones([3])])
    servers.start_run([tf.fill([2], 5.0), tf.fill([3], 7.0)])
    values, clocks = servers.pull()
    assert clocks == (1, 1)
    np.testing.assert_allclose(values[0].numpy(), [5.0] * 2)
    np.testing.assert_allclose(values[1].numpy(), [7.0] * 3)
    assert [v.device[-5:] for v in servers.variables] == ["CPU:1", "CPU:2"]


def test_a_run_moves_w_global_to_and_from_the_model_variables_in_one_call_each():
    servers = ParameterServers([tf.zeros([2]), tf.zeros([3])], PS, num_workers=2)
    with tf.device(VW):
        model = [tf.Variable([1.0, 2.0]), tf.Variable([3.0, 4.0, 5.0])]
    to_servers = VariableCopy(model, servers.variables)
    from_servers = VariableCopy(servers.variables, model)
    servers.start_run(to_servers)
    values, clocks = servers.pull()
    np.testing.assert_array_equal(values[1].numpy(), [3.0, 4.0, 5.0])
    servers.push(0, clocks[0], [tf.ones([2]), tf.ones([3])])
    pulls = servers.pull_count
    assert servers.pull_into(from_servers) == (clocks[0] + 1, clocks[1])
    assert servers.pull_count == pulls + 1
    np.testing.assert_array_equal(model[0].numpy(), [2.0, 3.0])
    np.testing.assert_array_equal(model[1].numpy(), [4.0, 5.0, 6.0])
    assert [v.device[-5:] for v in servers.variables] == ["CPU:1", "CPU:2"]
    with pytest.raises(ValueError, match="One destination per source variable"):
        VariableCopy(model, servers.variables[:1])
