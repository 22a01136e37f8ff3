"""The MILP against an exhaustive search, memory, N_m, infeasibility and input errors."""

import numpy as np
import pytest
from hypothesis import given, settings, strategies as st

from hetpipe_tf.cluster.spec import paper_cluster
from hetpipe_tf.partitioner import bounds, milp
from hetpipe_tf.partitioner.cost import CostModel
from hetpipe_tf.partitioner.plan import PartitionError
from tests.partitioner.instances import exhaustive_best, random_instance

DP = milp.SolverOptions(method=milp.Method.DP)
EXACT = milp.SolverOptions(method=milp.Method.MILP, mip_rel_gap=0.0)
ASSIGN = milp.SolverOptions(method=milp.Method.MILP, mip_rel_gap=0.0, max_enumerated_orders=0)


def _value(profile, devices, cluster, n_m, options, slots=0):
    try:
        plan = milp.solve(profile, devices, n_m, cluster=cluster, optimizer_slots=slots,
                          options=options)
    except PartitionError:
        return None, None
    return plan.predicted_stage_time_s, plan


@settings(max_examples=40, deadline=None)
@given(seed=st.integers(0, 2**31 - 1), num_layers=st.integers(2, 7),
       num_devices=st.integers(1, 4), n_m=st.integers(1, 4), slots=st.integers(0, 2),
       memory_scale=st.sampled_from([0.3, 1.0, 5.0]))
def test_milp_optimum_equals_exhaustive_search(seed, num_layers, num_devices, n_m, slots,
                                               memory_scale):
    num_devices = min(num_devices, num_layers)
    profile, devices, cluster = random_instance(seed, num_layers, num_devices,
                                                memory_scale=memory_scale)
    reference = exhaustive_best(profile, devices, cluster, n_m, slots)
    for options in (DP, EXACT, ASSIGN):
        value, plan = _value(profile, devices, cluster, n_m, options, slots)
        if reference is None:
            assert value is None, f"MILP found {value} where nothing fits ({options})"
            continue
        assert value == pytest.approx(reference, rel=1e-6), options
        # The plan respects memory and is what the cost model says it is.
        for stage in plan.stages:
            assert stage.memory_bytes <= stage.memory_available
        assert sorted(plan.devices) == sorted(d.name for d in devices)


def test_plan_covers_model_and_reports_costs():
    profile, devices, cluster = random_instance(3, 12, 3, memory_scale=5.0)
    plan = milp.solve(profile, devices, 2, cluster=cluster, optimizer_slots=1)
    assert [s.first for s in plan.stages][0] == 0 and plan.stages[-1].last == 11
    assert plan.n_m == 2 and plan.num_stages == 3
    cm = CostModel(profile, [cluster.device(n) for n in plan.devices], cluster, n_m=2,
                   optimizer_slots=1)
    costs = cm.evaluate([s.last for s in plan.stages[:-1]],
                        [cluster.device(n) for n in plan.devices])
    for stage, cost in zip(plan.stages, costs):
        assert stage.time_s == pytest.approx(cost.time_s)
        assert stage.memory_bytes == cost.memory_bytes
    assert [s.minibatches_held for s in plan.stages] == [2, 2, 1]
    assert plan.bottleneck.time_s == max(s.time_s for s in plan.stages)


def test_interchangeable_devices_are_not_enumerated_twice():
    cluster = paper_cluster()
    host0 = cluster.hosts[0].devices            # four TITAN V on one host
    assert milp.count_distinct_orders(host0) == 1
    ed = [h.devices[0] for h in cluster.hosts]  # one of each type, each on its own host
    assert milp.count_distinct_orders(ed) == 24
    assert len(set(tuple(d.name for d in o) for o in milp.distinct_orders(ed))) == 24
    mixed = list(cluster.hosts[0].devices[:2]) + list(cluster.hosts[3].devices[:2])
    assert milp.count_distinct_orders(mixed) == 6
    assert len(list(milp.distinct_orders(mixed))) == 6


def test_many_orders_use_the_assignment_milp():
    profile, devices, cluster = random_instance(11, 8, 4, memory_scale=5.0)
    few = milp.solve(profile, devices, 1, cluster=cluster, options=EXACT)
    many = milp.solve(profile, devices, 1, cluster=cluster, options=ASSIGN)
    assert "assignment" in many.solver and "assignment" not in few.solver
    assert many.predicted_stage_time_s == pytest.approx(few.predicted_stage_time_s, rel=1e-6)


def test_max_minibatches_is_the_memory_edge():
    profile, devices, cluster = random_instance(4, 10, 3, memory_scale=10.0)
    m = milp.max_minibatches(profile, devices, cluster=cluster, optimizer_slots=1, limit=16)
    assert 1 <= m < 16
    assert milp.fits(profile, devices, m, cluster=cluster, optimizer_slots=1)
    assert not milp.fits(profile, devices, m + 1, cluster=cluster, optimizer_slots=1)
    # Adam's two slots per weight need more memory than SGD's none.
    assert milp.max_minibatches(profile, devices, cluster=cluster, optimizer_slots=2,
                                limit=16) <= m


