"""HetSeq shares: exact values, the min-max property against brute force, refusals."""

import itertools

import pytest
from hypothesis import given, settings, strategies as st

from hetpipe_tf.cluster.spec import Cluster
from hetpipe_tf.partitioner.layer_graph import LayerGraph
from hetpipe_tf.partitioner.profiling import profile_model
from hetpipe_tf.partitioner.shares import (DeviceSpeed, ShareError, choose_shares,
                                           given_shares, speeds_from_profile, uniform_speeds)


def test_shares_follow_speed_factors_exactly():
    s = choose_shares(56, uniform_speeds(["a", "b", "c", "d"], [1, 1, 1, 0.5]))
    assert s.sizes == (16, 16, 16, 8)
    assert s.offsets == (0, 16, 32, 48, 56)
    assert s.step_s == (16.0, 16.0, 16.0, 16.0)
    assert "1.75x" in s.reason and "[14, 14, 14, 14]" in s.reason


def test_fixed_cost_and_memory_bound():
    speeds = [DeviceSpeed("fast", 1.0, fixed_s=3.0), DeviceSpeed("slow", 2.0),
              DeviceSpeed("small", 1.0, max_samples=2)]
    s = choose_shares(10, speeds)
    # fast: 3 + n, slow: 2n, small: n <= 2 -> (5, 3, 2): times 8, 6, 2; any other is worse.
    assert s.sizes == (5, 3, 2)
    assert "small: 2" in s.reason and "memory bound" in s.reason


def test_ties_go_to_the_lower_index_and_every_device_takes_part():
    s = choose_shares(5, uniform_speeds(["a", "b", "c"]))
    assert s.sizes == (2, 2, 1)
    s = choose_shares(3, [DeviceSpeed("a", 1.0), DeviceSpeed("b", 100.0), DeviceSpeed("c", 1.0)])
    assert s.sizes == (1, 1, 1)   # the minimum of one sample each


def test_split_of_a_smaller_batch_is_proportional_and_within_the_shares():
    s = choose_shares(56, uniform_speeds(["a", "b", "c", "d"], [1, 1, 1, 0.5]))
    assert s.split(56) == s.sizes
    assert s.split(28) == (8, 8, 8, 4)
    assert s.split(3) == (1, 1, 1, 0)
    assert s.split(0) == (0, 0, 0, 0)
    g = given_shares([10, 10, 10, 2], uniform_speeds(["a", "b", "c", "d"]), 32)
    assert g.given and g.split(16) == (5, 5, 5, 1)
    with pytest.raises(ShareError, match="larger than the global batch.*batch of 57"):
        s.split(57)


def _brute_force(n, speeds, minimum=1):
    best = None
    for sizes in itertools.product(range(minimum, n + 1), repeat=len(speeds)):
        if sum(sizes) != n or any(s.max_samples is not None and k > s.max_samples
                                  for s, k in zip(speeds, sizes)):
            continue
        t = max(s.time(k) for s, k in zip(speeds, sizes))
        best = t if best is None else min(best, t)
    return best


@settings(max_examples=60, deadline=None)
@given(st.lists(st.tuples(st.integers(1, 9), st.integers(0, 5), st.one_of(st.none(),
                                                                      st.integers(1, 6))),
                min_size=1, max_size=3),
       st.integers(1, 12))
def test_the_slowest_share_is_as_fast_as_any_split_allows(devs, n):
    speeds = [DeviceSpeed(f"d{i}", float(a), fixed_s=float(f), max_samples=c)
              for i, (a, f, c) in enumerate(devs)]
    best = _brute_force(n, speeds)
    if best is None:
        with pytest.raises(ShareError):
            choose_shares(n, speeds)
        return
    s = choose_shares(n, speeds)
    assert sum(s.sizes) == n and min(s.sizes) >= 1
    assert all(c is None or k <= c for k, c in zip(s.sizes, (x[2] for x in devs)))
    assert max(s.step_s) == pytest.approx(best)
    # A remainder split never exceeds a share and sums to the batch.
    for m in range(n + 1):
        part = s.split(m)
        assert sum(part) == m and all(0 <= p <= k for p, k in zip(part, s.sizes))


def test_bad_input_is_refused_with_what_and_how():
    four = uniform_speeds(["a", "b", "c", "d"])
    with pytest.raises(ShareError, match="smaller than the number of devices.*batch_size=3 "
                                         "for 4 devices"):
        choose_shares(3, four)
    with pytest.raises(ShareError, match="memory cannot hold.*at most 4 samples fit"):
        choose_shares(8, uniform_speeds(["a", "b"], max_samples=[2, 2]))
    with pytest.raises(ShareError, match=r"do not sum.*sum 31\), batch_size=32"):
        given_shares([10, 10, 10, 1], four, 32)
    with pytest.raises(ShareError, match="exceeds its device's memory.*b: share 9 > max 8"):
        given_shares([8, 9], uniform_speeds(["a", "b"], max_samples=[8, 8]), 17)
    with pytest.raises(ShareError, match="one size per device"):
        given_shares([8, 8, 8], uniform_speeds(["a", "b"]))
    with pytest.raises(ShareError, match="at least one sample"):
        given_shares([8, 0], uniform_speeds(["a", "b"]))
    with pytest.raises(ShareError, match="seconds_per_sample must be"):
        DeviceSpeed("x", 0.0)


def test_speeds_from_a_profile_use_emulated_factors_and_memory():
    import keras
    model = keras.Sequential([keras.Input((8,)), keras.layers.Dense(16, name="a"),
                              keras.layers.Dense(1, name="b")])
    cluster = Cluster.local(["LOCAL_CPU"] * 3, emulated_speed_factors=[1.0, 1.0, 0.5])
    profile = profile_model(LayerGraph.from_model(model), 32, ["LOCAL_CPU"])
    speeds = speeds_from_profile(profile, cluster.devices, cluster)
    assert speeds[2].seconds_per_sample == pytest.approx(2 * speeds[0].seconds_per_sample)
    assert speeds[0].seconds_per_sample == pytest.approx(speeds[1].seconds_per_sample)
    assert all(s.max_samples and s.max_samples > 10**6 for s in speeds)
    assert choose_shares(20, speeds).sizes == (8, 8, 4)
