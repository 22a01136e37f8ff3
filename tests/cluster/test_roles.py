"""Cluster roles (hetpipe_tf/cluster/roles.py): the role from TF_CONFIG or a
ClusterResolver, and a worker process that serves from `HetPipeStrategy(...)` and never
returns (a real process on 127.0.0.1, killed by pid)."""

import json
import os
import signal
import subprocess
import sys
import time

import pytest

from hetpipe_tf.cluster import roles
from hetpipe_tf.cluster.lifetime import alive
from hetpipe_tf.cluster.probe import Health, probe
from hetpipe_tf.cluster.serve import free_ports
from hetpipe_tf.cluster.spec import Cluster
from tests.benchmarks.binaries import ROOT

CLUSTER = {"chief": ["127.0.0.1:2000"], "worker": ["127.0.0.1:2001", "127.0.0.1:2002"],
           "ps": ["127.0.0.1:2003"]}


def _env(job, index, devices=None):
    config = {"cluster": CLUSTER, "task": {"type": job, "index": index}}
    if devices is not None:
        config["hetpipe"] = {"devices": devices}
    return {"TF_CONFIG": json.dumps(config)}


def test_role_from_tf_config():
    t = roles.find_task(None, _env("worker", 1, {"worker:1": ["LOCAL_CPU"] * 3}))
    assert (t.role, t.name, t.declared_devices) == (roles.Role.WORKER, "worker:1",
                                                     ("LOCAL_CPU",) * 3)
    assert t.others() == {"chief:0": "127.0.0.1:2000", "worker:0": "127.0.0.1:2001",
                          "ps:0": "127.0.0.1:2003"}
    assert roles.find_task(None, _env("ps", 0)).role is roles.Role.PS
    assert roles.find_task(None, _env("chief", 0)).role is roles.Role.CHIEF
    assert roles.find_task(None, {}) is None
    # A local emulated cluster names no task: TF_CONFIG does not make it a cluster job.
    assert roles.find_task(Cluster.local(["LOCAL_CPU"]), _env("worker", 0)) is None
    with pytest.raises(ValueError, match="task index=5"):
        roles.find_task(None, _env("worker", 5))


@pytest.mark.parametrize("raw, match", [
    ('{"cluster": {"worker": ["127.0.0.1:1"]}, "task": {"type": "worker" "index": 0}}',
     r"TF_CONFIG is not valid JSON: Expecting ',' delimiter at line 1 column 68 \(char 67\)"),
    (json.dumps({"cluster": CLUSTER, "task": {"type": "worker", "index": "1"}}),
     "task index must be an integer >= 0. Received: task index='1'"),
    (json.dumps({"cluster": CLUSTER, "task": "worker:1"}),
     "TF_CONFIG's 'task' entry must be a JSON object"),
])
def test_bad_tf_config_is_named_before_any_role(raw, match):
    """What every process of a job reads first (HetPipeStrategy's role dispatch)."""
    with pytest.raises(ValueError, match=match) as e:
        roles.find_task(None, {"TF_CONFIG": raw})
    assert type(e.value) is ValueError and "out of range" not in str(e.value)


def test_role_from_a_cluster_resolver():
    import tensorflow as tf

    resolver = tf.distribute.cluster_resolver.SimpleClusterResolver(
        tf.train.ClusterSpec(CLUSTER), task_type="ps", task_id=0)
    t = roles.find_task(resolver, {})
    assert (t.role, t.name, t.cluster) == (roles.Role.PS, "ps:0", CLUSTER)
    no_task = tf.distribute.cluster_resolver.SimpleClusterResolver(tf.train.ClusterSpec(CLUSTER))
    assert roles.find_task(no_task, {}) is None


def test_worker_serves_from_the_strategy_and_never_returns():
    ports = free_ports(2)
    cluster = {"chief": [f"127.0.0.1:{ports[0]}"], "worker": [f"127.0.0.1:{ports[1]}"]}
    env = {**os.environ, "TF_CPP_MIN_LOG_LEVEL": "3", "TF_CONFIG": json.dumps(
        {"cluster": cluster, "task": {"type": "worker", "index": 0},
         "hetpipe": {"devices": {"worker:0": ["LOCAL_CPU", "LOCAL_CPU"]}}})}
    code = ("import hetpipe_tf as hp; hp.HetPipeStrategy(); print('RETURNED', flush=True)")
    proc = subprocess.Popen([sys.executable, "-c", code], cwd=ROOT, env=env,
                            stdin=subprocess.DEVNULL, stdout=subprocess.PIPE,
                            stderr=subprocess.DEVNULL, text=True)
    try:
        deadline = time.monotonic() + 120
        while probe(cluster["worker"][0], 1.0) is not Health.OK:
            assert proc.poll() is None and time.monotonic() < deadline
            time.sleep(0.2)
        time.sleep(0.5)
        assert alive(proc.pid)
    finally:
        os.kill(proc.pid, signal.SIGKILL)
        out, _ = proc.communicate(timeout=30)
    assert "RETURNED" not in out