def test_plan_virtual_workers_uses_minimum_max_m():
    profile, devices, cluster = random_instance(3, 10, 4, memory_scale=10.0)
    vws = [devices[:2], devices[2:]]
    maxes = [milp.max_minibatches(profile, vw, cluster=cluster, limit=16) for vw in vws]
    assert maxes[0] != maxes[1]
    plans = milp.plan_virtual_workers(profile, vws, cluster=cluster, limit=16)
    assert [p.n_m for p in plans] == [min(maxes)] * 2
    assert [set(p.devices) for p in plans] == [{d.name for d in vw} for vw in vws]


def test_infeasible_names_short_devices_and_suggests_fixes():
    profile, devices, cluster = random_instance(2, 6, 2, memory_scale=0.05)
    assert exhaustive_best(profile, devices, cluster, 2) is None
    with pytest.raises(PartitionError) as err:
        milp.solve(profile, devices, 2, cluster=cluster)
    text = str(err.value)
    assert "short by" in text and "Received:" in text and "To fix" in text
    assert any(d.name in text for d in devices)
    assert "add devices" in text


def test_infeasible_suggests_smaller_n_m_when_that_fits():
    profile, devices, cluster = random_instance(4, 10, 3, memory_scale=10.0)
    m = milp.max_minibatches(profile, devices, cluster=cluster, limit=16)
    with pytest.raises(PartitionError, match=f"N_m={m} fits"):
        milp.solve(profile, devices, m + 1, cluster=cluster)


@pytest.mark.parametrize("n_m", [0, -1, 1.5, True])
def test_bad_n_m(n_m):
    profile, devices, cluster = random_instance(1, 4, 2)
    with pytest.raises(PartitionError, match="n_m"):
        milp.solve(profile, devices, n_m, cluster=cluster)


def test_bad_device_lists():
    profile, devices, cluster = random_instance(1, 4, 2)
    with pytest.raises(PartitionError, match="duplicate"):
        milp.solve(profile, [devices[0], devices[0]], 1, cluster=cluster)
    with pytest.raises(PartitionError, match="at least one device"):
        milp.solve(profile, [], 1, cluster=cluster)
    small, _, _ = random_instance(1, 2, 1)
    three = random_instance(1, 4, 3)
    with pytest.raises(PartitionError, match="fewer layers"):
        milp.solve(small, three[1], 1, cluster=three[2])


def test_device_type_missing_from_profile():
    cluster = paper_cluster()
    profile, _, _ = random_instance(1, 4, 1)
    titan_rtx = cluster.hosts[1].devices[0]     # TITAN_RTX is not in the random profile
    with pytest.raises(ValueError, match="TITAN_RTX"):
        milp.solve(profile, [titan_rtx], 1, cluster=cluster)


def test_cut_windows_never_exclude_the_optimum():
    for seed in range(20):
        profile, devices, cluster = random_instance(seed, 9, 3, memory_scale=100.0)
        plan = milp.solve(profile, devices, 1, cluster=cluster, options=EXACT)
        order = [cluster.device(n) for n in plan.devices]
        cm = CostModel(profile, order, cluster, n_m=1)
        lo, hi = bounds.cut_windows(cm, order, plan.predicted_stage_time_s)
        cuts = np.array([s.last for s in plan.stages[:-1]])
        assert np.all(lo <= cuts) and np.all(cuts <= hi)


@pytest.mark.parametrize("method", [milp.Method.MILP, milp.Method.DP])
def test_time_budget_keeps_the_best_layout_found(method):
    profile, devices, cluster = random_instance(9, 30, 4, memory_scale=100.0)
    # A budget too small for every order: the heuristic incumbent (or better) comes back,
    # marked, and it is a valid layout (the DP: its first layout, before any bisection).
    plan = milp.solve(profile, devices, 1, cluster=cluster,
                      options=milp.SolverOptions(method=method, time_limit_s=1e-9))
    assert "time limit reached" in plan.solver
    assert all(s.memory_bytes <= s.memory_available for s in plan.stages)
    exact = milp.solve(profile, devices, 1, cluster=cluster,
                       options=milp.SolverOptions(method=method))
    assert plan.predicted_stage_time_s >= exact.predicted_stage_time_s * (1 - 1e-9)
    assert "time limit" not in exact.solver


def test_assignment_out_of_time_returns_the_greedy_layout():
    profile, devices, cluster = random_instance(9, 30, 4, memory_scale=100.0)
    options = milp.SolverOptions(method=milp.Method.MILP, max_enumerated_orders=0,
                                 time_limit_s=1e-9)
    plan = milp.solve(profile, devices, 1, cluster=cluster, options=options)
    assert "time limit reached, greedy layout" in plan.solver
    assert all(s.memory_bytes <= s.memory_available for s in plan.stages)
