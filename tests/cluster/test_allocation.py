"""Resource allocation policies NP / ED / HD / AUTO (paper Section 8.1, Table 3)."""

import collections

import pytest
from hypothesis import given, settings, strategies as st

from hetpipe_tf.cluster.allocation import (
    AllocationError, AllocationPolicy, allocate, choose_policy, compare_policies,
    device_speeds, straggler_score, type_string)
from hetpipe_tf.cluster.spec import Cluster, Device, Host, paper_cluster
from hetpipe_tf.partitioner.profile import LayerCost, ModelProfile

PAPER_RANKING = ("TITAN_V", "TITAN_RTX", "RTX_2060", "QUADRO_P4000")  # V > R > G > Q


def _profile(factors):
    """A 3-layer profile whose model time on each type is proportional to its factor."""
    layers = tuple(LayerCost(name=f"l{i}", time_s={t: f * 1e-3 for t, f in factors.items()},
                             flops=0, bytes_accessed=0, param_bytes=0,
                             trainable_param_bytes=0, activation_bytes=0) for i in range(3))
    return ModelProfile("m", 8, layers, (0, 0), {t: "measured" for t in factors})


# Measured order of the paper: V faster than R although R has the higher peak FLOP/s.
PAPER_PROFILE = _profile({"TITAN_V": 1.0, "TITAN_RTX": 1.1, "RTX_2060": 1.9,
                          "QUADRO_P4000": 2.4})


def _strings(vws):
    return [type_string(vw) for vw in vws]


def _cluster(per_host):
    hosts = []
    n = 0
    for h, types in enumerate(per_host):
        devs = []
        for t in types:
            devs.append(Device(name=f"h{h}/d{n}", type_name=t, host=f"h{h}",
                               tf_device=f"/device:CPU:{n}"))
            n += 1
        hosts.append(Host(name=f"h{h}", devices=tuple(devs), intra_bandwidth=15.75e9))
    return Cluster(hosts=tuple(hosts), inter_bandwidth=7e9)


def test_np_is_table3():
    vws = allocate(paper_cluster(), AllocationPolicy.NP)
    assert _strings(vws) == ["VVVV", "RRRR", "GGGG", "QQQQ"]
    assert all(len({d.host for d in vw}) == 1 for vw in vws)


def test_ed_is_table3_device_i_of_each_host():
    vws = allocate(paper_cluster(), AllocationPolicy.ED)
    assert _strings(vws) == ["VRGQ"] * 4
    for i, vw in enumerate(vws):
        assert [d.name for d in vw] == [f"host{h}/gpu{i}" for h in range(4)]


@pytest.mark.parametrize("kwargs", [{"profile": PAPER_PROFILE}, {"ranking": PAPER_RANKING},
                                    {"ranking": ["TITAN V", "titan rtx", "GeForce RTX 2060",
                                                 "Quadro P4000"]}])
def test_hd_is_table3_with_measured_ranking(kwargs):
    vws = allocate(paper_cluster(), AllocationPolicy.HD, **kwargs)
    assert _strings(vws) == ["VVQQ", "VVQQ", "RRGG", "RRGG"]
    # each VW spans exactly two hosts, and every device is used once
    assert all(len({d.host for d in vw}) == 2 for vw in vws)
    assert sorted(d.name for vw in vws for d in vw) == sorted(
        d.name for d in paper_cluster().devices)


def test_hd_with_peak_flops_ranks_titan_rtx_first():
    # Catalog peak FLOP/s: TITAN_RTX 16.3 T > TITAN_V 14.9 T > RTX_2060 > P4000.
    vws = allocate(paper_cluster(), AllocationPolicy.HD)
    assert _strings(vws) == ["RRQQ", "RRQQ", "VVGG", "VVGG"]


