"""Tests of the cluster specification (hetpipe_tf.cluster.spec)."""

import json
import os
import pathlib
import subprocess
import sys

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from hetpipe_tf.cluster.catalog import DeviceKind, DeviceType, get_device_type
from hetpipe_tf.cluster.spec import (
    INFINIBAND_56G_BANDWIDTH,
    PCIE3_X16_BANDWIDTH,
    Cluster,
    Device,
    Host,
    configure_logical_devices,
    paper_cluster,
    relative_speed_factors,
    tf_device_kind,
)

GIB = 2**30
REPO_ROOT = pathlib.Path(__file__).resolve().parents[2]
TF_SPEC = {
    "chief": ["127.0.0.1:2000"],
    "worker": ["127.0.0.1:2001", "127.0.0.1:2002"],
    "ps": ["127.0.0.1:2003"],
}


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


# ------------------------------------------------------ TensorFlow clusters


def test_from_tf_cluster_spec_dict_and_cluster_spec():
    import tensorflow as tf

    decl = {"worker:0": ["TITAN_V", "TITAN_V"], ("worker", 1): ["RTX 2060", "LOCAL_CPU"],
            "/job:chief/task:0": ["T4"]}
    from_dict = Cluster.from_tf_cluster_spec(TF_SPEC, decl, inter_bandwidth=1e9)
    from_spec = Cluster.from_tf_cluster_spec(tf.train.ClusterSpec(TF_SPEC), decl,
                                             inter_bandwidth=1e9)
    resolver = tf.distribute.cluster_resolver.SimpleClusterResolver(
        tf.train.ClusterSpec(TF_SPEC))
    from_resolver = Cluster.from_tf_cluster_spec(resolver, decl, inter_bandwidth=1e9)
    assert from_dict == from_spec == from_resolver
    c = from_dict
    assert [h.name for h in c.hosts] == ["chief0", "worker0", "worker1", "ps0"]
    assert [h.task for h in c.hosts] == [("chief", 0), ("worker", 0), ("worker", 1), ("ps", 0)]
    assert c.host("worker1").address == "127.0.0.1:2002"
    assert c.host("ps0").devices == ()
    assert [(d.name, d.type_name, d.tf_device) for d in c.devices] == [
        ("chief0/gpu0", "T4", "/job:chief/replica:0/task:0/device:GPU:0"),
        ("worker0/gpu0", "TITAN_V", "/job:worker/replica:0/task:0/device:GPU:0"),
        ("worker0/gpu1", "TITAN_V", "/job:worker/replica:0/task:0/device:GPU:1"),
        ("worker1/gpu0", "RTX_2060", "/job:worker/replica:0/task:1/device:GPU:0"),
        ("worker1/cpu0", "LOCAL_CPU", "/job:worker/replica:0/task:1/device:CPU:0"),
    ]
    assert c.inter_bandwidth == 1e9
    assert all(h.intra_bandwidth == PCIE3_X16_BANDWIDTH for h in c.hosts)
    assert not c.is_emulated


def test_from_tf_cluster_spec_sparse_tasks():
    c = Cluster.from_tf_cluster_spec({"worker": {3: "w3:1", 1: "w1:1"}},
                                     {"worker:3": ["T4"], "worker:1": ["L4"]})
    assert [h.name for h in c.hosts] == ["worker1", "worker3"]
    assert c.device("worker3/gpu0").tf_device == "/job:worker/replica:0/task:3/device:GPU:0"


@pytest.mark.parametrize("decl, match", [
    ({"ps:0": ["T4"]}, "Parameter-server tasks carry no compute devices"),
    ({"worker:7": ["T4"]}, "Received: task=worker:7"),
    ({"worker:0": ["NO_SUCH_GPU"]}, "Received: name='NO_SUCH_GPU'"),
    ({"worker:0": "T4"}, "Received: devices='T4'"),
    ({"bad key": ["T4"]}, "Received: key='bad key'"),
    ({"worker:0": ["T4"], ("worker", 0): ["T4"]}, "declared twice"),
    ({}, "at least one compute device"),
])
def test_from_tf_cluster_spec_errors(decl, match):
    with pytest.raises(ValueError, match=match) as e:
        Cluster.from_tf_cluster_spec(TF_SPEC, decl)
    assert "Received:" in str(e.value)


