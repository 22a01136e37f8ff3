"""hetpipe_tf.cluster.serve: server processes on 127.0.0.1, stopped by the test."""

import json
import os
import subprocess
import sys

import pytest

from hetpipe_tf.cluster import serve
from tests.benchmarks.binaries import ROOT


def test_free_ports_are_distinct():
    ports = serve.free_ports(5)
    assert len(set(ports)) == 5 and all(1024 <= p < 65536 for p in ports)


def test_start_local_servers_stops_every_process_also_on_error():
    seen = []
    with pytest.raises(RuntimeError, match="boom"):
        with serve.start_local_servers({"worker": 1, "ps": 1}) as servers:
            assert sorted(servers.cluster) == ["chief", "ps", "worker"]
            assert all(a.startswith("127.0.0.1:") for t in servers.cluster.values() for a in t)
            seen.extend(servers.pids)
            for pid in seen:
                os.kill(pid, 0)  # running
            raise RuntimeError("boom")
    assert len(seen) == 2
    for pid in seen:   # each server process is gone (reaped), not left running
        with pytest.raises(ProcessLookupError):
            os.kill(pid, 0)


@pytest.mark.parametrize("config,message", [
    (None, "needs TF_CONFIG"),
    ({"cluster": {"chief": ["127.0.0.1:1"]}, "task": {"type": "chief", "index": 0}},
     "chief drives training"),
])
def test_serve_refuses_what_it_cannot_serve(config, message):
    env = {k: v for k, v in os.environ.items() if k != "TF_CONFIG"}
    if config is not None:
        env["TF_CONFIG"] = json.dumps(config)
    proc = subprocess.run([sys.executable, "-m", "hetpipe_tf.cluster.serve"], cwd=ROOT, env=env,
                          capture_output=True, text=True, timeout=120)
    assert proc.returncode != 0 and message in proc.stderr


def test_tasks_not_named_own_process_share_one_serving_process():
    """own_process=() serves every task in one process (one TensorFlow start-up); each
    task answers TensorFlow's RPCs at its own address."""
    from hetpipe_tf.cluster.probe import wait_until_reachable

    with serve.start_local_servers({"worker": 2, "ps": 1}, own_process=()) as servers:
        assert servers.tasks == ("worker:0", "worker:1", "ps:0")
        assert len(set(servers.pids)) == 1 and servers.pid_of("ps:0") == servers.pids[0]
        wait_until_reachable({t: servers.cluster[t.split(":")[0]][int(t.split(":")[1])]
                              for t in servers.tasks}, timeout_s=120)
        pid = servers.pids[0]
        # A server process keeps scikit-learn out (Keras imports it at `import tensorflow`
        # when installed; a server needs neither): its shared objects are not mapped.
        with open(f"/proc/{pid}/maps") as f:
            maps = f.read()
        assert "_pywrap_tensorflow" in maps and "sklearn" not in maps
    with pytest.raises(ProcessLookupError):   # stopped and reaped
        os.kill(pid, 0)
    with pytest.raises(ValueError, match=r"Received: own_process=\['worker:5'\]"):
        with serve.start_local_servers({"worker": 1}, own_process=["worker:5"]):
            pass


def test_serve_refuses_a_task_argument_outside_the_cluster():
    env = {**os.environ, "TF_CONFIG": json.dumps(
        {"cluster": {"worker": ["127.0.0.1:1"]}, "task": {"type": "worker", "index": 0}})}
    proc = subprocess.run([sys.executable, "-m", "hetpipe_tf.cluster.serve", "worker:3"],
                          cwd=ROOT, env=env, capture_output=True, text=True, timeout=120)
    assert proc.returncode != 0 and "Received: 'worker:3'" in proc.stderr
