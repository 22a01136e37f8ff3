"""GPipe's bubble and the model's Plan conversion."""

import pytest

from hetpipe_tf.cluster.spec import Cluster, Device, Host, paper_cluster
from hetpipe_tf.core.schedule import TaskKind
from hetpipe_tf.partitioner.plan import Plan, StagePlan
from hetpipe_tf.sim.engine import simulate
from hetpipe_tf.core.sync_schedule import ActionKind, Schedule, actions, bubble_fraction
from hetpipe_tf.sim.gpipe import gpipe_events, sync_events
from hetpipe_tf.sim.model import SimConfig, SimStage, VirtualWorker, from_plan

CLUSTER = paper_cluster()


@pytest.mark.parametrize("k, m", [(2, 1), (2, 4), (4, 4), (4, 8), (3, 5)])
def test_gpipe_bubble(k, m):
    # Equal times: f per micro-batch forward, b backward on every stage. The forward phase
    # takes (M + K - 1) f (a diagonal), the backward phase (M + K - 1) b; each stage is busy
    # M (f + b): idle fraction = (K - 1) / (M + K - 1).
    f, b = 1.0, 2.0
    vw = VirtualWorker("g", tuple(SimStage(f"host0/gpu{j % 4}", "host0", f * m, b * m)
                                  for j in range(k)), 32)
    r = simulate([vw], SimConfig(n_m=m, num_waves=3, mode=Schedule.GPIPE), CLUSTER)
    assert r.makespan_s == pytest.approx(3 * (m + k - 1) * (f + b))
    for u in r.vws[0].utilisation:
        assert 1 - u == pytest.approx((k - 1) / (m + k - 1))
    assert r.minibatches == 3 and r.samples == 3 * 32


def test_gpipe_order_forward_all_then_backward_all():
    ev = gpipe_events([1.0, 1.0], [2.0, 2.0], 3, 1)
    on0 = [(e.task.kind.value, e.task.minibatch) for e in ev if e.task.stage == 0]
    assert on0 == [("fwd", 1), ("fwd", 2), ("fwd", 3), ("bwd", 1), ("bwd", 2), ("bwd", 3)]


def test_from_plan_splits_forward_and_backward():
    host = Host("h", (Device("h/a", "TITAN_V", "h", "/device:GPU:0"),
                      Device("h/b", "TITAN_V", "h", "/device:GPU:1")), 15.75e9)
    cluster = Cluster((host, Host("ps", (), 15.75e9)), 7e9)
    def st(i, dev, first, last, c, rf, rb):
        return StagePlan(i, dev, "TITAN_V", f"/device:GPU:{i}", first, last,
                         tuple(f"l{n}" for n in range(first, last + 1)), c, rf, rb, 1, 2, 1)
    plan = Plan("m", 16, 2, 0, (st(0, "h/a", 0, 1, 0.3, 0.0, 0.02),
                                st(1, "h/b", 2, 2, 0.6, 0.01, 0.0)), 3)
    vw = from_plan(plan, cluster, param_bytes=[100, 200], ps_host="ps", cut_bytes=[5, 7],
                   compute_scale=2.0)
    assert vw.forward_times == pytest.approx([0.2, 0.41])
    assert vw.backward_times == pytest.approx([0.42, 0.8])
    assert [s.shards[0].host for s in vw.stages] == ["ps", "ps"]
    assert [s.param_bytes for s in vw.stages] == [100, 200]
    assert vw.stages[0].send_bytes == 7 and vw.batch_size == 16
    with pytest.raises(ValueError, match="Unknown parameter-server host"):
        from_plan(plan, cluster, ps={0: [("nowhere", 1)]})


def test_gpipe_updates_after_the_flush():
    ev = gpipe_events([2, 2], [4, 4], 2, 2, update_s=[1, 3])
    applies = [(e.task.stage, e.task.minibatch, e.start, e.end) for e in ev
               if e.task.kind is TaskKind.APPLY]
    # Minibatch 1: F 0-1,1-2 | 1-2,2-3 ; B stage 1: 3-5,5-7 ; stage 0: 5-7,7-9.
    assert applies[:2] == [(1, 2, 7, 10), (0, 2, 9, 10)]
    second = [e for e in ev if e.task.minibatch == 3 and e.task.stage == 0]
    assert second[0].start == 10   # next minibatch after every stage updated


@pytest.mark.parametrize("schedule", [Schedule.GPIPE, Schedule.ONE_F_ONE_B])
def test_sim_replays_the_executors_action_lists(schedule):
    lists = actions(schedule, 3, 4)
    ev = sync_events([1.0, 1.5, 1.0], [2.0, 2.0, 3.0], 4, 2, update_s=[0.5] * 3,
                     schedule=schedule)
    kinds = {ActionKind.FORWARD: TaskKind.FORWARD, ActionKind.BACKWARD: TaskKind.BACKWARD,
             ActionKind.APPLY: TaskKind.APPLY}
    for b in range(2):
        for j in range(3):
            ran = [(e.task.kind, e.task.minibatch) for e in sorted(ev, key=lambda e: e.start)
                   if e.task.stage == j and b * 4 < e.task.minibatch <= (b + 1) * 4]
            want = [(kinds[a.kind], b * 4 + (4 if a.micro_batch < 0 else a.micro_batch + 1))
                    for a in lists[j]]
            assert ran == want


def test_one_f_one_b_mode_has_gpipes_bubble():
    f, b, k, m = 1.0, 2.0, 4, 6
    vw = VirtualWorker("g", tuple(SimStage(f"host0/gpu{j % 4}", "host0", f * m, b * m)
                                  for j in range(k)), 24)
    r = simulate([vw], SimConfig(n_m=m, num_waves=2, mode=Schedule.ONE_F_ONE_B), CLUSTER)
    assert r.makespan_s == pytest.approx(2 * (m + k - 1) * (f + b))
    for u in r.vws[0].utilisation:
        assert 1 - u == pytest.approx(bubble_fraction(k, m))


def test_sim_config_takes_cores_schedule_or_its_name():
    assert SimConfig(n_m=2).mode is Schedule.HETPIPE
    assert SimConfig(n_m=2, mode="1f1b").mode is Schedule.ONE_F_ONE_B
    with pytest.raises(ValueError, match="Received: schedule='pipedream'"):
        SimConfig(n_m=2, mode="pipedream")
