"""Tests of the cluster specification (hetpipe_tf.cluster.spec).

The TF cluster constructors are tested in test_tf_cluster.py, the local emulation in
test_local.py.
"""

import json

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from hetpipe_tf.cluster.catalog import DeviceKind, DeviceType, get_device_type
from hetpipe_tf.cluster.spec import (
    Cluster,
    Device,
    Host,
    paper_cluster,
    tf_device_kind,
)

GIB = 2**30


def _two_host_cluster(**device_kw):
    h0 = Host("h0", (Device("h0/gpu0", "TITAN_V", "h0", "/device:GPU:0", **device_kw),
                     Device("h0/gpu1", "TITAN_V", "h0", "/device:GPU:1")), 10e9)
    h1 = Host("h1", (Device("h1/gpu0", "RTX_2060", "h1", "/device:GPU:2"),), 12e9)
    return Cluster((h0, h1), inter_bandwidth=5e9)


# ------------------------------------------------------------------ queries


def test_queries():
    c = _two_host_cluster(memory_bytes=5 * GIB)
    assert [d.name for d in c.devices] == ["h0/gpu0", "h0/gpu1", "h1/gpu0"]
    assert c.device("h1/gpu0").type_name == "RTX_2060"
    assert c.same_host("h0/gpu0", "h0/gpu1")
    assert not c.same_host(c.device("h0/gpu0"), "h1/gpu0")
    assert c.memory_of("h0/gpu0") == 5 * GIB  # the device's own limit
    assert c.memory_of("h0/gpu1") == 12 * GIB  # the type's memory
    assert c.device_type("h1/gpu0") is get_device_type("RTX_2060")
    assert c.host_of("h1/gpu0").intra_bandwidth == 12e9
    assert not c.is_emulated
    with pytest.raises(ValueError, match="Received: name='nope'"):
        c.device("nope")
    with pytest.raises(ValueError, match="Received: name='nope'"):
        c.host("nope")


def test_device_type_name_is_normalised():
    d = Device("a", "titan v", "h", "/device:GPU:0")
    assert d.type_name == "TITAN_V"


def test_tf_device_kind():
    assert tf_device_kind("/job:worker/replica:0/task:1/device:GPU:0") == "GPU"
    assert tf_device_kind("/device:CPU:3") == "CPU"
    assert tf_device_kind("/job:worker/task:0") is None


# ----------------------------------------------------------- serialisation


def test_json_round_trip_is_exact(tmp_path):
    c = _two_host_cluster(emulated_speed_factor=0.25, memory_bytes=3 * GIB + 7)
    d = c.to_dict()
    assert json.loads(json.dumps(d)) == d
    assert Cluster.from_dict(d) == c
    assert Cluster.from_json(c.to_json()) == c
    path = tmp_path / "cluster.json"
    path.write_text(c.to_json())
    assert Cluster.from_json(path) == c
    assert Cluster.from_json(str(path)) == c
    assert Cluster.from_dict(paper_cluster().to_dict()) == paper_cluster()


def test_custom_device_types_travel_with_the_cluster():
    t = DeviceType("SPEC_TEST_GPU", DeviceKind.GPU, 256, 1000.0, 2 * GIB, 100e9)
    c = Cluster.local([t, "TITAN_V"])  # registers t
    d = c.to_dict()
    assert [x["name"] for x in d["device_types"]] == ["SPEC_TEST_GPU"]
    assert DeviceType.from_dict(d["device_types"][0]) == t
    assert Cluster.from_dict(d) == c
    conflicting = json.loads(json.dumps(d))
    conflicting["device_types"][0]["cores"] = 999
    with pytest.raises(ValueError, match="already registered"):
        Cluster.from_dict(conflicting)


def test_from_dict_rejects_unknown_keys():
    with pytest.raises(ValueError, match="Received: keys="):
        Cluster.from_dict({**paper_cluster().to_dict(), "extra": 1})


@settings(max_examples=30, deadline=None)
@given(
    hosts=st.lists(
        st.tuples(
            st.lists(st.sampled_from(["TITAN_V", "T4", "LOCAL_CPU", "A100_80GB"]),
                     min_size=0, max_size=3),
            st.floats(min_value=1e6, max_value=1e12, allow_nan=False),
        ),
        min_size=1, max_size=4,
    ).filter(lambda hs: any(types for types, _ in hs)),
    inter=st.floats(min_value=1e6, max_value=1e12),
    factor=st.floats(min_value=1e-3, max_value=10.0),
)
def test_round_trip_property(hosts, inter, factor):
    host_list, i = [], 0
    for h, (types, bw) in enumerate(hosts):
        devices = []
        for k, t in enumerate(types):
            devices.append(Device(f"h{h}/d{k}", t, f"h{h}", f"/device:CPU:{i}",
                                  emulated_speed_factor=factor if k % 2 else 1.0,
                                  memory_bytes=(i + 1) * 1000 if k % 3 == 2 else None))
            i += 1
        host_list.append(Host(f"h{h}", tuple(devices), bw,
                              task=("worker", h) if h % 2 else None))
    c = Cluster(tuple(host_list), inter)
    assert Cluster.from_json(c.to_json(indent=None)) == c



# --------------------------------------------------------------- validation


def test_duplicate_device_names():
    h0 = Host("h0", (Device("d", "T4", "h0", "/device:GPU:0"),), 1e9)
    h1 = Host("h1", (Device("d", "T4", "h1", "/device:GPU:1"),), 1e9)
    with pytest.raises(ValueError, match="Duplicate device name. Received: name='d'"):
        Cluster((h0, h1), 1e9)


