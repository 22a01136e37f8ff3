"""Tests of the profiler: FLOPs against formulas, measured/estimated/calibrated times, JSON."""

import dataclasses

import keras
import numpy as np
import pytest

from hetpipe_tf.cluster.catalog import DeviceKind, get_device_type, local_cpu_type
from hetpipe_tf.partitioner.layer_graph import LayerGraph
from hetpipe_tf.partitioner.profile import (
    DEFAULT_EFFICIENCY,
    LayerCost,
    ModelProfile,
    estimate_time,
)
from hetpipe_tf.partitioner.profiling import profile_model

L = keras.layers
F32 = 4
BATCH = 8
IN, HID, OUT = 16, 32, 4


def _tiny_model():
    x = keras.Input((IN,))
    h = L.Dense(HID, name="d1")(x)
    s = L.Add(name="add")([h, L.Dense(HID, name="d2")(h)])
    b = L.BatchNormalization(name="bn")(s)
    return keras.Model(x, L.Dense(OUT, name="head")(b))


def _cpu_type(name, speedup):
    # Launch overhead 0 so that the roofline alone sets the estimate.
    return dataclasses.replace(
        local_cpu_type(), name=name, peak_flops=local_cpu_type().peak_flops * speedup,
        memory_bandwidth=local_cpu_type().memory_bandwidth * speedup, launch_overhead_s=0.0)


@pytest.fixture(scope="module")
def model():
    return _tiny_model()


@pytest.fixture(scope="module")
def profile(model):
    types = ["LOCAL_CPU", "TITAN_V", _cpu_type("SLOW_CPU", 1.0), _cpu_type("FAST_CPU", 2.0)]
    return profile_model(model, BATCH, types, measure_on={"LOCAL_CPU": "/CPU:0"}, repeats=2)


def test_flops_match_independent_formulas(profile):
    by_name = {c.name: c for c in profile.layers}
    # Dense forward per sample: 2*in*out (MatMul) + out (BiasAdd, one FLOP an element);
    # a layer with weights costs 3x its forward for forward+backward.
    assert by_name["d1"].flops == (2 * IN * HID + HID) * BATCH * 3
    assert by_name["d2"].flops == (2 * HID * HID + HID) * BATCH * 3
    assert by_name["head"].flops == (2 * HID * OUT + OUT) * BATCH * 3
    # Add of two tensors: one FLOP an element; no weights -> 2x.
    assert by_name["add"].flops == HID * BATCH * 2


def test_memory_and_cut_bytes(profile, model):
    by_name = {c.name: c for c in profile.layers}
    assert by_name["d1"].param_bytes == (IN * HID + HID) * F32
    # BatchNorm: gamma, beta trainable; moving mean and variance not.
    assert by_name["bn"].param_bytes == 4 * HID * F32
    assert by_name["bn"].trainable_param_bytes == 2 * HID * F32
    assert by_name["head"].activation_bytes == OUT * BATCH * F32
    # bytes_accessed = 3 x (input + output + params) of the minibatch.
    assert by_name["d1"].bytes_accessed == 3 * ((IN + HID) * BATCH * F32 + (IN * HID + HID) * F32)
    graph = LayerGraph.from_model(model)
    assert profile.cut_bytes == tuple(b * BATCH for b in graph.all_cut_bytes_per_sample())
    assert profile.cut_bytes[1] == 2 * HID * BATCH * F32  # d1 and d2 outputs cross after d2


def test_time_sources_and_measured_times(profile):
    assert dict(profile.time_source) == {
        "LOCAL_CPU": "measured", "TITAN_V": "estimated", "SLOW_CPU": "calibrated",
        "FAST_CPU": "calibrated"}
    assert all(c.time_s["LOCAL_CPU"] > 0 for c in profile.layers)


