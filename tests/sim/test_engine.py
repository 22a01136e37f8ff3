"""Exact, hand-computed schedules of the HetPipe simulator (engine + links + result)."""

import dataclasses

import pytest

from hetpipe_tf.cluster.spec import Cluster, paper_cluster
from hetpipe_tf.sim.engine import simulate
from hetpipe_tf.sim.model import PSShard, SimConfig, SimStage, VirtualWorker
from hetpipe_tf.core import schedule

CLUSTER = paper_cluster()  # host0..host3, 4 GPUs each, PCIe 15.75 GB/s, IB 7 GB/s


def _vw(name, times, host="host0", shards=(), batch=32):
    """A VW of len(times) stages on `host`; stage j: forward t, backward 2t."""
    return VirtualWorker(name, tuple(
        SimStage(f"{host}/gpu{j}", host, t, 2 * t, shards=tuple(shards))
        for j, t in enumerate(times)), batch)


def test_two_stages_nm2_equal_times_closed_form():
    # Stage 0: F = t, B = 2t; stage 1 (last): F+B as one task = 3t. Both stages do 3t of
    # work per minibatch, so after the first minibatch one completes every 3t.
    # Minibatch 1: F(0) [0,t], FB(1) [t,4t], B(0) [4t,6t] -> completes at 6t.
    # Meanwhile F2 ran on stage 0 [t,2t] (N_m = 2 lets it in), FB2 runs [4t,7t], and minibatch
    # 3 enters when 1 completes: F3 [6t,7t], B2 [7t,9t] (FIFO: F3 was ready first) ...
    # completion(p) = 6t + 3t (p - 1) = 3t (p + 1); makespan of M minibatches = 3t (M + 1).
    t, waves = 0.25, 5
    r = simulate([_vw("a", [t, t])], SimConfig(n_m=2, num_waves=waves), CLUSTER)
    m = 2 * waves
    assert r.makespan_s == pytest.approx(3 * t * (m + 1))
    assert r.vws[0].completions == pytest.approx([3 * t * (p + 1) for p in range(1, m + 1)])
    assert r.samples_per_s == pytest.approx(m * 32 / (3 * t * (m + 1)))
    assert r.steady_minibatches_per_s == pytest.approx(1 / (3 * t))
    assert r.vws[0].busy_s == pytest.approx((3 * t * m, 3 * t * m))
    assert r.vws[0].waiting_s == 0


def test_one_vw_without_parameters_is_schedule_simulate():
    vw = _vw("a", [1.0, 3.0, 2.0])
    r = simulate([vw], SimConfig(n_m=3, num_waves=4), CLUSTER)
    ref = schedule.simulate(3, 3, 12, vw.forward_times, vw.backward_times)
    key = lambda e: (e.start, e.task.stage)  # noqa: E731
    assert [(e.task, e.start, e.end) for e in sorted(r.events, key=key)] == \
        [(e.task, e.start, e.end) for e in sorted(ref, key=key)]


@pytest.mark.parametrize("d, waiting", [(0, 9.0), (2, 5.0)])
def test_wsp_fast_vw_waits_less_with_larger_clock_distance(d, waiting):
    # Two 1-stage VWs, N_m = 1 (a wave is one minibatch), no parameter bytes:
    # fast: 1 s per minibatch, slow: 2 s (slow completes p at 2p, never waits).
    # s_global = D for N_m = 1: minibatch p needs every VW's minibatch p - D - 1.
    # D = 0: fast p needs slow's p-1 (done at 2p-2); fast's p-1 ends at 2p-3: waits 1 s for
    #        each p = 2..10 -> 9 s.
    # D = 2: fast p needs slow's p-3 (done at 2p-6); fast runs free (p-1 done at p-1)
    #        while 2p-6 <= p-1, i.e. p <= 5; p = 6 waits from 5 to 6 and runs [6, 7], and
    #        every later p waits 1 s: p = 6..10 -> 5 s.
    fast = VirtualWorker("fast", (SimStage("host0/gpu0", "host0", 1 / 3, 2 / 3),), 32)
    slow = VirtualWorker("slow", (SimStage("host1/gpu0", "host1", 2 / 3, 4 / 3),), 32)
    r = simulate([fast, slow], SimConfig(n_m=1, clock_distance=d, num_waves=10), CLUSTER)
    f, s = r.vws
    assert f.waiting_s == pytest.approx(waiting)
    assert f.stalled_s == pytest.approx(waiting)  # one stage: waiting = idle
    assert s.waiting_s == 0
    assert r.makespan_s == pytest.approx(20.0)
    assert s.completions == pytest.approx([2.0 * p for p in range(1, 11)])


