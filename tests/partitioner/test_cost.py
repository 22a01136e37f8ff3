"""The stage cost model against hand-computed times and memory."""

import keras
import pytest

from hetpipe_tf.cluster.spec import Cluster, Device, Host
from hetpipe_tf.partitioner.comm import CommModel
from hetpipe_tf.partitioner.cost import CostModel, optimizer_slots
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
    # last position holds 1 minibatch's activations: weights 5000 + 3*2500 slots/grads,
    # the same N_m - 1 = 2 stashed versions 2*2500 (those of the minibatches in flight wait
    # there), 1x activations 500, plus the received input 10_000 once
    assert second.held == 1 and second.memory_bytes == 5000 + 7500 + 5000 + 500 + 10_000
    assert first.memory_available == 500_000 and second.memory_available == 1_000_000


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


def _with_updates(profile, updates):
    """`profile` whose layer i updates in updates[i] seconds on every type."""
    import dataclasses
    layers = tuple(dataclasses.replace(l, update_s={t: u for t in l.time_s})
                   for l, u in zip(profile.layers, updates))
    return dataclasses.replace(profile, layers=layers, update_optimizer="sgd")


def test_update_time_is_part_of_the_stage_time():
    cm, a, b = _setup(n_m=3)
    cm = CostModel(_with_updates(cm.profile, [0.001, 0.002, 0.004]), [a, b], cm.cluster, n_m=3,
                   optimizer_slots=2, usable_fraction=0.5)
    first, second = cm.evaluate([0], [a, b])
    # compute unchanged; update = the stage's layers' updates / the emulated speed factor
    assert first.compute_s == pytest.approx(0.01) and first.update_s == pytest.approx(0.001)
    assert second.compute_s == pytest.approx(0.2)
    assert second.update_s == pytest.approx((0.002 + 0.004) / 0.5)
    assert second.time_s == pytest.approx(0.2 + 0.012 + 0.01)
    # the MILP's per-layer figures carry it: layer time = compute + update
    assert list(cm.layer_time(b)) == pytest.approx([0.04 + 0.002, 0.08 + 0.004, 0.12 + 0.008])
    assert list(cm.layer_update_time(a)) == pytest.approx([0.001, 0.002, 0.004])
    assert list(cm.layer_compute_time(a)) == pytest.approx([0.01, 0.02, 0.03])
    assert cm.prefix_time(a)[-1] == pytest.approx(0.06 + 0.007)
    # memory is not changed by the update (its temporaries are transient)
    plain = CostModel(cm.profile, [a, b], cm.cluster, n_m=3, optimizer_slots=2,
                      usable_fraction=0.5).evaluate([0], [a, b])
    assert [c.memory_bytes for c in plain] == [first.memory_bytes, second.memory_bytes]


def test_planner_moves_the_cut_for_the_update():
    """One device type, two devices: without updates the balanced cut is after layer 1
    (0.03 | 0.03); a large update on layer 0 makes the cut after layer 0 best."""
    import dataclasses
    from hetpipe_tf.partitioner.milp import solve

    cm, a, _ = _setup(n_m=1)
    a2 = dataclasses.replace(a, name="a2", tf_device="/device:CPU:3")
    cluster = Cluster(hosts=(Host(name="h0", devices=(a, a2), intra_bandwidth=1e12),),
                      inter_bandwidth=1e6)
    before = solve(cm.profile, [a, a2], 1, cluster=cluster)
    after = solve(_with_updates(cm.profile, [0.03, 0.0, 0.0]), [a, a2], 1, cluster=cluster)
    assert [s.last for s in before.stages] == [1, 2]
    assert [s.last for s in after.stages] == [0, 2]
    # an independent reference: every cut by hand, max(stage compute + update) + transfers
    costs = CostModel(_with_updates(cm.profile, [0.03, 0.0, 0.0]), [a, a2], cluster, n_m=1)
    by_cut = {c: max(s.time_s for s in costs.evaluate([c], [a, a2])) for c in (0, 1)}
    t = costs.cut_seconds(a, a2)
    assert by_cut[0] == pytest.approx(max(0.01 + 0.03 + t[0], 0.02 + 0.03 + t[0]))
    assert by_cut[1] == pytest.approx(max(0.01 + 0.03 + 0.02 + t[1], 0.03 + t[1]))
    assert min(by_cut, key=by_cut.get) == 0


