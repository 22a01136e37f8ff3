"""The memory model per synchronous schedule (GPipe, 1F1B, re-materialization) by hand, and
the planner finding a layout that fits only with re-materialization or 1F1B."""

import pytest

from hetpipe_tf.cluster.spec import Cluster, Device, Host
from hetpipe_tf.core.sync_schedule import Schedule
from hetpipe_tf.partitioner import milp
from hetpipe_tf.partitioner.comm import CommModel
from hetpipe_tf.partitioner.cost import CostModel, SyncMemory
from hetpipe_tf.partitioner.plan import PartitionError
from hetpipe_tf.partitioner.profile import LayerCost, ModelProfile


def _cluster(memory=10**6):
    a = Device(name="a", type_name="TITAN_V", host="h0", tf_device="/device:CPU:0",
               memory_bytes=memory)
    b = Device(name="b", type_name="TITAN_V", host="h1", tf_device="/device:CPU:1",
               memory_bytes=memory)
    cluster = Cluster(hosts=(Host(name="h0", devices=(a,), intra_bandwidth=1e9),
                             Host(name="h1", devices=(b,), intra_bandwidth=1e9)),
                      inter_bandwidth=1e6)
    return a, b, cluster


def _profile(acts=(100, 200, 300), cuts=(10_000, 7_000), batch=4):
    layers = tuple(
        LayerCost(name=f"l{i}", time_s={"TITAN_V": 0.01}, flops=0, bytes_accessed=0,
                  param_bytes=1000 * (i + 1), trainable_param_bytes=500 * (i + 1),
                  activation_bytes=act)
        for i, act in enumerate(acts))
    return ModelProfile(model_name="m", batch_size=batch, layers=layers, cut_bytes=cuts,
                        time_source={"TITAN_V": "estimated"})


def _costs(sync):
    a, b, cluster = _cluster()
    cm = CostModel(_profile(), [a, b], cluster, n_m=1, optimizer_slots=2, comm=CommModel(),
                   usable_fraction=0.5, sync=sync)
    return cm.evaluate([0], [a, b])      # a: l0 ; b (last): l1, l2


def test_memory_per_schedule_by_hand():
    # Fixed: weights + (gradient + 2 slots) + the gradient accumulator, no stashed version.
    fixed0 = 1000 + 3 * 500 + 500
    fixed1 = 5000 + 3 * 2500 + 2500
    # GPipe, M = 4: stage 0 holds all 4 micro-batches (= the minibatch's activations); the
    # last stage runs F+B as one task (one micro-batch's working set, 500 / 4) and keeps the
    # 4 input gradients until its B actions (4 x 10_000 / 4).
    s0, s1 = _costs(SyncMemory(4))
    assert (s0.memory_bytes, s0.held) == (fixed0 + 100, 4)
    assert (s1.memory_bytes, s1.held) == (fixed1 + 125 + 10_000, 4)
    # 1F1B: stage 0 holds min(K - 0, M) = 2 micro-batches, the last one 1.
    s0, s1 = _costs(SyncMemory(4, schedule=Schedule.ONE_F_ONE_B))
    assert (s0.memory_bytes, s0.held) == (fixed0 + 50, 2)
    assert (s1.memory_bytes, s1.held) == (fixed1 + 125 + 2_500, 1)
    # Re-materialization: only the inputs (none at stage 0) and one micro-batch's set.
    s0, s1 = _costs(SyncMemory(4, rematerialize=True))
    assert s0.memory_bytes == fixed0 + 25
    assert s1.memory_bytes == fixed1 + 125 + 10_000
    # One micro-batch: no accumulator.
    s0, _ = _costs(SyncMemory(1))
    assert s0.memory_bytes == 1000 + 3 * 500 + 100


def test_sync_memory_refuses_bad_values():
    with pytest.raises(ValueError, match="micro_batches=0"):
        SyncMemory(0)
    with pytest.raises(ValueError, match="synchronous schedule"):
        SyncMemory(2, schedule=Schedule.HETPIPE)
    assert SyncMemory(2, schedule="1f1b").schedule is Schedule.ONE_F_ONE_B
    a, b, cluster = _cluster()
    with pytest.raises(ValueError, match="n_m=2"):
        CostModel(_profile(), [a, b], cluster, n_m=2, sync=SyncMemory(2))


def test_a_model_that_fits_only_with_rematerialization_or_1f1b_gets_a_plan():
    # Layer 0's activations (800 kB for the minibatch) exceed a device's usable 500 kB.
    a, b, cluster = _cluster()
    profile = _profile(acts=(800_000, 1_000), cuts=(1_000,), batch=4)
    kw = dict(cluster=cluster, options=milp.SolverOptions(usable_fraction=0.5))
    with pytest.raises(PartitionError, match="rematerialize=True fits"):
        milp.solve(profile, [a, b], 1, sync=SyncMemory(4), **kw)
    plan = milp.solve(profile, [a, b], 1, sync=SyncMemory(4, rematerialize=True), **kw)
    assert plan.stages[0].memory_bytes <= plan.stages[0].memory_available
    assert milp.fits(profile, [a, b], 1, sync=SyncMemory(4, schedule=Schedule.ONE_F_ONE_B),
                     **kw)
    # M's limit follows from memory: with re-materialization 2 micro-batches are enough.
    assert milp.min_micro_batches(profile, [a, b], rematerialize=True, **kw) == 2
    assert milp.min_micro_batches(profile, [a, b], **kw) is None


def test_plan_model_plans_for_a_synchronous_schedule():
    from hetpipe_tf.partitioner.planner import plan_model
    a, b, cluster = _cluster()
    profile = _profile(acts=(800_000, 1_000), cuts=(1_000,), batch=4)
    opts = milp.SolverOptions(usable_fraction=0.5)
    got = plan_model(None, cluster, 4, profile=profile, options=opts,
                     sync=SyncMemory(4, schedule=Schedule.ONE_F_ONE_B))
    assert got.plan.n_m == 1 and got.max_m == 1
    assert [s.minibatches_held for s in got.plan.stages] == [2, 1]   # micro-batches held
    with pytest.raises(PartitionError, match="n_m=2"):
        plan_model(None, cluster, 4, profile=profile, options=opts, n_m=2,
                   sync=SyncMemory(4))