def test_from_tf_cluster_spec_rejects_bad_spec():
    with pytest.raises(ValueError, match="Received: cluster_spec="):
        Cluster.from_tf_cluster_spec({}, {})


def test_from_tf_config():
    config = {
        "cluster": TF_SPEC,
        "task": {"type": "worker", "index": 1},
        "hetpipe": {
            "devices": {"worker:0": ["TITAN_V"], "worker:1": ["QUADRO_P4000", "CFG_GPU"]},
            "inter_bandwidth": 2e9,
            "intra_bandwidth": 3e9,
            "device_types": [DeviceType("CFG_GPU", DeviceKind.GPU, 64, 1000.0, GIB,
                                        50e9).to_dict()],
        },
    }
    c = Cluster.from_tf_config({"TF_CONFIG": json.dumps(config)})
    assert [d.type_name for d in c.devices] == ["TITAN_V", "QUADRO_P4000", "CFG_GPU"]
    assert c.device("worker1/gpu1").tf_device == "/job:worker/replica:0/task:1/device:GPU:1"
    assert c.inter_bandwidth == 2e9
    assert c.host("worker0").intra_bandwidth == 3e9
    assert get_device_type("CFG_GPU").cores == 64


def test_from_tf_config_defaults_and_override():
    env = {"TF_CONFIG": json.dumps({"cluster": TF_SPEC})}
    c = Cluster.from_tf_config(env)
    # Without declarations every worker contributes its CPU:0 as a LOCAL_CPU device.
    assert [(d.name, d.type_name) for d in c.devices] == [
        ("worker0/cpu0", "LOCAL_CPU"), ("worker1/cpu0", "LOCAL_CPU")]
    assert c.inter_bandwidth == INFINIBAND_56G_BANDWIDTH
    c2 = Cluster.from_tf_config(env, device_declarations={"chief:0": ["A10"]})
    assert [d.name for d in c2.devices] == ["chief0/gpu0"]


@pytest.mark.parametrize("env, match", [
    ({}, "TF_CONFIG is not set"),
    ({"TF_CONFIG": "{not json"}, "not valid JSON"),
    ({"TF_CONFIG": json.dumps({"task": {}})}, "no 'cluster' entry"),
    ({"TF_CONFIG": json.dumps({"cluster": TF_SPEC, "hetpipe": {"devcies": {}}})},
     "unknown entries"),
])
def test_from_tf_config_errors(env, match):
    with pytest.raises(ValueError, match=match) as e:
        Cluster.from_tf_config(env)
    assert "Received:" in str(e.value)


# ---------------------------------------------------------------- emulation


def test_local_maps_devices_to_logical_cpus():
    types = ["TITAN_V", "TITAN_RTX", "RTX_2060", "QUADRO_P4000"]
    c = Cluster.local(types, hosts=2, emulated_speed_factors=[1.0, 0.9, 0.5, 0.4])
    assert [h.name for h in c.hosts] == ["host0", "host1"]
    assert [(d.name, d.type_name, d.tf_device, d.emulated_speed_factor) for d in c.devices] == [
        ("host0/gpu0", "TITAN_V", "/device:CPU:0", 1.0),
        ("host0/gpu1", "TITAN_RTX", "/device:CPU:1", 0.9),
        ("host1/gpu0", "RTX_2060", "/device:CPU:2", 0.5),
        ("host1/gpu1", "QUADRO_P4000", "/device:CPU:3", 0.4),
    ]
    assert c.same_host("host0/gpu0", "host0/gpu1") and not c.same_host("host0/gpu1",
                                                                       "host1/gpu0")
    assert all(h.task is None for h in c.hosts)
    assert c.memory_of("host1/gpu0") == 6 * GIB  # planning keeps the emulated type's memory
    assert c.is_emulated
    text = c.describe()
    assert "emulated" in text
    assert "speed factor 0.5" in text and "speed factor 0.4" in text
    assert text.count("emulated, speed factor") == 4


