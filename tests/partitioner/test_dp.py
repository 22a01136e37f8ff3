"""The DP planner (partitioner/dp.py) against the exhaustive search and the MILP.

Random instances: every device its own class (random_instance) and interchangeable devices
in classes (clustered_instance, the DP's count vectors above 1), one or two hosts, memory
from tight to loose, and knife-edge memories (exactly enough bytes, one byte short)."""

import numpy as np
import pytest
from hypothesis import given, settings, strategies as st

from hetpipe_tf.partitioner import dp, milp
from hetpipe_tf.partitioner.cost import CostModel
from hetpipe_tf.partitioner.plan import PartitionError
from tests.partitioner.instances import clustered_instance, exhaustive_best, random_instance
from tests.partitioner.knife_edge import clustered_knife_edge_instance, knife_edge_instance

DP = milp.SolverOptions(method=milp.Method.DP, usable_fraction=1.0)
MILP = milp.SolverOptions(method=milp.Method.MILP, mip_rel_gap=0.0, usable_fraction=1.0)


def _check(profile, devices, cluster, n_m, slots):
    """The DP's plan is the exhaustive optimum (or PartitionError when nothing fits), fits
    in exact bytes, is what the cost model says, and its proof brackets the optimum."""
    reference = exhaustive_best(profile, devices, cluster, n_m, slots, usable_fraction=1.0)
    cm = CostModel(profile, devices, cluster, n_m=n_m, optimizer_slots=slots,
                   usable_fraction=1.0)
    result = dp.solve(cm, devices)
    if reference is None:
        assert result is None
        with pytest.raises(PartitionError) as err:
            milp.solve(profile, devices, n_m, cluster=cluster, optimizer_slots=slots,
                       options=DP)
        assert not isinstance(err.value, milp.SolverError)
        assert not milp.fits(profile, devices, n_m, cluster=cluster, optimizer_slots=slots,
                             options=DP)
        return None
    assert result is not None and result.proven
    costs = cm.evaluate(list(result.cuts), result.order)
    assert all(c.fits for c in costs)
    assert result.value == max(c.time_s for c in costs)
    assert result.value == pytest.approx(reference, rel=1e-12)
    # The proven lower bound is a real bound, and closed on the optimum.
    assert result.lower <= reference * (1 + 1e-12)
    assert result.value <= result.lower * (1 + dp.REL_TOL) + 1e-15
    assert sorted(d.name for d in result.order) == sorted(d.name for d in devices)
    plan = milp.solve(profile, devices, n_m, cluster=cluster, optimizer_slots=slots,
                      options=DP)
    if len(devices) > 1:   # one device: one stage, nothing to search
        assert plan.solver.startswith("dp") and plan.solver.endswith("optimal")
    assert plan.predicted_stage_time_s == pytest.approx(reference, rel=1e-12)
    assert milp.fits(profile, devices, n_m, cluster=cluster, optimizer_slots=slots,
                     options=DP)
    return reference


@settings(max_examples=60, deadline=None)
@given(seed=st.integers(0, 2**31 - 1), num_layers=st.integers(2, 8),
       num_devices=st.integers(1, 5), n_m=st.integers(1, 4), slots=st.integers(0, 2),
       memory_scale=st.sampled_from([0.3, 1.0, 5.0]))
def test_dp_equals_exhaustive_search_distinct_devices(seed, num_layers, num_devices, n_m,
                                                      slots, memory_scale):
    num_devices = min(num_devices, num_layers, 4 if num_layers > 6 else 5)
    profile, devices, cluster = random_instance(seed, num_layers, num_devices,
                                                memory_scale=memory_scale)
    _check(profile, devices, cluster, n_m, slots)


@settings(max_examples=60, deadline=None)
@given(seed=st.integers(0, 2**31 - 1), num_layers=st.integers(3, 8),
       class_sizes=st.sampled_from([(2,), (3,), (2, 1), (1, 2), (2, 2), (3, 1), (2, 1, 1),
                                    (1, 1, 2), (3, 2)]),
       n_m=st.integers(1, 4), slots=st.integers(0, 2),
       memory_scale=st.sampled_from([0.3, 1.0, 5.0]))
def test_dp_equals_exhaustive_search_device_classes(seed, num_layers, class_sizes, n_m, slots,
                                                    memory_scale):
    if sum(class_sizes) > num_layers:
        class_sizes = class_sizes[:1]
    profile, devices, cluster = clustered_instance(seed, num_layers, class_sizes,
                                                   memory_scale=memory_scale)
    assert len(dp.device_classes(devices)) <= len(class_sizes)
    _check(profile, devices, cluster, n_m, slots)


@settings(max_examples=60, deadline=None)
@given(seed=st.integers(0, 2**31 - 1), num_layers=st.integers(3, 8),
       num_devices=st.integers(2, 4), n_m=st.integers(1, 3), slots=st.integers(0, 2),
       short_by=st.sampled_from([0, 1]))
def test_dp_at_the_memory_knife_edge(seed, num_layers, num_devices, n_m, slots, short_by):
    """Exactly enough bytes: the witness fits, so a layout exists and the DP finds the
    optimum. One byte short on one device: the optimum without the witness, or none."""
    num_devices = min(num_devices, num_layers)
    profile, devices, cluster, _ = knife_edge_instance(seed, num_layers, num_devices, n_m,
                                                       slots, short_by=short_by)
    found = _check(profile, devices, cluster, n_m, slots)
    if short_by == 0:
        assert found is not None


