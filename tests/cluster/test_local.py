"""Tests of the local emulation (hetpipe_tf.cluster.local), used through `Cluster.local`."""

import os
import pathlib
import subprocess
import sys

import pytest

from hetpipe_tf.cluster.local import configure_logical_devices, relative_speed_factors
from hetpipe_tf.cluster.spec import Cluster, local_cluster

GIB = 2**30
REPO_ROOT = pathlib.Path(__file__).resolve().parents[2]


def test_cpu_is_this_machines_cpu_type():
    """TensorFlow's device type "CPU" is what a user of a local cluster writes: it is the
    catalog's LOCAL_CPU (speed factors by type name too)."""
    c = Cluster.local(["CPU", "cpu", "LOCAL_CPU"], emulated_speed_factors={"CPU": 0.5})
    assert [(d.type_name, d.tf_device, d.emulated_speed_factor) for d in c.devices] == [
        ("LOCAL_CPU", f"/device:CPU:{i}", 0.5) for i in range(3)]


def test_configure_logical_devices_is_public():
    import hetpipe_tf

    assert hetpipe_tf.configure_logical_devices is configure_logical_devices


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


class _MyCluster(Cluster):
    pass


def test_classmethod_delegates_to_local_cluster():
    types = [["TITAN_V", "TITAN_V"], ["T4"]]
    assert Cluster.local(types, emulated_speed_factors={"T4": 0.5}) == local_cluster(
        types, emulated_speed_factors={"T4": 0.5})
    assert type(_MyCluster.local(types)) is _MyCluster  # a subclass builds the subclass


# -------------------------------------------------------- logical devices


_CONFIGURE_SCRIPT = """
import tensorflow as tf
from hetpipe_tf.cluster.local import configure_logical_devices
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