def test_local_per_host_lists_and_factor_mapping():
    c = Cluster.local([["TITAN_V", "TITAN_V"], ["T4"]], emulated_speed_factors={"T4": 0.5})
    assert [len(h.devices) for h in c.hosts] == [2, 1]
    assert c.device("host1/gpu0").tf_device == "/device:CPU:2"
    assert [d.emulated_speed_factor for d in c.devices] == [1.0, 1.0, 0.5]


def test_local_cpu_at_real_speed_is_not_emulated():
    c = Cluster.local(["LOCAL_CPU", "LOCAL_CPU"])
    assert not c.is_emulated
    assert "emulated" not in c.describe()
    assert Cluster.local(["LOCAL_CPU"], emulated_speed_factors=[0.5]).is_emulated


def test_relative_speed_factors():
    f = relative_speed_factors(["TITAN_RTX", "QUADRO_P4000"])
    assert f["TITAN_RTX"] == 1.0
    assert f["QUADRO_P4000"] == pytest.approx((1792 * 1480) / (4608 * 1770))


@pytest.mark.parametrize("args, kwargs, match", [
    ((["TITAN_V"] * 3,), {"hosts": 2}, "Received: devices=3, hosts=2"),
    (([],), {}, "at least one compute device"),
    ((["TITAN_V", "NOPE"],), {}, "Received: name='NOPE'"),
    ((["TITAN_V"],), {"emulated_speed_factors": [0.0]}, "Received: emulated_speed_factor=0.0"),
    ((["TITAN_V"],), {"emulated_speed_factors": [-1.0]}, "Received: emulated_speed_factor=-1"),
    ((["TITAN_V"],), {"emulated_speed_factors": [1.0, 1.0]}, "one factor per device"),
    ((["TITAN_V"],), {"hosts": 0}, "Received: hosts=0"),
    ((["TITAN_V"],), {"inter_bandwidth": 0.0}, "Received: inter_bandwidth=0.0"),
    ((["TITAN_V"],), {"intra_bandwidth": -1.0}, "Received: intra_bandwidth=-1.0"),
    (("TITAN_V",), {}, "Received: device_types='TITAN_V'"),
])
def test_local_errors(args, kwargs, match):
    with pytest.raises(ValueError, match=match):
        Cluster.local(*args, **kwargs)


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


# -------------------------------------------------------- logical devices


_CONFIGURE_SCRIPT = """
import tensorflow as tf
from hetpipe_tf.cluster.spec import configure_logical_devices
assert configure_logical_devices(3) == ("/device:CPU:0", "/device:CPU:1", "/device:CPU:2")
assert configure_logical_devices(2) == ("/device:CPU:0", "/device:CPU:1", "/device:CPU:2")
assert len(tf.config.list_logical_devices("CPU")) == 3  # initialises TensorFlow
assert len(configure_logical_devices(3)) == 3
try:
    configure_logical_devices(4)
except RuntimeError as e:
    assert "call configure_logical_devices(4) first" in str(e), e
else:
    raise AssertionError("no error after initialisation")
print("OK")
"""


def test_configure_logical_devices_in_fresh_process():
    # A fresh process: whether TensorFlow is initialised is part of what is tested.
    env = {**os.environ, "PYTHONPATH": os.pathsep.join(
        [str(REPO_ROOT), os.environ.get("PYTHONPATH", "")]), "TF_CPP_MIN_LOG_LEVEL": "2"}
    proc = subprocess.run([sys.executable, "-c", _CONFIGURE_SCRIPT], env=env,
                          capture_output=True, text=True, timeout=120)
    assert proc.returncode == 0, proc.stderr[-2000:]
    assert proc.stdout.strip().endswith("OK")


def test_configure_logical_devices_rejects_bad_n():
    with pytest.raises(ValueError, match="Received: n=0"):
        configure_logical_devices(0)
