"""Tests of the TensorFlow cluster constructors (hetpipe_tf.cluster.tf_cluster), used
through `Cluster.from_tf_cluster_spec` and `Cluster.from_tf_config`."""

import json

import pytest

from hetpipe_tf.cluster.catalog import DeviceKind, DeviceType, get_device_type
from hetpipe_tf.cluster.spec import (
    INFINIBAND_56G_BANDWIDTH,
    PCIE3_X16_BANDWIDTH,
    Cluster,
)
from hetpipe_tf.cluster.spec import cluster_from_tf_cluster_spec, cluster_from_tf_config

GIB = 2**30
TF_SPEC = {
    "chief": ["127.0.0.1:2000"],
    "worker": ["127.0.0.1:2001", "127.0.0.1:2002"],
    "ps": ["127.0.0.1:2003"],
}


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
    ({"TF_CONFIG": "{not json"}, r"TF_CONFIG is not valid JSON: .* at line 1 column 2"),
    ({"TF_CONFIG": json.dumps({"task": {}})}, "no 'cluster' entry"),
    ({"TF_CONFIG": json.dumps({"cluster": TF_SPEC, "hetpipe": {"devcies": {}}})},
     "unknown entries"),
])
def test_from_tf_config_errors(env, match):
    with pytest.raises(ValueError, match=match) as e:
        Cluster.from_tf_config(env)
    assert "Received:" in str(e.value)


class _MyCluster(Cluster):
    pass


def test_classmethods_delegate_to_module_functions():
    decl = {"worker:0": ["TITAN_V"], "chief:0": ["T4"]}
    assert Cluster.from_tf_cluster_spec(TF_SPEC, decl) == cluster_from_tf_cluster_spec(
        TF_SPEC, decl)
    env = {"TF_CONFIG": json.dumps({"cluster": TF_SPEC})}
    assert Cluster.from_tf_config(env) == cluster_from_tf_config(env)
    # A subclass's classmethods build the subclass, as before the split.
    assert type(_MyCluster.from_tf_cluster_spec(TF_SPEC, decl)) is _MyCluster
    assert type(_MyCluster.from_tf_config(env)) is _MyCluster
