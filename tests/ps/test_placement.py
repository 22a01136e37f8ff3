"""Parameter placement DEFAULT / ED_LOCAL and the parameter traffic it causes (Section 8.1)."""

import pytest

from hetpipe_tf.cluster.allocation import allocate
from hetpipe_tf.cluster.spec import Cluster, Host, paper_cluster
from hetpipe_tf.partitioner.milp import plan_virtual_workers, solve
from hetpipe_tf.partitioner.profile import LayerCost, ModelProfile
from hetpipe_tf.ps.placement import (
    Placement, PlacementError, PlacementPolicy, StageTraffic, bytes_across_hosts_per_wave,
    default_ps_hosts, node_of, place_parameters, traffic)

# Relative per-layer time on each paper type: V > R > G > Q.
SLOWNESS = {"TITAN_V": 1.0, "TITAN_RTX": 1.2, "RTX_2060": 2.0, "QUADRO_P4000": 2.5}
NUM_LAYERS = 8


def _param_bytes(i):
    return 0 if i % 4 == 3 else 1000 * (i + 1)  # layers 3 and 7 have no weights


def _profile():
    layers = tuple(
        LayerCost(name=f"l{i}", time_s={t: f * (1 + i % 3) * 1e-3 for t, f in SLOWNESS.items()},
                  flops=0, bytes_accessed=0, param_bytes=_param_bytes(i),
                  trainable_param_bytes=_param_bytes(i), activation_bytes=10_000)
        for i in range(NUM_LAYERS))
    return ModelProfile("synthetic", 8, layers, (100_000,) * (NUM_LAYERS - 1),
                        {t: "estimated" for t in SLOWNESS})


PROFILE = _profile()
CLUSTER = paper_cluster()
HOSTS = ("host0", "host1", "host2", "host3")
WITH_PARAMS = [i for i in range(NUM_LAYERS) if _param_bytes(i)]


@pytest.fixture(scope="module")
def ed_plans():
    return plan_virtual_workers(PROFILE, allocate(CLUSTER, "ED"), cluster=CLUSTER, n_m=2)


@pytest.fixture(scope="module")
def np_plans():
    return plan_virtual_workers(PROFILE, allocate(CLUSTER, "NP"), cluster=CLUSTER, n_m=2)


def test_default_is_round_robin_over_layers_with_parameters(ed_plans):
    p = place_parameters(PROFILE, ed_plans, CLUSTER, HOSTS, PlacementPolicy.DEFAULT)
    assert isinstance(p, Placement)
    assert list(p.layer_hosts) == WITH_PARAMS  # layers 3 and 7 have nothing to place
    assert [p.layer_hosts[i] for i in WITH_PARAMS] == [HOSTS[n % 4]
                                                      for n in range(len(WITH_PARAMS))]
    assert p.host_of("l4") == p.host_of(4) == "host3"
    assert p.layers_on("host0") == (0, 5)
    assert sum(p.bytes_per_host(PROFILE).values()) == sum(_param_bytes(i)
                                                           for i in range(NUM_LAYERS))
    with pytest.raises(PlacementError, match="Received: layer='l3'"):
        p.host_of("l3")
    # the order of ps_hosts is the round-robin order; None = one PS per host
    q = place_parameters(PROFILE, ed_plans, CLUSTER, ("host2", "host0"), "default")
    assert [q.layer_hosts[i] for i in WITH_PARAMS] == ["host2", "host0"] * 3
    assert place_parameters(PROFILE, ed_plans, CLUSTER, None).ps_hosts == HOSTS


def test_placement_is_frozen(ed_plans):
    p = place_parameters(PROFILE, ed_plans, CLUSTER, HOSTS)
    with pytest.raises(Exception):
        p.policy = PlacementPolicy.ED_LOCAL
    with pytest.raises(TypeError):
        p.layer_hosts[0] = "host1"


def test_ed_plans_put_each_stage_on_one_host(ed_plans):
    for k in range(ed_plans[0].num_stages):
        assert len({CLUSTER.device(p.stages[k].device).host for p in ed_plans}) == 1
        assert len({(p.stages[k].first, p.stages[k].last) for p in ed_plans}) == 1


def test_ed_local_puts_partition_k_on_the_host_of_stage_k(ed_plans):
    p = place_parameters(PROFILE, ed_plans, CLUSTER, HOSTS, PlacementPolicy.ED_LOCAL)
    for plan in ed_plans:
        for stage in plan.stages:
            host = CLUSTER.device(stage.device).host
            for i in range(stage.first, stage.last + 1):
                if i in p.layer_hosts:
                    assert p.layer_hosts[i] == host


def test_cross_host_bytes_zero_for_ed_local_positive_for_default(ed_plans):
    local = place_parameters(PROFILE, ed_plans, CLUSTER, HOSTS, "ed_local")
    default = place_parameters(PROFILE, ed_plans, CLUSTER, HOSTS, "default")
    assert bytes_across_hosts_per_wave(local, ed_plans, PROFILE, CLUSTER) == 0
    crossing = bytes_across_hosts_per_wave(default, ed_plans, PROFILE, CLUSTER)
    assert crossing > 0
    # by hand: push + pull of every layer whose PS differs from its stage's host, per VW
    expected = 0
    for plan in ed_plans:
        for stage in plan.stages:
            host = CLUSTER.device(stage.device).host
            for i in range(stage.first, stage.last + 1):
                if i in default.layer_hosts and default.layer_hosts[i] != host:
                    expected += 2 * _param_bytes(i)
    assert crossing == expected


