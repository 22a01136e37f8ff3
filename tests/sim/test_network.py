"""The shared-links model (sim/network.py): fair sharing by hand, and WSP through it."""

import dataclasses

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from hetpipe_tf.cluster.spec import paper_cluster
from hetpipe_tf.sim.engine import simulate
from hetpipe_tf.sim.fixed_point import simulate_fixed_point
from hetpipe_tf.sim.model import PSShard, SimConfig, SimStage, VirtualWorker
from hetpipe_tf.sim.network import FluidNetwork, NetworkConfig
from tests.sim.scenarios import scenarios

CLUSTER = paper_cluster()   # host0..host3, 4 GPUs each, PCIe 15.75 GB/s, IB 7 GB/s


def _run_all(net):
    ends = []
    while net.active:
        t = net.next_completion()
        ends += [(f, t) for f in net.advance(t)]
    return ends


def test_flows_on_one_resource_share_it_equally():
    # 4 flows of 1, 2, 3, 4 units on capacity 1: processor sharing ends them at 4, 7, 9, 10
    # (a FIFO port would end them at 1, 3, 6, 10).
    net = FluidNetwork()
    r = net.resource(("nic", "out", "h0"), 1.0)
    for k in range(4):
        net.start(k + 1, (r,))
    assert [t for _, t in _run_all(net)] == pytest.approx([4, 7, 9, 10])


def test_max_min_fairness_and_per_flow_cap():
    net = FluidNetwork()
    a, b = net.resource(("a",), 1.0), net.resource(("b",), 0.2)
    net.start(0.8, (a,))           # gets what b's bottleneck leaves: 0.8
    net.start(0.2, (a, b))         # limited to 0.2 by b
    assert [t for _, t in _run_all(net)] == pytest.approx([1.0, 1.0])
    net = FluidNetwork()
    a = net.resource(("a",), 1.0)
    net.start(0.3, (a,), cap=0.3)  # two capped flows leave capacity unused
    net.start(0.3, (a,), cap=0.3)
    assert [t for _, t in _run_all(net)] == pytest.approx([1.0, 1.0])


def _pushers(n, nbytes, ps_host="host0"):
    return [VirtualWorker(f"vw{k}", (SimStage(f"host1/gpu{k}", "host1", 1 / 3, 2 / 3,
                                               shards=(PSShard(ps_host, nbytes),)),), 32)
            for k in range(n)]


def test_four_gpus_pushing_through_one_nic_finish_together():
    # 4 GPUs of host1 push 1.75 GB each to host0 at t=1: one NIC of 7 GB/s (no stream cap,
    # no apply time) shared 4 ways: all arrive at 1 + 4 x 0.25 = 2 s, not 1.25/1.5/1.75/2.
    net = NetworkConfig(nic_bandwidth=7e9, stream_bandwidth=None, ps_apply_bandwidth=None)
    r = simulate(_pushers(4, int(1.75e9)), SimConfig(n_m=1, num_waves=2, network=net),
                 CLUSTER)
    pushes = [t for t in r.transfers if t.kind == "push" and t.wave == 0]
    assert [t.end for t in pushes] == pytest.approx([2.0] * 4)
    # A stream cap below the fair share: each flow at 1 GB/s, all end at 1 + 1.75 s.
    capped = dataclasses.replace(net, stream_bandwidth=1e9)
    r = simulate(_pushers(4, int(1.75e9)), SimConfig(n_m=1, num_waves=2, network=capped),
                 CLUSTER)
    assert [t.end for t in r.transfers if t.kind == "push" and t.wave == 0] == \
        pytest.approx([2.75] * 4)


def test_push_and_pull_directions_do_not_share_and_apply_takes_time():
    # Full duplex: host0's NIC carries a push in and a pull out at full rate each. One VW on
    # host1, PS on host0: push 0.7 GB at 7 GB/s = 0.1 s, applied at 1.4 GB/s = 0.5 s more.
    net = NetworkConfig(nic_bandwidth=7e9, stream_bandwidth=None, ps_apply_bandwidth=1.4e9)
    r = simulate(_pushers(1, int(0.7e9)), SimConfig(n_m=1, num_waves=3, network=net),
                 CLUSTER)
    push0 = next(t for t in r.transfers if t.kind == "push" and t.wave == 0)
    assert push0.end == pytest.approx(1.0 + 0.1 + 0.5)
    pull0 = next(t for t in r.transfers if t.kind == "pull" and t.wave == 0)
    assert (pull0.start, pull0.end) == pytest.approx((1.6, 1.7))


def test_a_flow_ending_within_the_tolerance_of_a_request_still_completes():
    # vw0 pushes 1.4 GB at t = 0.2 (0.2 s at 7 GB/s); vw1's push is requested at 0.4, a few
    # ulps before vw0's flow ends by the network's clock: the flow ends when the network
    # moves to the request, and its push must count (else every later wave waits forever).
    net = NetworkConfig(nic_bandwidth=7e9, stream_bandwidth=None, ps_apply_bandwidth=None)
    vws = [VirtualWorker(f"vw{k}", (SimStage(f"host{k + 1}/gpu0", f"host{k + 1}", t, t,
                                             shards=(PSShard("host0", 14 * 10**8),)),), 8)
           for k, t in enumerate((0.1, 0.2))]
    r = simulate(vws, SimConfig(n_m=1, num_waves=4, network=net), CLUSTER)
    assert [len(v.completions) for v in r.vws] == [4, 4]
    assert r == simulate_fixed_point(vws, SimConfig(n_m=1, num_waves=4, network=net), CLUSTER)


@settings(max_examples=40, deadline=None)
@given(scenarios(times=st.sampled_from([0.5, 1.0, 1.5, 2.0]),
                 nbytes=st.sampled_from([0, 7 * 10**8, 14 * 10**8]), max_vws=3,
                 max_shards=2, max_waves=4, same_stage_count=False))
def test_one_pass_engine_equals_the_fixed_point_on_shared_links(scenario):
    vws, cfg = scenario
    cfg = dataclasses.replace(cfg, network=NetworkConfig(nic_bandwidth=7e9))
    fast = simulate(vws, cfg, CLUSTER)
    assert fast == simulate_fixed_point(vws, cfg, CLUSTER)
    # WSP: every VW pushes every wave; a VW's completions never decrease
    for st_ in fast.vws:
        assert list(st_.completions) == sorted(st_.completions)


def test_bad_network_config():
    with pytest.raises(ValueError, match="nic_bandwidth"):
        NetworkConfig(nic_bandwidth=0)
