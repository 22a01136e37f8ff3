"""Plan: validation, JSON round trip, matching a model, the printed table."""

import dataclasses

import pytest

from hetpipe_tf.partitioner import milp
from hetpipe_tf.partitioner.plan import PartitionError, Plan
from tests.partitioner.instances import random_instance


def _plan():
    profile, devices, cluster = random_instance(0, 9, 3, memory_scale=100.0)
    return milp.solve(profile, devices, 2, cluster=cluster, optimizer_slots=2)


def test_json_round_trip_is_exact(tmp_path):
    plan = _plan()
    assert Plan.from_json(plan.to_json()) == plan
    path = tmp_path / "plan.json"
    plan.save(str(path))
    assert Plan.load(str(path)) == plan


def test_unknown_keys_are_rejected():
    d = _plan().to_dict()
    d["n_m_typo"] = 3
    with pytest.raises(ValueError, match="n_m_typo"):
        Plan.from_dict(d)


def test_stages_must_be_contiguous_and_cover_the_model():
    plan = _plan()
    gap = dataclasses.replace(plan.stages[1], first=plan.stages[1].first + 1)
    with pytest.raises(PartitionError, match="contiguous"):
        dataclasses.replace(plan, stages=(plan.stages[0], gap, *plan.stages[2:]))
    with pytest.raises(PartitionError, match="cover"):
        dataclasses.replace(plan, num_layers=plan.num_layers + 1)
    with pytest.raises(PartitionError, match="at least one stage"):
        dataclasses.replace(plan, stages=())


def test_check_matches_names_the_first_difference():
    plan = _plan()
    names = [n for s in plan.stages for n in s.layer_names]
    plan.check_matches(names)
    with pytest.raises(PartitionError, match="position 4"):
        plan.check_matches(names[:4] + ["other"] + names[5:])
    with pytest.raises(PartitionError, match="plan has 9 layers, model has 8"):
        plan.check_matches(names[:-1])


def test_stage_lookup_and_table():
    plan = _plan()
    for s in plan.stages:
        assert plan.stage_of_node(s.first) == s.index == plan.stage_of_node(s.last)
    with pytest.raises(ValueError, match="node=99"):
        plan.stage_of_node(99)
    text = plan.table()
    assert f"N_m={plan.n_m}" in text and f"bottleneck stage {plan.bottleneck.index}" in text
    for s in plan.stages:
        assert s.device in text and f"{s.time_s * 1e3:.2f}" in text
    assert "emulated x0.5" in text or all(s.emulated_speed_factor == 1 for s in plan.stages)