def test_push_and_pull_cost_link_time():
    # One 1-stage VW (1 s per minibatch), its parameters on the PS of its own host over
    # PCIe: bytes chosen so a transfer takes 0.5 s. N_m = 1, D = 0: p completes, pushes
    # (0.5 s), the global wave is complete, it pulls (0.5 s), then p+1 starts.
    # completion(p) = 2p - 1, waiting 1 s per minibatch after the first.
    nbytes = int(0.5 * 15.75e9 * 0.7)
    vw = VirtualWorker("a", (SimStage("host0/gpu0", "host0", 1 / 3, 2 / 3,
                                      shards=(PSShard("host0", nbytes),)),), 32)
    r = simulate([vw], SimConfig(n_m=1, num_waves=5), CLUSTER)
    assert r.vws[0].completions == pytest.approx([1, 3, 5, 7, 9], rel=1e-6)
    assert r.vws[0].waiting_s == pytest.approx(4.0, rel=1e-6)
    assert r.param_bytes_intra_host == nbytes * (5 + 4)  # 5 pushes, 4 pulls (last gates nothing)
    assert r.param_bytes_inter_host == 0


def test_transfers_through_one_ps_port_serialise():
    # Two 1-stage VWs on host1 and host2, 1 s per minibatch, both parameter sets on host0's
    # PS over the network (0.5 s each). Pushes of wave 0: A [1, 1.5], B [1.5, 2] (host0's
    # port is busy); global wave 0 at 2; pulls: A [2, 2.5], B [2.5, 3]. So A's minibatch 2
    # runs [2.5, 3.5] and B's [3, 4].
    nbytes = int(0.5 * 7e9)
    a, b = (VirtualWorker(n, (SimStage(f"{h}/gpu0", h, 1 / 3, 2 / 3,
                                       shards=(PSShard("host0", nbytes),)),), 32)
            for n, h in (("A", "host1"), ("B", "host2")))
    r = simulate([a, b], SimConfig(n_m=1, num_waves=3), CLUSTER)
    assert r.vws[0].completions[:2] == pytest.approx((1.0, 3.5))
    assert r.vws[1].completions[:2] == pytest.approx((1.0, 4.0))
    pushes = sorted((t.start, t.end, t.vw) for t in r.transfers if t.kind == "push" and t.wave == 0)
    assert pushes == [(1.0, 1.5, 0), (1.5, 2.0, 1)]


def test_bytes_default_vs_ed_local_placement():
    # Two VWs, ED-style: stage j of every VW on host j. Stage parameter bytes P0, P1.
    # default (one PS on host0): stage 0 moves its bytes within host0, stage 1 across hosts.
    # ED-local: stage j's bytes on host j's PS: nothing crosses hosts.
    # Per VW: W pushes and W-1 pulls (the last wave's pull gates nothing) per stage.
    p0, p1, waves = 1000, 3000, 4
    def vws(ps0, ps1):
        return [VirtualWorker(f"vw{v}", (
            SimStage(f"host0/gpu{v}", "host0", 1.0, 2.0, send_bytes=50,
                     shards=(PSShard(ps0, p0),)),
            SimStage(f"host1/gpu{v}", "host1", 1.0, 2.0, shards=(PSShard(ps1, p1),))), 32)
            for v in range(2)]
    cfg = SimConfig(n_m=2, num_waves=waves)
    moves = 2 * (2 * waves - 1)  # VWs x (pushes + pulls)
    acts = 2 * 2 * 50 * 2 * waves  # VWs x (act + grad) x bytes x minibatches
    default = simulate(vws("host0", "host0"), cfg, CLUSTER)
    local = simulate(vws("host0", "host1"), cfg, CLUSTER)
    assert default.param_bytes_inter_host == moves * p1
    assert default.param_bytes_intra_host == moves * p0
    assert local.param_bytes_inter_host == 0
    assert local.param_bytes_intra_host == moves * (p0 + p1)
    assert default.bytes_inter_host == moves * p1 + acts
    assert local.bytes_inter_host == acts


def test_bad_config_messages():
    with pytest.raises(ValueError, match="clock_distance"):
        SimConfig(n_m=2, clock_distance=-1)
    with pytest.raises(ValueError, match="at least one virtual worker"):
        simulate([], SimConfig(n_m=1), CLUSTER)
    with pytest.raises(ValueError, match="nbytes"):
        PSShard("host0", -1)
    assert dataclasses.is_dataclass(SimConfig(n_m=1))


def test_engine_charges_updates_and_counts_them_busy():
    cluster = Cluster.local(["LOCAL_CPU", "LOCAL_CPU"])
    d = [x.name for x in cluster.devices]
    host = cluster.devices[0].host

    def vw(updates):
        return VirtualWorker("v", (SimStage(d[0], host, 1.0, 2.0, update_s=updates[0]),
                                   SimStage(d[1], host, 1.0, 2.0, update_s=updates[1])), 4)

    cfg = SimConfig(n_m=1, num_waves=2)
    plain, charged = simulate([vw((0, 0))], cfg, cluster), simulate([vw((0.5, 3))], cfg, cluster)
    # As in test_two_stages_by_hand: p=2 completes at 14.5 (12 without updates), the
    # makespan ends with stage 1's last update (17).
    assert plain.vws[0].completions == (6.0, 12.0)
    assert charged.vws[0].completions == (6.5, 14.5)
    assert charged.makespan_s == 17.0
    assert charged.vws[0].busy_s == (2 * (1 + 2 + 0.5), 2 * (3 + 3))


def test_bad_stage_update_time():
    with pytest.raises(ValueError, match="update_s must be a finite number >= 0"):
        SimStage("d", "h", 1.0, 1.0, update_s=-1.0)