def test_policy_names_parse():
    assert AllocationPolicy.parse("hd") is AllocationPolicy.HD
    assert AllocationPolicy.parse(" auto ") is AllocationPolicy.AUTO
    with pytest.raises(AllocationError, match="Received: policy='xx'"):
        AllocationPolicy.parse("xx")
    assert _strings(allocate(paper_cluster(), "np")) == ["VVVV", "RRRR", "GGGG", "QQQQ"]


def test_counts_and_np_chunks():
    c = paper_cluster()
    assert _strings(allocate(c, "NP", gpus_per_worker=2)) == ["VV", "VV", "RR", "RR", "GG",
                                                              "GG", "QQ", "QQ"]
    assert _strings(allocate(c, "ED", num_virtual_workers=2)) == ["VVRRGGQQ"] * 2
    assert _strings(allocate(c, "ED", gpus_per_worker=8)) == ["VVRRGGQQ"] * 2
    assert _strings(allocate(c, "ED", num_virtual_workers=1)) == ["VVVVRRRRGGGGQQQQ"]
    assert _strings(allocate(c, "HD", gpus_per_worker=8, ranking=PAPER_RANKING)) == [
        "VVVVQQQQ", "RRRRGGGG"]


def test_errors_name_the_received_values():
    c = paper_cluster()
    with pytest.raises(AllocationError, match=r"Received: num_virtual_workers=3, devices=16"):
        allocate(c, "ED", num_virtual_workers=3)
    with pytest.raises(AllocationError, match=r"Received: num_virtual_workers=8, devices "
                                              r"per host="):
        allocate(c, "ED", num_virtual_workers=8)
    with pytest.raises(AllocationError, match="pass only one"):
        allocate(c, "ED", num_virtual_workers=4, gpus_per_worker=2)
    with pytest.raises(AllocationError, match="gpus_per_worker must be an int"):
        allocate(c, "NP", gpus_per_worker=0)
    with pytest.raises(AllocationError, match="NP keeps each virtual worker"):
        allocate(c, "NP", gpus_per_worker=8)
    with pytest.raises(AllocationError, match=r"HD pairs.*Received: pair=\{'TITAN_V': 3, "
                                              r"'QUADRO_P4000': 1\}, gpus_per_worker=2"):
        # the V+Q pair fills 2 VWs of 2, but 3 V and 1 Q cannot be halved
        allocate(_cluster([["TITAN_V"] * 3, ["QUADRO_P4000"]]), "HD", gpus_per_worker=2)
    with pytest.raises(AllocationError, match="ranking leaves out"):
        allocate(c, "HD", ranking=["TITAN_V"])
    with pytest.raises(AllocationError, match="score is only used by AUTO"):
        allocate(c, "ED", score=lambda vws: 0.0)
    with pytest.raises(AllocationError, match="needs a Cluster"):
        allocate(None, "ED")


def test_ed_uneven_hosts():
    uneven = _cluster([["TITAN_V"] * 3, ["RTX_2060"] * 2])
    with pytest.raises(AllocationError, match=r"devices per host=\{'h0': 3, 'h1': 2\}"):
        allocate(uneven, "ED")
    with pytest.raises(AllocationError, match="must divide each host"):
        allocate(uneven, "ED", num_virtual_workers=5)
    # a mixed host whose types cannot be shared equally
    mixed = _cluster([["TITAN_V", "TITAN_V", "TITAN_V", "RTX_2060"]])
    with pytest.raises(AllocationError, match="cannot share equally"):
        allocate(mixed, "ED", num_virtual_workers=2)
    # gcd > 1 with uneven hosts is fine: each VW gets 2 of h0 and 1 of h1
    ok = allocate(_cluster([["TITAN_V"] * 4, ["RTX_2060"] * 2]), "ED")
    assert [type_string(vw, {"TITAN_V": "V", "RTX_2060": "G"}) for vw in ok] == ["VVG"] * 2


