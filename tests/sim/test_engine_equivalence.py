"""The one-pass engine gives exactly the result of the straightforward fixed point.

`_oracle` is the engine as it was before the one-pass form (simulate every VW, replay
every transfer through a dict of port free times, recompute the gates, repeat until
nothing changes), kept here self-contained so that a shared helper cannot hide a
difference. Results are compared with ==: same events, transfers, stats, floats.
"""

import heapq

from hypothesis import given, settings, strategies as st

from hetpipe_tf.cluster.spec import paper_cluster
from hetpipe_tf.core import wsp
from hetpipe_tf.sim import engine
from hetpipe_tf.sim.fixed_point import simulate_fixed_point
from hetpipe_tf.sim.transfers import Transfer, TransferLog
from hetpipe_tf.sim.model import PSShard, SimConfig, SimStage, VirtualWorker
from hetpipe_tf.sim.result import summarise
from hetpipe_tf.core.schedule import TaskKind, simulate as simulate_pipeline
from tests.sim.scenarios import scenarios as shared_scenarios

CLUSTER = paper_cluster()  # host0..host3, 4 GPUs each, PCIe 15.75 GB/s, IB 7 GB/s


def _oracle_replay(vws, ends, cfg):
    free, transfers = {}, []

    def reserve(v, j, c, kind, stage, sh, t):
        inter = stage.host != sh.host
        keys = [("net", stage.host), ("net", sh.host)] if inter else [("pcie", stage.device)]
        bw = CLUSTER.inter_bandwidth if inter else (
            CLUSTER.host(sh.host).intra_bandwidth * cfg.intra_scale)
        start = max([t] + [free.get(k, 0.0) for k in keys])
        end = start + (sh.nbytes / bw if sh.nbytes > 0 else 0.0)
        for k in keys:
            free[k] = end
        transfers.append(Transfer(v, j, c, kind, stage.device, sh.host, sh.nbytes, inter,
                                  t, start, end))
        return end

    n, waves, d = len(vws), cfg.num_waves, cfg.clock_distance
    heap, seq = [], 0
    for v in range(n):
        for c in range(waves):
            for j in range(vws[v].num_stages):
                heapq.heappush(heap, (ends[v][c][j], seq, v, c, j, "push"))
                seq += 1
    stage_left = {(v, c): vws[v].num_stages for v in range(n) for c in range(waves)}
    push_done, pulled, pull_done = {}, set(), [{} for _ in range(n)]
    vw_left, partial, global_done = {c: n for c in range(waves)}, {}, {}

    def maybe_pull(v, c):
        nonlocal seq
        r = c - d
        if (r < 0 or c + 1 >= waves or (v, c) in pulled or stage_left[(v, c)] > 0
                or r not in global_done):
            return
        pulled.add((v, c))
        for j in range(vws[v].num_stages):
            heapq.heappush(heap, (max(push_done[(v, c)], global_done[r]), seq, v, c, j, "pull"))
            seq += 1

    while heap:
        t, _, v, c, j, kind = heapq.heappop(heap)
        stage = vws[v].stages[j]
        end = t
        for sh in stage.shards:
            end = max(end, reserve(v, j, c, kind, stage, sh, t))
        if kind == "push":
            stage_left[(v, c)] -= 1
            push_done[(v, c)] = max(push_done.get((v, c), 0.0), end)
            if stage_left[(v, c)] == 0:
                vw_left[c] -= 1
                partial[c] = max(partial.get(c, 0.0), push_done[(v, c)])
                if vw_left[c] == 0:
                    global_done[c] = partial[c]
                    for u in range(n):
                        if c + d < waves:
                            maybe_pull(u, c + d)
                maybe_pull(v, c)
        else:
            pull_done[v][c] = max(pull_done[v].get(c, 0.0), end)
    return pull_done, transfers


def _oracle(vws, cfg):
    m, n_m = cfg.num_minibatches, cfg.n_m
    gates = [[0.0] * m for _ in vws]
    for _ in range(2 * cfg.num_waves + 4):
        runs = [simulate_pipeline(vw.num_stages, n_m, m, vw.forward_times, vw.backward_times,
                                  arrival=g) for vw, g in zip(vws, gates)]
        ends = []
        for vw, events in zip(vws, runs):
            last = {(e.task.stage, e.task.minibatch): e.end for e in events
                    if e.task.kind is not TaskKind.FORWARD}
            ends.append([[last[(j, (c + 1) * n_m)] for j in range(vw.num_stages)]
                         for c in range(cfg.num_waves)])
        pull_done, transfers = _oracle_replay(vws, ends, cfg)
        new = []
        for pd in pull_done:
            new.append([])
            for p in range(1, m + 1):
                r = wsp.required_global_wave(p, n_m, cfg.clock_distance)
                new[-1].append(0.0 if r is None else pd.get(
                    wsp.pull_after_wave(r, cfg.clock_distance), float("inf")))
        if new == gates:
            return summarise(vws, cfg, CLUSTER, runs, gates, transfers)
        gates = new
    raise AssertionError("the oracle did not settle")


