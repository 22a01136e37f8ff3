"""Cuts between two calls of a shared layer (tied weights) are never chosen: every method
(DP, per-order MILP, assignment MILP) equals the exhaustive search over the allowed cuts,
and a virtual worker with more devices than the allowed cuts allow is refused by name."""

import dataclasses

import keras
import numpy as np
import pytest
from hypothesis import given, settings, strategies as st

from hetpipe_tf.cluster.spec import Cluster
from hetpipe_tf.partitioner import milp
from hetpipe_tf.partitioner.plan import PartitionError
from hetpipe_tf.partitioner.planner import plan_model
from hetpipe_tf.partitioner.profile import ModelProfile
from tests.partitioner.instances import exhaustive_best, random_instance

METHODS = {
    "dp": milp.SolverOptions(method=milp.Method.DP, usable_fraction=1.0),
    "milp": milp.SolverOptions(method=milp.Method.MILP, mip_rel_gap=0.0, usable_fraction=1.0),
    "assignment": milp.SolverOptions(method=milp.Method.MILP, mip_rel_gap=0.0,
                                     usable_fraction=1.0, max_enumerated_orders=0),
}


@settings(max_examples=40, deadline=None)
@given(seed=st.integers(0, 2**31 - 1), num_layers=st.integers(3, 8),
       num_devices=st.integers(2, 4), n_m=st.integers(1, 3),
       memory_scale=st.sampled_from([0.5, 5.0]), data=st.data())
def test_every_method_equals_exhaustive_search_over_the_allowed_cuts(
        seed, num_layers, num_devices, n_m, memory_scale, data):
    if num_devices > num_layers:
        num_devices = num_layers
    profile, devices, cluster = random_instance(seed, num_layers, num_devices,
                                                memory_scale=memory_scale)
    cuts = list(range(num_layers - 1))
    forbidden = data.draw(st.lists(st.sampled_from(cuts), unique=True,
                                   max_size=len(cuts) - (num_devices - 1)))
    profile = dataclasses.replace(profile, forbidden_cuts=tuple(forbidden))
    reference = exhaustive_best(profile, devices, cluster, n_m, usable_fraction=1.0)
    for name, options in METHODS.items():
        if reference is None:
            with pytest.raises(PartitionError):
                milp.solve(profile, devices, n_m, cluster=cluster, options=options)
            continue
        plan = milp.solve(profile, devices, n_m, cluster=cluster, options=options)
        chosen = [s.last for s in plan.stages[:-1]]
        assert not set(chosen) & set(forbidden), (name, chosen, forbidden)
        assert plan.predicted_stage_time_s == pytest.approx(reference, rel=1e-6), name


def test_too_many_devices_for_the_allowed_cuts_is_refused_by_name():
    profile, devices, cluster = random_instance(0, 4, 3, memory_scale=5.0)
    profile = dataclasses.replace(profile, forbidden_cuts=(0, 1))   # one cut left
    with pytest.raises(PartitionError, match=r"shared layer.*leaves 1 allowed cuts.*"
                                             r"Received: 3 devices; use at most 2"):
        milp.solve(profile, devices, 1, cluster=cluster)


def test_profile_records_forbidden_cuts_and_json_keeps_them():
    x = keras.Input((6,))
    shared = keras.layers.BatchNormalization(name="shared")   # state beyond its weights
    h = keras.layers.Dense(6, name="mid")(shared(x))
    model = keras.Model(x, keras.layers.Dense(1, name="out")(shared(h)))
    cluster = Cluster.local(["LOCAL_CPU"] * 2)
    result = plan_model(model, cluster, 8, measure=False)
    assert result.profile.forbidden_cuts == (0, 1)
    assert ModelProfile.from_json(result.profile.to_json()).forbidden_cuts == (0, 1)
    assert [s.layer_names for s in result.plan.stages] == [("shared", "mid", "shared@1"),
                                                          ("out",)]
    old = result.profile.to_dict()
    del old["forbidden_cuts"]                           # a profile saved before the field
    assert ModelProfile.from_dict(old).forbidden_cuts == ()
    assert np.isfinite(result.plan.predicted_stage_time_s)
    # The stages' own updates (SGD by default) are in the plan and its table.
    assert all(s.update_s > 0 for s in result.plan.stages)
    assert "update ms" in result.plan.table()


def test_a_tied_layer_may_be_split_and_its_later_call_is_charged_the_borrowed_copy():
    x = keras.Input((6,))
    tied = keras.layers.Dense(6, name="tied")
    h = keras.layers.Dense(6, name="mid")(tied(x))
    model = keras.Model(x, keras.layers.Dense(1, name="out")(tied(h)))
    result = plan_model(model, Cluster.local(["LOCAL_CPU"] * 2), 8, measure=False)
    assert result.profile.forbidden_cuts == ()
    layers = {l.name: l for l in result.profile.layers}
    kernel_and_bias = (6 * 6 + 6) * 4
    assert layers["tied@1"].tied_bytes == 2 * kernel_and_bias   # copy + its gradient
    assert layers["tied"].tied_bytes == layers["mid"].tied_bytes == 0
    assert ModelProfile.from_json(result.profile.to_json()).layers[2].tied_bytes == 2 * 168
    # Its time also holds the exchange with the other device (weights in, gradient out).
    from hetpipe_tf.partitioner.comm import CommModel
    from hetpipe_tf.partitioner.cost import CostModel
    cluster = Cluster.local(["LOCAL_CPU"] * 2)
    devices = list(cluster.devices)
    cm = CostModel(result.profile, devices, cluster, n_m=1)
    extra = (cm.layer_time(devices[1]) - cm.layer_compute_time(devices[1])
             - cm.layer_update_time(devices[1]))
    exchange = CommModel().seconds(2 * 168, devices[0], devices[1], cluster)
    np.testing.assert_allclose(extra, [0.0, 0.0, exchange, 0.0], atol=1e-15)
    assert exchange > 0