def test_ps_hosts_without_devices_are_ignored():
    c = paper_cluster()
    ps = Host(name="ps0", devices=(), intra_bandwidth=15.75e9, task=("ps", 0))
    c2 = Cluster(hosts=c.hosts + (ps,), inter_bandwidth=c.inter_bandwidth)
    assert allocate(c2, "NP") == allocate(c, "NP")
    assert allocate(c2, "ED") == allocate(c, "ED")


@settings(max_examples=40, deadline=None)
@given(st.lists(st.lists(st.sampled_from(PAPER_RANKING), min_size=1, max_size=4),
                min_size=1, max_size=4),
       st.integers(1, 4))
def test_ed_vws_have_equal_multisets_and_host_shares(per_host_types, v):
    # repeat each host's list v times so every (host, type) count divides by v
    cluster = _cluster([types * v for types in per_host_types])
    vws = allocate(cluster, "ED", num_virtual_workers=v)
    assert len(vws) == v
    multisets = [collections.Counter(d.type_name for d in vw) for vw in vws]
    assert all(m == multisets[0] for m in multisets)
    shares = [collections.Counter(d.host for d in vw) for vw in vws]
    assert all(s == shares[0] for s in shares)
    assert sorted(d.name for vw in vws for d in vw) == sorted(d.name for d in cluster.devices)


def test_device_speeds_follow_profile_and_emulation():
    c = _cluster([["TITAN_V", "TITAN_RTX"]])
    s = device_speeds(c.devices, profile=PAPER_PROFILE)
    assert s["h0/d0"] > s["h0/d1"]
    assert device_speeds(c.devices)["h0/d1"] > device_speeds(c.devices)["h0/d0"]


def test_auto_default_heuristic_is_straggler_aware():
    c = paper_cluster()
    scores = {p.policy: p.score for p in compare_policies(c, ranking=PAPER_RANKING)}
    assert scores[AllocationPolicy.NP] < scores[AllocationPolicy.HD] < \
        scores[AllocationPolicy.ED]
    assert straggler_score(allocate(c, "NP")) == scores[AllocationPolicy.NP]
    assert choose_policy(c, ranking=PAPER_RANKING).policy is AllocationPolicy.ED
    assert _strings(allocate(c, "AUTO", ranking=PAPER_RANKING)) == ["VRGQ"] * 4


def test_auto_uses_the_scorer_and_breaks_ties_by_fewer_hosts():
    c = paper_cluster()
    # A scorer preferring many distinct types per VW picks ED; a constant scorer ties,
    # and the tie goes to NP (one host per VW).
    assert _strings(allocate(c, "AUTO", score=lambda vws: len(set(type_string(vws[0]))))) \
        == ["VRGQ"] * 4
    assert _strings(allocate(c, "AUTO", score=lambda vws: 1.0)) == [
        "VVVV", "RRRR", "GGGG", "QQQQ"]
    # Where HD cannot be built AUTO skips it (and reports why).
    # 3 hosts x 2 GPUs into 2 VWs of 3: NP cannot split a host of 2 into 3s, HD's R+Q
    # pair (4 devices) does not fill VWs of 3; only ED (VRQ, VRQ) remains.
    odd = _cluster([["TITAN_V"] * 2, ["TITAN_RTX"] * 2, ["QUADRO_P4000"] * 2])
    cands = {p.policy: p for p in compare_policies(odd, num_virtual_workers=2)}
    assert cands[AllocationPolicy.HD].virtual_workers is None
    assert "HD pairs" in cands[AllocationPolicy.HD].error
    assert cands[AllocationPolicy.NP].virtual_workers is None
    assert choose_policy(odd, num_virtual_workers=2).policy is AllocationPolicy.ED
    assert _strings(allocate(odd, "AUTO", num_virtual_workers=2)) == ["VRQ"] * 2


def test_auto_errors_when_nothing_fits():
    c = paper_cluster()
    with pytest.raises(AllocationError, match="No allocation policy"):
        allocate(c, "AUTO", num_virtual_workers=3)
