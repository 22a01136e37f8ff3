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
    profile_model,
)

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
