"""Tests of the device catalog (hetpipe_tf.cluster.catalog)."""

import dataclasses
import os

import pytest

from hetpipe_tf.cluster import catalog
from hetpipe_tf.cluster.catalog import (
    DeviceKind,
    DeviceType,
    canonical_type_name,
    get_device_type,
    known_device_types,
    local_cpu_type,
    register_device_type,
)

GIB = 2**30

# Table 1 of the HetPipe paper: cores, boost clock (MHz), memory (GB), bandwidth (GB/s), year.
TABLE_1 = {
    "TITAN_V": (5120, 1455, 12, 653, 2017),
    "TITAN_RTX": (4608, 1770, 24, 672, 2018),
    "RTX_2060": (1920, 1680, 6, 336, 2019),
    "QUADRO_P4000": (1792, 1480, 8, 243, 2017),
}


@pytest.mark.parametrize("name", sorted(TABLE_1))
def test_table_1_values(name):
    cores, clock, mem_gb, bw_gb_s, year = TABLE_1[name]
    t = get_device_type(name)
    assert t.kind is DeviceKind.GPU
    assert t.cores == cores
    assert t.boost_clock_mhz == clock
    assert t.memory_bytes == mem_gb * GIB
    assert t.memory_bandwidth == bw_gb_s * 1e9
    assert t.year == year
    assert t.peak_flops == pytest.approx(cores * clock * 1e6 * 2)
    assert t.launch_overhead_s == pytest.approx(10e-6)


def test_peak_flops_of_current_gpus_match_data_sheets():
    # FP32 non-tensor peaks from NVIDIA data sheets, in TFLOP/s.
    expected = {"V100_16GB": 15.7, "A100_40GB": 19.5, "A100_80GB": 19.5, "H100_SXM": 66.9,
                "RTX_3090": 35.6, "RTX_4090": 82.6, "T4": 8.1, "L4": 30.3, "A10": 31.2}
    for name, tflops in expected.items():
        assert get_device_type(name).peak_flops / 1e12 == pytest.approx(tflops, abs=0.06), name
    assert get_device_type("A100_80GB").memory_bandwidth == 2039e9
    assert get_device_type("H100_SXM").memory_bytes == 80 * GIB


def test_explicit_peak_flops_is_kept():
    t = DeviceType("X_GPU", DeviceKind.GPU, 100, 1000.0, GIB, 1e9, peak_flops=1e12)
    assert t.peak_flops == 1e12


@pytest.mark.parametrize("spelling", ["TITAN V", "titan_v", "Titan-V", " titan v ",
                                      "NVIDIA TITAN V"])
def test_lookup_is_case_insensitive(spelling):
    assert get_device_type(spelling) is get_device_type("TITAN_V")


def test_lookup_strips_brand_prefixes():
    assert get_device_type("GeForce RTX 2060").name == "RTX_2060"
    assert get_device_type("Quadro P4000").name == "QUADRO_P4000"
    assert canonical_type_name("Tesla T4") == "T4"


def test_unknown_type_lists_known_names():
    with pytest.raises(ValueError, match="Received: name='NOT_A_GPU'") as e:
        get_device_type("NOT_A_GPU")
    assert "TITAN_V" in str(e.value) and "register_device_type" in str(e.value)


def test_known_device_types_is_sorted_and_complete():
    names = known_device_types()
    assert list(names) == sorted(names)
    for n in list(TABLE_1) + ["V100_16GB", "V100_32GB", "A100_40GB", "A100_80GB", "H100_SXM",
                              "RTX_3090", "RTX_4090", "A10", "T4", "L4", "LOCAL_CPU"]:
        assert n in names


def test_local_cpu_describes_this_machine():
    t = local_cpu_type()
    assert t.name == "LOCAL_CPU" and t.kind is DeviceKind.CPU
    expected_cores = (len(os.sched_getaffinity(0)) if hasattr(os, "sched_getaffinity")
                      else os.cpu_count())
    assert t.cores == expected_cores
    assert t.memory_bytes == os.sysconf("SC_PHYS_PAGES") * os.sysconf("SC_PAGE_SIZE")
    assert t.peak_flops == pytest.approx(
        t.cores * t.boost_clock_mhz * 1e6 * catalog.ASSUMED_CPU_FLOPS_PER_CYCLE_PER_CORE)
    assert "assum" in t.description


def _custom(name="MY_TEST_GPU", **changes):
    base = DeviceType(name, DeviceKind.GPU, 1000, 1500.0, 4 * GIB, 200e9, year=2021)
    return dataclasses.replace(base, **changes)


def test_register_custom_type_and_duplicates():
    t = _custom("MY_TEST_GPU_A")
    assert register_device_type(t) is t
    assert get_device_type("my test gpu a") is t
    assert "MY_TEST_GPU_A" in known_device_types()
    register_device_type(_custom("MY_TEST_GPU_A"))  # equal re-registration is a no-op
    other = _custom("MY_TEST_GPU_A", cores=2000)
    with pytest.raises(ValueError, match="already registered.*Received:"):
        register_device_type(other)
    assert get_device_type("MY_TEST_GPU_A").cores == 1000
    register_device_type(other, overwrite=True)
    assert get_device_type("MY_TEST_GPU_A").cores == 2000


def test_register_rejects_non_device_type():
    with pytest.raises(ValueError, match="Received:"):
        register_device_type("TITAN_V")


def test_dict_round_trip():
    for name in ("TITAN_V", "LOCAL_CPU"):
        t = get_device_type(name)
        assert DeviceType.from_dict(t.to_dict()) == t
    with pytest.raises(ValueError, match="Received: keys=\\['bogus'\\]"):
        DeviceType.from_dict({**get_device_type("T4").to_dict(), "bogus": 1})
    with pytest.raises(ValueError, match="Received: kind='TPU'"):
        DeviceType.from_dict({**get_device_type("T4").to_dict(), "kind": "TPU"})


@pytest.mark.parametrize("changes, field", [
    ({"cores": 0}, "cores"),
    ({"cores": 1.5}, "cores"),
    ({"boost_clock_mhz": -1.0}, "boost_clock_mhz"),
    ({"memory_bytes": 0}, "memory_bytes"),
    ({"memory_bandwidth": float("nan")}, "memory_bandwidth"),
    ({"peak_flops": -5.0}, "peak_flops"),
    ({"launch_overhead_s": -1e-6}, "launch_overhead_s"),
    ({"year": "2020"}, "year"),
])
def test_validation_errors(changes, field):
    with pytest.raises(ValueError, match=f"Received: {field}="):
        _custom(**changes)


def test_name_must_be_upper_snake_case():
    with pytest.raises(ValueError, match="Received: name='my gpu'.*'MY_GPU'"):
        _custom("my gpu")


def test_cpu_type_needs_peak_flops():
    with pytest.raises(ValueError, match="Received: peak_flops=None"):
        DeviceType("SOME_CPU", DeviceKind.CPU, 8, 3000.0, GIB, 20e9)


def test_kind_must_be_enum():
    with pytest.raises(ValueError, match="Received: kind='GPU'"):
        _custom(kind="GPU")