def test_prediction_memory_is_charged_per_version_at_n_m_above_one():
    """Weight prediction's buffers (PredictionMemory): per_version x (N_m - 1) + constant
    trainable copies at every position, nothing at N_m = 1 or by default."""
    from hetpipe_tf.partitioner.cost import PredictionMemory

    pm = PredictionMemory(per_version=3, constant=2)
    assert [pm.copies(n) for n in (1, 2, 3, 4)] == [0, 5, 8, 11]
    assert PredictionMemory().copies(4) == 0
    cm, a, b = _setup(n_m=3)
    plain = [c.memory_bytes for c in cm.evaluate([0], [a, b])]
    # the default is today's model exactly: None and a zero PredictionMemory equal it
    for p in (None, PredictionMemory()):
        same = CostModel(cm.profile, [a, b], cm.cluster, n_m=3, optimizer_slots=2,
                         usable_fraction=0.5, prediction=p)
        assert [c.memory_bytes for c in same.evaluate([0], [a, b])] == plain
    charged = CostModel(cm.profile, [a, b], cm.cluster, n_m=3, optimizer_slots=2,
                        usable_fraction=0.5, prediction=pm)
    first, second = charged.evaluate([0], [a, b])
    # by hand (test_stage_costs_by_hand) + 3 * 2 + 2 = 8 copies of the trainable bytes:
    # l0 holds 500 trainable bytes, l1 + l2 hold 2500, at both positions alike
    assert first.memory_bytes == 1000 + 1500 + 1000 + 300 + 8 * 500
    assert second.memory_bytes == 5000 + 7500 + 5000 + 500 + 10_000 + 8 * 2500
    assert list(charged.prefix_memory(3) - cm.prefix_memory(3)) == [0, 4000, 12000, 24000]
    # N_m = 1: no predictor, no charge
    one = CostModel(cm.profile, [a, b], cm.cluster, n_m=1, prediction=pm)
    assert list(one.fixed_memory) == list(CostModel(cm.profile, [a, b], cm.cluster,
                                                    n_m=1).fixed_memory)


@pytest.mark.parametrize("kw", [{"per_version": -1}, {"constant": 1.5},
                                {"per_version": True}])
def test_prediction_memory_rejects_what_is_not_a_count(kw):
    from hetpipe_tf.partitioner.cost import PredictionMemory
    with pytest.raises(ValueError, match=r"must be an integer >= 0. Received: "):
        PredictionMemory(**kw)


def test_max_minibatches_counts_the_prediction_buffers():
    """The Max_m search sees the buffers: on memory that holds N_m = 3 without them,
    fewer minibatches fit with them (an independent count by hand of stage memory)."""
    import dataclasses
    from hetpipe_tf.partitioner.cost import PredictionMemory
    from hetpipe_tf.partitioner.milp import max_minibatches

    cm, a, _ = _setup(n_m=1)
    # one device holding all 3 layers: weights 6000 + (grad + 2 slots) 9000 + per N_m:
    # 3000 (a version) + 600 (activations, position 0 of 1 holds 1) -> 15_600 at N_m = 1,
    # 15_000 + 3000 (N_m - 1) + 600 without prediction; + 3000 N_m with PredictionMemory(1, 1)
    lone = dataclasses.replace(a, memory_bytes=25_000)
    cluster = Cluster(hosts=(Host(name="h0", devices=(lone,), intra_bandwidth=1e9),),
                      inter_bandwidth=1e6)
    # usable 0.9 x 25_000 = 22_500: N_m = 3 (21_600) fits plain; with 3000 N_m only N_m = 1
    assert max_minibatches(cm.profile, [lone], cluster=cluster, limit=8, optimizer_slots=2) == 3
    assert max_minibatches(cm.profile, [lone], cluster=cluster, limit=8, optimizer_slots=2,
                           prediction=PredictionMemory(1, 1)) == 1