@settings(max_examples=40, deadline=None)
@given(seed=st.integers(0, 2**31 - 1), num_layers=st.integers(4, 8),
       class_sizes=st.sampled_from([(2, 1), (2, 2), (3, 1), (1, 2, 1)]),
       n_m=st.integers(1, 3), slots=st.integers(0, 2), short_by=st.sampled_from([0, 1]))
def test_dp_at_the_memory_knife_edge_with_device_classes(seed, num_layers, class_sizes, n_m,
                                                         slots, short_by):
    profile, devices, cluster, _ = clustered_knife_edge_instance(
        seed, num_layers, class_sizes, n_m, slots, short_by=short_by)
    found = _check(profile, devices, cluster, n_m, slots)
    if short_by == 0:
        assert found is not None


def test_dp_equals_the_milp_on_larger_instances():
    """Beyond the exhaustive search's reach: the DP and the per-order MILP (gap 0) agree,
    also where memory cuts stages short (the DP's sparse-table path)."""
    binding = 0
    for seed, layers, sizes in [(1, 40, (2, 2)), (2, 60, (3, 1)), (3, 30, (1, 1, 1)),
                                (4, 50, (2, 1, 1)), (5, 40, (2, 1)), (6, 40, (1, 1, 1))]:
        for scale in (20.0, 6.0):
            profile, devices, cluster = clustered_instance(seed, layers, sizes,
                                                           memory_scale=scale)
            n_m = 2
            try:
                by_milp = milp.solve(profile, devices, n_m, cluster=cluster, options=MILP)
            except PartitionError:
                with pytest.raises(PartitionError):
                    milp.solve(profile, devices, n_m, cluster=cluster, options=DP)
                continue
            by_dp = milp.solve(profile, devices, n_m, cluster=cluster, options=DP)
            assert "milp" in by_milp.solver and by_dp.solver.startswith("dp")
            assert by_dp.predicted_stage_time_s == pytest.approx(
                by_milp.predicted_stage_time_s, rel=1e-9)
            cm = CostModel(profile, devices, cluster, n_m=n_m, usable_fraction=1.0)
            binding += any(i.levels for i in dp.Problem(cm, devices).intervals.values())
    assert binding >= 2    # the memory-bound path was exercised


def test_interval_minimum_against_brute_force():
    rng = np.random.default_rng(0)
    for _ in range(200):
        L = int(rng.integers(1, 40))
        last_end = int(rng.integers(0, L))
        emax = np.minimum(rng.integers(-2, L, L), last_end)
        keys = rng.normal(size=(3, L))
        keys[rng.random((3, L)) < 0.2] = np.inf
        got = dp._Intervals(emax, last_end).min_over(keys)
        want = np.full((3, L), np.inf)
        for s in range(L):
            for e in range(s, emax[s] + 1):
                want[:, e] = np.minimum(want[:, e], keys[:, s])
        np.testing.assert_array_equal(got, want)


def test_auto_uses_the_dp_within_its_work_budget():
    profile, devices, cluster = clustered_instance(5, 12, (2, 2), memory_scale=20.0)
    auto = milp.solve(profile, devices, 2, cluster=cluster)
    assert auto.solver.startswith("dp") and "optimal" in auto.solver
    assert auto.orders_considered == milp.count_distinct_orders(devices) == 6
    small = milp.SolverOptions(dp_max_work=0)
    fallback = milp.solve(profile, devices, 2, cluster=cluster, options=small)
    assert "milp" in fallback.solver
    assert fallback.predicted_stage_time_s == pytest.approx(auto.predicted_stage_time_s,
                                                            rel=1e-6)
    assert dp.work_estimate(devices, 12) == 3 * 3 * 2 ** 2 * 12


def test_method_option_is_checked():
    assert milp.SolverOptions(method="dp").method is milp.Method.DP
    with pytest.raises(ValueError, match="method"):
        milp.SolverOptions(method="simplex")
    with pytest.raises(ValueError, match="dp_max_work"):
        milp.SolverOptions(dp_max_work=-1)


def test_a_cost_model_the_dp_does_not_know_is_refused(monkeypatch):
    """If CostModel.evaluate ever costs a stage differently from the prefix sums the DP is
    built from, the DP says so instead of returning a layout that may not be optimal."""
    profile, devices, cluster = random_instance(3, 10, 3, memory_scale=20.0)
    real = CostModel.evaluate

    def slower(self, cuts, order):
        import dataclasses
        return [dataclasses.replace(c, recv_forward_s=c.recv_forward_s + 1.0)
                for c in real(self, cuts, order)]

    monkeypatch.setattr(CostModel, "evaluate", slower)
    cm = CostModel(profile, devices, cluster, n_m=1)
    with pytest.raises(AssertionError, match="disagree with CostModel.evaluate"):
        dp.solve(cm, devices)


def test_too_many_device_classes_for_the_dp_is_refused_before_work():
    """16 devices each its own class: 2^16 count vectors. Method.DP refuses by name; AUTO
    leaves such a worker to the MILP."""
    profile, devices, cluster = random_instance(7, 100, 16, memory_scale=100.0)
    assert len(dp.device_classes(devices)) == 16
    cm = CostModel(profile, devices, cluster, n_m=1)
    with pytest.raises(PartitionError, match="too many classes.*Received: 16 classes"):
        dp.solve(cm, devices)
    assert not milp.SolverOptions().uses_dp(devices, 100)
