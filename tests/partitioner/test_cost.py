"""The stage cost model against hand-computed times and memory."""

import keras
import pytest

from hetpipe_tf.cluster.spec import Cluster, Device, Host
from hetpipe_tf.partitioner.comm import CommModel
from hetpipe_tf.partitioner.cost import CostModel, held_minibatches, optimizer_slots
from hetpipe_tf.partitioner.profile import LayerCost, ModelProfile


def _setup(n_m):
    types = ("TITAN_V", "RTX_2060")
    layers = tuple(
        LayerCost(name=f"l{i}", time_s={"TITAN_V": 0.01 * (i + 1), "RTX_2060": 0.02 * (i + 1)},
                  flops=0, bytes_accessed=0, param_bytes=1000 * (i + 1),
                  trainable_param_bytes=500 * (i + 1), activation_bytes=100 * (i + 1))
        for i in range(3))
    profile = ModelProfile(model_name="m", batch_size=4, layers=layers, cut_bytes=(10_000, 7_000),
                           time_source={t: "estimated" for t in types})
    a = Device(name="a", type_name="TITAN_V", host="h0", tf_device="/device:CPU:0",
               memory_bytes=10**6)
    b = Device(name="b", type_name="RTX_2060", host="h1", tf_device="/device:CPU:1",
               emulated_speed_factor=0.5, memory_bytes=2 * 10**6)
    cluster = Cluster(hosts=(Host(name="h0", devices=(a,), intra_bandwidth=1e9),
                             Host(name="h1", devices=(b,), intra_bandwidth=1e9)),
                      inter_bandwidth=1e6)
    cm = CostModel(profile, [a, b], cluster, n_m=n_m, optimizer_slots=2,
                   comm=CommModel(), usable_fraction=0.5)
    return cm, a, b


def test_stage_costs_by_hand():
    cm, a, b = _setup(n_m=3)
    first, second = cm.evaluate([0], [a, b])       # a: l0 ; b: l1, l2
    # compute: l0 on TITAN_V; l1+l2 on RTX_2060 at emulated half speed
    assert first.compute_s == pytest.approx(0.01)
    assert second.compute_s == pytest.approx((0.04 + 0.06) / 0.5)
    # 10_000 bytes cross the cut between hosts at 1e6 B/s, both directions
    assert first.recv_backward_s == pytest.approx(0.01) and first.recv_forward_s == 0
    assert second.recv_forward_s == pytest.approx(0.01) and second.recv_backward_s == 0
    # memory, position 0 holds N_m = 3: weights 1000 + (grad + 2 slots) 3*500
    # + 2 stashed versions 2*500 + 3 activations 3*100
    assert first.held == 3 and first.memory_bytes == 1000 + 1500 + 1000 + 300
    # last position holds 1: weights 5000 + 3*2500 slots/grads, no stash, 1x activations
    # 500, plus the received input 10_000 once
    assert second.held == 1 and second.memory_bytes == 5000 + 7500 + 500 + 10_000
    assert first.memory_available == 500_000 and second.memory_available == 1_000_000


def test_held_minibatches_rule():
    assert [held_minibatches(j, 4, 5) for j in range(4)] == [5, 5, 5, 1]
    assert held_minibatches(0, 1, 3) == 1


def test_optimizer_slots():
    assert optimizer_slots("sgd") == 0 and optimizer_slots("adam") == 2
    assert optimizer_slots(keras.optimizers.SGD(momentum=0.9)) == 1
    assert optimizer_slots(keras.optimizers.SGD()) == 0
    assert optimizer_slots(keras.optimizers.Adam()) == 2
    assert optimizer_slots(3) == 3
    with pytest.raises(ValueError, match="Received: optimizer='sgdx'"):
        optimizer_slots("sgdx")
    with pytest.raises(ValueError, match="optimizer=-1"):
        optimizer_slots(-1)


def test_missing_device_type_and_bad_fraction():
    cm, a, b = _setup(n_m=1)
    c = Device(name="c", type_name="QUADRO_P4000", host="h0", tf_device="/device:CPU:2")
    with pytest.raises(ValueError, match="QUADRO_P4000"):
        CostModel(cm.profile, [c], cm.cluster, n_m=1)
    with pytest.raises(ValueError, match="usable_fraction=0"):
        CostModel(cm.profile, [a], cm.cluster, n_m=1, usable_fraction=0)