def _check_same(vws, cfg):
    expected = _oracle(vws, cfg)
    got = engine.simulate(vws, cfg, CLUSTER)
    assert got.events == expected.events
    assert list(got.transfers) == list(expected.transfers)
    assert got == expected  # every stat, byte count and float
    assert simulate_fixed_point(vws, cfg, CLUSTER) == expected
    return got


# Times from a small grid (many exact ties between tasks and transfers) or arbitrary.
times = st.one_of(st.sampled_from([0.0, 0.25, 0.5, 1.0]),
                  st.floats(min_value=0.0, max_value=3.0, allow_nan=False))
nbytes = st.one_of(st.sampled_from([0, 1_750_000_000, 3_500_000_000]),
                   st.integers(0, 20_000_000_000))


def scenarios():
    return shared_scenarios(times=times, nbytes=nbytes, max_vws=4, max_shards=3, max_waves=6,
                            same_stage_count=False)


@settings(max_examples=150, deadline=None)
@given(scenarios())
def test_one_pass_equals_fixed_point(scenario):
    _check_same(*scenario)


def _blocked(num_vws, k, ps_hosts, t=0.25, nbytes=700_000_000):
    """VWs of k stages, stage j of VW v on host (v + j) % 4; every stage's parameters
    split over `ps_hosts` (ED-like: all VWs contend for the same PS ports)."""
    vws = []
    for v in range(num_vws):
        stages = []
        for j in range(k):
            host = f"host{(v + j) % 4}"
            shards = tuple(PSShard(h, nbytes // len(ps_hosts)) for h in ps_hosts)
            stages.append(SimStage(f"{host}/gpu{v % 4}", host, t * (1 + j % 2),
                                   2 * t * (1 + v % 3), shards=shards))
        vws.append(VirtualWorker(f"vw{v}", tuple(stages), 32))
    return vws


def test_many_identical_vws_contending_for_one_ps():
    # 8 identical VWs, one PS on host0: every push and pull queues on host0's port.
    vws = _blocked(8, 1, ["host0"])
    vws = [VirtualWorker(f"vw{v}", vws[0].stages, 32) for v in range(8)]
    r = _check_same(vws, SimConfig(n_m=2, clock_distance=0, num_waves=5))
    assert r.vws[0].waiting_s > 0 and len(r.transfers) == 8 * (5 + 4)


def test_mixed_vws_sharded_ps_with_clock_distance():
    for d in (0, 1, 3):
        _check_same(_blocked(8, 4, ["host0", "host1", "host2", "host3"]),
                    SimConfig(n_m=3, clock_distance=d, num_waves=6))


def test_zero_time_last_stage_falls_back_to_the_fixed_point():
    # Every task 0 s and 0-byte shards: all pushes and pulls tie with their gates; the
    # one pass cannot order them and the engine runs the fixed point instead.
    vws = [VirtualWorker(f"vw{v}", (SimStage(f"host{v}/gpu0", f"host{v}", 0.0, 0.0,
                                             shards=(PSShard("host0", 0),)),), 8)
           for v in range(3)]
    r = _check_same(vws, SimConfig(n_m=2, num_waves=4))
    assert r.makespan_s == 0.0


def test_transfer_log_is_a_sequence_of_transfers():
    r = engine.simulate(_blocked(2, 2, ["host0", "host3"]), SimConfig(n_m=2, num_waves=3),
                        CLUSTER)
    log, items = r.transfers, tuple(r.transfers)
    assert isinstance(log, TransferLog) and len(log) == len(items) > 0
    assert [log[i] for i in range(len(log))] == list(items) and log[-1] == items[-1]
    assert log[1:3] == items[1:3] and log == items and hash(log) == hash(TransferLog.of(items))
    assert TransferLog.of(items) == log and TransferLog() == ()
    assert log.param_bytes() == (sum(t.nbytes for t in items if t.inter_host),
                                 sum(t.nbytes for t in items if not t.inter_host))


def test_push_absorbed_by_its_gate_falls_back(monkeypatch):
    # The fast VW's last stage takes 1e-20 s: positive, but 1.0 + 1e-20 == 1.0, so its
    # push lands exactly on the (0-byte) pull that gated it. The one pass detects the
    # tie it cannot order and the engine runs the fixed point.
    calls = []
    monkeypatch.setattr(engine, "simulate_fixed_point",
                        lambda *a, **k: calls.append(1) or simulate_fixed_point(*a, **k))
    fast = VirtualWorker("fast", (SimStage("host0/gpu0", "host0", 0.0, 1e-20,
                                           shards=(PSShard("host0", 0),)),), 8)
    slow = VirtualWorker("slow", (SimStage("host1/gpu0", "host1", 0.5, 0.5),), 8)
    _check_same([fast, slow], SimConfig(n_m=1, num_waves=4))
    assert calls