def test_estimated_time_is_roofline(profile):
    titan = get_device_type("TITAN_V")
    for c in profile.layers:
        roofline = max(c.flops / titan.peak_flops, c.bytes_accessed / titan.memory_bandwidth)
        expected = roofline / DEFAULT_EFFICIENCY[DeviceKind.GPU] + titan.launch_overhead_s
        assert c.time_s["TITAN_V"] == pytest.approx(expected)
        assert estimate_time(c.flops, c.bytes_accessed, titan) == pytest.approx(expected)


def test_calibrated_times_follow_peak_ratio(profile):
    for c in profile.layers:
        assert c.time_s["SLOW_CPU"] == pytest.approx(2.0 * c.time_s["FAST_CPU"])


def test_calibration_reproduces_measured_class_totals(model):
    # A type with the local CPU's numbers gets, per layer class, the measured total.
    twin = dataclasses.replace(local_cpu_type(), name="TWIN_CPU")
    p = profile_model(model, BATCH, ["LOCAL_CPU", twin], measure_on={"local cpu": "/CPU:1"},
                      measure_batch_size=4, repeats=1)
    dense = [c for c in p.layers if c.name in ("d1", "d2", "head")]
    assert sum(c.time_s["TWIN_CPU"] for c in dense) == pytest.approx(
        sum(c.time_s["LOCAL_CPU"] for c in dense))


def test_profiling_leaves_model_state_unchanged(model):
    bn = model.get_layer("bn")
    before = [w.numpy().copy() for w in bn.weights]
    profile_model(model, BATCH, ["LOCAL_CPU"], measure_on={"LOCAL_CPU": "/CPU:0"}, repeats=1)
    for w, b in zip(bn.weights, before):
        np.testing.assert_array_equal(w.numpy(), b)


def test_profiling_leaves_seed_generators_and_the_optimizer_unchanged():
    """Every variable a layer owns (seed generators' states of Dropout, GaussianNoise,
    augmentation layers) and the compiled optimizer's are as before profiling."""
    x = keras.Input((6, 6, 1))
    h = keras.layers.RandomFlip("horizontal")(x)
    h = keras.layers.Flatten()(keras.layers.SpatialDropout2D(0.3)(h))
    h = keras.layers.GaussianNoise(0.2)(keras.layers.Dense(8)(h))
    m = keras.Model(x, keras.layers.Dense(1)(keras.layers.Dropout(0.5)(h)))
    m.compile(keras.optimizers.Adam(0.1), "mse")
    m.optimizer.build(m.trainable_variables)
    m.optimizer.iterations.assign(3)
    state = m.variables + m.optimizer.variables
    assert sum("seed_generator" in v.path for v in state) >= 4   # the test sees them
    before = [np.array(v.numpy()) for v in state]
    profile_model(m, BATCH, ["LOCAL_CPU"], measure_on={"LOCAL_CPU": "/CPU:0"}, repeats=1)
    for v, b in zip(state, before):
        np.testing.assert_array_equal(v.numpy(), b, err_msg=v.path)


def test_json_round_trip(profile):
    text = profile.to_json()
    again = ModelProfile.from_json(text)
    assert again == profile
    assert again.to_json() == text
    assert LayerCost.from_dict(profile.layers[0].to_dict()) == profile.layers[0]


def test_scaled_is_linear(profile):
    double = profile.scaled(2 * BATCH)
    assert double.batch_size == 2 * BATCH
    assert double.cut_bytes == tuple(2 * b for b in profile.cut_bytes)
    for a, b in zip(profile.layers, double.layers):
        assert b.flops == 2 * a.flops
        assert b.activation_bytes == 2 * a.activation_bytes
        assert b.param_bytes == a.param_bytes
        assert b.bytes_accessed - 3 * b.param_bytes == 2 * (a.bytes_accessed - 3 * a.param_bytes)
        assert b.time_s["TITAN_V"] == pytest.approx(2 * a.time_s["TITAN_V"])