def test_traffic_shape_and_totals(ed_plans):
    p = place_parameters(PROFILE, ed_plans, CLUSTER, HOSTS, "default")
    t = traffic(p, ed_plans, PROFILE, CLUSTER)
    assert len(t) == len(ed_plans)
    assert all(len(vw) == plan.num_stages for vw, plan in zip(t, ed_plans))
    for vw in t:
        assert sum(x.bytes for stage in vw for x in stage) == sum(map(_param_bytes,
                                                                      range(NUM_LAYERS)))
        for stage in vw:
            assert all(isinstance(x, StageTraffic) and x.ps_host in HOSTS for x in stage)
    local = traffic(place_parameters(PROFILE, ed_plans, CLUSTER, HOSTS, "ed_local"),
                    ed_plans, PROFILE, CLUSTER)
    assert not any(x.crosses_host for vw in local for stage in vw for x in stage)


def test_ed_local_rejects_np_plans_naming_stage_0(np_plans):
    with pytest.raises(PlacementError, match=r"stage 0 on the same node.*Received: stage 0 "
                                             r"hosts=\{'VW 0': 'host0', 'VW 1': 'host1'"):
        place_parameters(PROFILE, np_plans, CLUSTER, HOSTS, PlacementPolicy.ED_LOCAL)
    # default placement works with any allocation
    p = place_parameters(PROFILE, np_plans, CLUSTER, HOSTS, PlacementPolicy.DEFAULT)
    assert bytes_across_hosts_per_wave(p, np_plans, PROFILE, CLUSTER) > 0


def test_ed_local_rejects_different_partitions():
    vws = allocate(CLUSTER, "HD", ranking=tuple(SLOWNESS))
    plans = plan_virtual_workers(PROFILE, vws, cluster=CLUSTER, n_m=2)
    bounds = [[(s.first, s.last) for s in p.stages] for p in plans]
    assert bounds[0] != bounds[2]  # VVQQ and RRGG get different cuts
    k = next(k for k, (a, b) in enumerate(zip(bounds[0], bounds[2])) if a != b)
    with pytest.raises(PlacementError, match=rf"same partition.*stage {k} differs"):
        place_parameters(PROFILE, plans, CLUSTER, HOSTS, "ed-local")


def test_ed_local_needs_a_ps_on_the_stage_host(ed_plans):
    with pytest.raises(PlacementError, match="needs a parameter server on the node"):
        place_parameters(PROFILE, ed_plans, CLUSTER, ("host0",), "ed_local")


def test_ps_tasks_on_the_same_machine_count_as_local():
    # Two workers and two ps tasks; ps i shares worker i's machine (same hostname).
    base = paper_cluster()
    workers = tuple(Host(name=h.name, devices=h.devices[:2], intra_bandwidth=h.intra_bandwidth,
                         task=h.task, address=f"node{i}:2222")
                    for i, h in enumerate(base.hosts[:2]))
    ps = tuple(Host(name=f"ps{i}", devices=(), intra_bandwidth=15.75e9, task=("ps", i),
                    address=f"node{i}:3333") for i in range(2))
    cluster = Cluster(hosts=workers + ps, inter_bandwidth=7e9)
    assert default_ps_hosts(cluster) == ("ps0", "ps1")
    assert node_of(cluster, "ps1") == node_of(cluster, "host1")
    vws = allocate(cluster, "ED")
    plans = tuple(solve(PROFILE, vw, 2, cluster=cluster) for vw in vws)
    p = place_parameters(PROFILE, plans, cluster, None, "ed_local")
    assert set(p.layer_hosts.values()) <= {"ps0", "ps1"}
    assert bytes_across_hosts_per_wave(p, plans, PROFILE, cluster) == 0


def test_bad_inputs(ed_plans):
    with pytest.raises(PlacementError, match="Received: placement='nearest'"):
        place_parameters(PROFILE, ed_plans, CLUSTER, HOSTS, "nearest")
    with pytest.raises(PlacementError, match="Received: plans=()"):
        place_parameters(PROFILE, (), CLUSTER, HOSTS)
    with pytest.raises(PlacementError, match="duplicates"):
        place_parameters(PROFILE, ed_plans, CLUSTER, ("host0", "host0"))
    with pytest.raises(ValueError, match="Unknown host"):
        place_parameters(PROFILE, ed_plans, CLUSTER, ("nohost",))
    other = ModelProfile("other", 8, PROFILE.layers[:4], PROFILE.cut_bytes[:3],
                         PROFILE.time_source)
    with pytest.raises(PlacementError, match="does not match the profile"):
        place_parameters(other, ed_plans, CLUSTER, HOSTS)