def test_duplicate_host_names_and_tf_devices_and_tasks():
    h = Host("h0", (Device("a", "T4", "h0", "/device:GPU:0"),), 1e9)
    with pytest.raises(ValueError, match="Duplicate host name. Received:"):
        Cluster((h, h), 1e9)
    shared = Host("h0", (Device("a", "T4", "h0", "/device:GPU:0"),
                         Device("b", "T4", "h0", "/device:GPU:0")), 1e9)
    with pytest.raises(ValueError, match="share one TF device. Received:"):
        Cluster((shared,), 1e9)
    t0 = Host("h0", (Device("a", "T4", "h0", "/device:GPU:0"),), 1e9, task=("worker", 0))
    t1 = Host("h1", (Device("b", "T4", "h1", "/device:GPU:1"),), 1e9, task=("worker", 0))
    with pytest.raises(ValueError, match="same TF task. Received:"):
        Cluster((t0, t1), 1e9)


def test_unknown_device_type():
    h = Host("h0", (Device("a", "MYSTERY_GPU", "h0", "/device:GPU:0"),), 1e9)
    with pytest.raises(ValueError, match="Received: name='MYSTERY_GPU'"):
        Cluster((h,), 1e9)


def test_no_devices():
    with pytest.raises(ValueError, match="at least one compute device. Received:"):
        Cluster((Host("ps", (), 1e9, task=("ps", 0)),), 1e9)
    with pytest.raises(ValueError, match="at least one compute device. Received:"):
        Cluster((), 1e9)


@pytest.mark.parametrize("bw", [0, -1.0, float("inf"), float("nan"), "fast", True])
def test_bad_bandwidths(bw):
    with pytest.raises(ValueError, match="Received: inter_bandwidth="):
        Cluster((Host("h", (Device("a", "T4", "h", "/device:GPU:0"),), 1e9),), bw)
    with pytest.raises(ValueError, match="Received: intra_bandwidth="):
        Host("h", (), bw)


@pytest.mark.parametrize("kw, match", [
    ({"emulated_speed_factor": 0}, "Received: emulated_speed_factor=0"),
    ({"emulated_speed_factor": float("nan")}, "Received: emulated_speed_factor=nan"),
    ({"memory_bytes": 0}, "Received: memory_bytes=0"),
    ({"memory_bytes": 1.5}, "Received: memory_bytes=1.5"),
    ({"tf_device": "GPU:0"}, "Received: tf_device='GPU:0'"),
    ({"name": ""}, "Received: name=''"),
])
def test_device_validation(kw, match):
    args = {"name": "a", "type_name": "T4", "host": "h", "tf_device": "/device:GPU:0", **kw}
    with pytest.raises(ValueError, match=match):
        Device(**args)


def test_host_validation():
    with pytest.raises(ValueError, match="Received: device.host='other', host='h'"):
        Host("h", (Device("a", "T4", "other", "/device:GPU:0"),), 1e9)
    with pytest.raises(ValueError, match="Received: task="):
        Host("h", (), 1e9, task=("worker", -1))
    assert Host("h", [], 1e9, task=["worker", 2]).task == ("worker", 2)


# ----------------------------------------------------------- paper cluster


def test_paper_cluster():
    c = paper_cluster()
    assert len(c.hosts) == 4 and len(c.devices) == 16
    assert [h.devices[0].type_name for h in c.hosts] == [
        "TITAN_V", "TITAN_RTX", "RTX_2060", "QUADRO_P4000"]
    assert all(len({d.type_name for d in h.devices}) == 1 and len(h.devices) == 4
               for h in c.hosts)
    assert all(h.intra_bandwidth == 15.75e9 for h in c.hosts)
    assert c.inter_bandwidth == 7e9
    assert c.device("host2/gpu3").tf_device == "/job:worker/replica:0/task:2/device:GPU:3"
    assert c.same_host("host1/gpu0", "host1/gpu3")
    assert not c.is_emulated


# ----------------------------------------------------- files a user wrote by hand


def test_from_json_missing_file_is_a_value_error(tmp_path):
    with pytest.raises(ValueError, match="No cluster JSON file at this path. Received: "
                       "path='papr'"):
        Cluster.from_json("papr")
    with pytest.raises(ValueError, match="No cluster JSON file"):
        Cluster.from_json(str(tmp_path))            # a directory


def test_from_json_bad_json_and_missing_keys_are_value_errors(tmp_path):
    path = tmp_path / "c.json"
    path.write_text("{'hosts': []}")                 # Python, not JSON
    with pytest.raises(ValueError, match="not valid JSON"):
        Cluster.from_json(str(path))
    d = paper_cluster().to_dict()
    del d["hosts"][1]["devices"][0]["tf_device"]
    path.write_text(json.dumps(d))
    with pytest.raises(ValueError, match="malformed.*KeyError: 'tf_device'"):
        Cluster.from_json(str(path))


@pytest.mark.parametrize("field, value", [
    ("memory_bytes", 0), ("memory_bytes", -GIB), ("memory_bandwidth", -1e11),
    ("memory_bandwidth", 0.0),
])
def test_custom_device_type_with_bad_memory_or_bandwidth_is_refused(tmp_path, field, value):
    d = paper_cluster().to_dict()
    custom = {"name": f"BAD_{field.upper()}", "kind": "GPU", "cores": 1000,
              "boost_clock_mhz": 1000.0, "memory_bytes": 4 * GIB, "memory_bandwidth": 1e11,
              field: value}
    d["device_types"] = [custom]
    d["hosts"][0]["devices"][0]["type_name"] = custom["name"]
    path = tmp_path / "c.json"
    path.write_text(json.dumps(d))
    with pytest.raises(ValueError, match=f"{field} must be .*Received: {field}={value!r}"):
        Cluster.from_json(str(path))