def test_sequential_estimate_only():
    model = keras.Sequential([keras.Input((3,)), L.Dense(2, name="h"), L.ReLU(name="r")])
    p = profile_model(model, 4, ["RTX_2060"])
    assert [c.name for c in p.layers] == ["h", "r"]
    assert dict(p.time_source) == {"RTX_2060": "estimated"}
    assert len(p.cut_bytes) == 1


@pytest.mark.parametrize(
    "kwargs, message",
    [
        (dict(batch_size=0), "Received: batch_size=0"),
        (dict(device_types=["NOT_A_GPU"]), "Unknown device type. Received: name='NOT_A_GPU'"),
        (dict(device_types=[]), "non-empty.*Received:"),
        (dict(measure_on={"TITAN_V": "/CPU:0"}), r"not profiled. Received: measure_on\['TITAN_V'\]"),
        (dict(measure_on={"LOCAL_CPU": "/GPU:7"}), "not present. Received:"),
        (dict(repeats=0), "Received: repeats=0"),
        (dict(measure_batch_size=-1), "Received: measure_batch_size=-1"),
        (dict(optimizer=3), "needs a Keras optimizer or its name. Received: optimizer=3"),
        (dict(optimizer="sgdx"), "Unknown optimizer for the update cost. Received: "
                                 "optimizer='sgdx'"),
    ],
)
def test_profile_model_validation(model, kwargs, message):
    args = dict(batch_size=BATCH, device_types=["LOCAL_CPU"]) | kwargs
    batch_size, device_types = args.pop("batch_size"), args.pop("device_types")
    with pytest.raises(ValueError, match=message):
        profile_model(model, batch_size, device_types, **args)


def test_model_profile_validation(profile):
    with pytest.raises(ValueError, match="cut_bytes.*Received:"):
        dataclasses.replace(profile, cut_bytes=profile.cut_bytes[:-1])
    with pytest.raises(ValueError, match="wrong keys. Received:"):
        ModelProfile.from_dict(profile.to_dict() | {"extra": 1})
    with pytest.raises(ValueError, match="Received: batch_size=0"):
        profile.scaled(0)


# --- the per-minibatch update (optimizer step + next weight-version snapshot) -------------
@pytest.fixture(scope="module")
def adam_profile(model):
    types = ["LOCAL_CPU", "TITAN_V", _cpu_type("SLOW_CPU", 1.0), _cpu_type("FAST_CPU", 2.0)]
    return profile_model(model, BATCH, types, measure_on={"LOCAL_CPU": "/CPU:0"}, repeats=1,
                         optimizer="adam")


def test_update_cost_per_layer(adam_profile):
    by_name = {c.name: c for c in adam_profile.layers}
    assert adam_profile.update_optimizer == "adam"
    assert all(set(c.update_s) == set(adam_profile.time_source) for c in adam_profile.layers)
    # no weights, no update; every layer with weights is measured > 0 on the local CPU
    assert all(v == 0 for v in by_name["add"].update_s.values())
    assert all(by_name[n].update_s["LOCAL_CPU"] > 0 for n in ("d1", "d2", "bn", "head"))
    # estimated: bytes / bandwidth / efficiency + launch, bytes = trainable x (5 + 2 x 2
    # slots) + float non-trainable x 5 (BatchNorm's moving mean and variance)
    titan = get_device_type("TITAN_V")
    expect = {"d1": (IN * HID + HID) * F32 * 9, "bn": 2 * HID * F32 * 9 + 2 * HID * F32 * 5,
              "head": (HID * OUT + OUT) * F32 * 9}
    for name, nbytes in expect.items():
        assert by_name[name].update_s["TITAN_V"] == pytest.approx(
            nbytes / titan.memory_bandwidth / DEFAULT_EFFICIENCY[DeviceKind.GPU]
            + titan.launch_overhead_s)
    # calibrated CPU types keep the estimate's ratio (one ratio per kind)
    for c in adam_profile.layers:
        assert c.update_s["SLOW_CPU"] == pytest.approx(2.0 * c.update_s["FAST_CPU"])
    # the ratio: measured / estimated on the local CPU, pooled over all layers
    local = local_cpu_type()
    nbytes = [expect.get(c.name, {"d2": (HID * HID + HID) * F32 * 9}.get(c.name, 0))
              for c in adam_profile.layers]
    est = [0.0 if b == 0 else b / local.memory_bandwidth / DEFAULT_EFFICIENCY[DeviceKind.CPU]
           + local.launch_overhead_s for b in nbytes]
    ratio = sum(c.update_s["LOCAL_CPU"] for c in adam_profile.layers) / sum(est)
    for c, b in zip(adam_profile.layers, nbytes):   # SLOW_CPU: the local figures, launch 0
        assert c.update_s["SLOW_CPU"] == pytest.approx(
            b / local.memory_bandwidth / DEFAULT_EFFICIENCY[DeviceKind.CPU] * ratio)


