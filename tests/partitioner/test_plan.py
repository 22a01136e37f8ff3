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


def _edited(mutate):
    """A saved plan's JSON, hand-edited by `mutate(dict)`."""
    import json
    d = json.loads(_plan().to_json())
    mutate(d)
    return json.dumps(d)


def test_hand_edited_json_with_a_duplicated_layer_name_is_refused():
    def dup(d):
        d["stages"][1]["layer_names"][0] = d["stages"][0]["layer_names"][0]
    original = _plan()
    name = original.stages[0].layer_names[0]
    with pytest.raises(ValueError, match=f"layer {name!r} in stage 0 and stage 1") as info:
        Plan.from_json(_edited(dup))
    assert "Received:" in str(info.value)


def test_hand_edited_json_with_layer_names_inconsistent_with_first_last_is_refused():
    def drop(d):
        d["stages"][0]["layer_names"] = d["stages"][0]["layer_names"][:-1]
    s0 = _plan().stages[0]
    with pytest.raises(ValueError, match=f"covers nodes {s0.first}..{s0.last} "
                       f"\\({s0.num_layers} layers\\) but lists {s0.num_layers - 1}"):
        Plan.from_json(_edited(drop))

    def shift(d):       # last moved by one without its names (or the next stage's first)
        d["stages"][0]["last"] += 1
    with pytest.raises(ValueError, match=f"\\({s0.num_layers + 1} layers\\) but lists "
                       f"{s0.num_layers} layer names"):
        Plan.from_json(_edited(shift))

    def shift_both(d):  # names consistent, but the next stage now starts inside this one
        d["stages"][0]["last"] += 1
        d["stages"][0]["layer_names"].append(d["stages"][1]["layer_names"][0])
    with pytest.raises(ValueError, match="contiguous"):
        Plan.from_json(_edited(shift_both))


@pytest.mark.parametrize("mutate,match", [
    (lambda d: d["stages"][0].pop("tf_device"), "missing=\\['tf_device'\\]"),
    (lambda d: d.pop("n_m"), "lacks required keys"),
    (lambda d: d["stages"][0].__setitem__("layer_names", "d1"), "list of layer-name strings"),
    (lambda d: d["stages"][1].__setitem__("index", 5), "numbered 0, 1"),
])
def test_other_hand_edits_are_value_errors_not_type_errors(mutate, match):
    with pytest.raises(ValueError, match=match):
        Plan.from_json(_edited(mutate))


def test_a_file_that_is_not_json_is_a_value_error(tmp_path):
    path = tmp_path / "plan.json"
    path.write_text("{not json")
    with pytest.raises(ValueError, match="not valid JSON"):
        Plan.load(str(path))