def test_update_cost_is_not_scaled_and_round_trips(adam_profile):
    double = adam_profile.scaled(2 * BATCH)
    assert [c.update_s for c in double.layers] == [c.update_s for c in adam_profile.layers]
    again = ModelProfile.from_json(adam_profile.to_json())
    assert again == adam_profile and again.update_optimizer == "adam"
    # a profile saved before update costs existed loads with none
    old = adam_profile.to_dict()
    del old["update_optimizer"]
    for layer in old["layers"]:
        del layer["update_s"]
    loaded = ModelProfile.from_dict(old)
    assert loaded.update_optimizer == "" and all(not c.update_s for c in loaded.layers)


def test_update_optimizer_defaults_to_the_compiled_one():
    model = keras.Sequential([keras.Input((3,)), L.Dense(2, name="h")])
    assert profile_model(model, 4, ["RTX_2060"]).update_optimizer == ""
    model.compile(keras.optimizers.SGD(momentum=0.9), "mse")
    p = profile_model(model, 4, ["RTX_2060"])
    assert p.update_optimizer == "sgd"
    rtx = get_device_type("RTX_2060")
    # SGD with momentum keeps one slot: trainable x (5 + 2)
    assert p.layers[0].update_s["RTX_2060"] == pytest.approx(
        (3 * 2 + 2) * F32 * 7 / rtx.memory_bandwidth / DEFAULT_EFFICIENCY[DeviceKind.GPU]
        + rtx.launch_overhead_s)


def test_measuring_the_update_leaves_the_model_unchanged(model):
    before = [w.numpy().copy() for w in model.weights]
    profile_model(model, BATCH, ["LOCAL_CPU"], measure_on={"LOCAL_CPU": "/CPU:0"}, repeats=1,
                  optimizer=keras.optimizers.Adam(0.1))
    for w, b in zip(model.weights, before):
        np.testing.assert_array_equal(w.numpy(), b)


def test_update_is_measured_outside_the_callers_strategy():
    # The planner profiles at the first fit, inside HetPipeStrategy's scope, which refuses
    # an optimizer updating variables that are not its model's: the measurement runs on a
    # thread of its own (a strategy scope is thread-local).
    from hetpipe_tf.cluster.spec import Cluster
    from hetpipe_tf.strategy import HetPipeStrategy

    strategy = HetPipeStrategy(Cluster.local(["LOCAL_CPU"]))
    try:
        with strategy.scope():
            model = keras.Sequential([keras.Input((3,)), L.Dense(2, name="h")])
            model.compile(keras.optimizers.Adam(), "mse")
            before = [w.numpy().copy() for w in model.weights]
            p = profile_model(model, 4, ["LOCAL_CPU"], measure_on={"LOCAL_CPU": "/CPU:0"},
                              repeats=1)
        assert p.update_optimizer == "adam" and p.layers[0].update_s["LOCAL_CPU"] > 0
        for w, b in zip(model.weights, before):
            np.testing.assert_array_equal(w.numpy(), b)
    finally:
        strategy.close()
