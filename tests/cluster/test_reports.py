"""hetpipe_tf.cluster.reports: the devices a server reports (TensorFlow's GetStatus RPC),
decoded and mapped to the catalog; the chief's cluster description built from them, and a
declaration that wins. Real `tf.distribute.Server` processes on 127.0.0.1, stopped by pid."""

import json
import logging
import os
import signal
import subprocess
import sys
import time

import pytest

from hetpipe_tf.cluster import reports, roles
from hetpipe_tf.cluster.catalog import GIB, get_device_type
from hetpipe_tf.cluster.lifetime import child_preexec
from hetpipe_tf.cluster.probe import Health, TaskUnreachableError, probe
from hetpipe_tf.cluster.serve import free_ports
from hetpipe_tf.cluster.spec import Cluster
from tests.benchmarks.binaries import ROOT

R = reports.ReportedDevice


def _varint(n: int) -> bytes:
    out = bytearray()
    while True:
        b, n = n & 0x7F, n >> 7
        out.append(b | (0x80 if n else 0))
        if not n:
            return bytes(out)


def test_decode_status_reads_tensorflow_device_attributes():
    from tensorflow.core.framework import device_attributes_pb2

    # The reference: GetStatusResponse's field 1 (length-delimited DeviceAttributes) written
    # by hand around TensorFlow's own message.
    raw = b""
    for name, kind, mem, desc in [("/job:worker/replica:0/task:0/device:CPU:0", "CPU", 1 << 28, ""),
                                  ("/job:worker/replica:0/task:0/device:GPU:0", "GPU", 5 << 30,
                                   "device: 0, name: NVIDIA TITAN V, pci bus id: 0000:01:00.0")]:
        body = device_attributes_pb2.DeviceAttributes(
            name=name, device_type=kind, memory_limit=mem, physical_device_desc=desc,
            incarnation=7).SerializeToString()
        raw += b"\x0a" + _varint(len(body)) + body
    got = reports.decode_status(raw)
    assert got == (R("/job:worker/replica:0/task:0/device:CPU:0", "CPU", 1 << 28),
                   R("/job:worker/replica:0/task:0/device:GPU:0", "GPU", 5 << 30,
                     "device: 0, name: NVIDIA TITAN V, pci bus id: 0000:01:00.0"))
    assert reports.decode_status(reports.encode_status(got)) == got
    assert reports.decode_status(b"") == ()


def _gpu(i, model, mem=10 * GIB):
    return R(f"/job:worker/replica:0/task:0/device:GPU:{i}", "GPU", mem,
             f"device: {i}, name: {model}, pci bus id: 0000:0{i}:00.0, compute capability: 7.0")


def _cpu(i):
    return R(f"/job:worker/replica:0/task:0/device:CPU:{i}", "CPU", 256 << 20)


def test_gpu_model_from_description():
    assert reports.gpu_model(_gpu(0, "NVIDIA GeForce RTX 2060").physical_device_desc) == \
        "NVIDIA GeForce RTX 2060"
    assert reports.gpu_model("") is None


def test_catalog_types_known_gpus_cpus_and_order():
    devices = (_cpu(0), _gpu(1, "Tesla V100-SXM2-16GB"), _gpu(0, "NVIDIA TITAN V"))
    # GPUs only (the CPU holds no stage where GPUs exist), in TensorFlow's device order.
    assert reports.catalog_types("worker:0", "a:1", devices) == ("TITAN_V", "V100_16GB")
    assert reports.catalog_types("worker:0", "a:1", (_cpu(1), _cpu(0))) == ("LOCAL_CPU",) * 2


def test_catalog_types_unknown_gpu_gets_a_generic_type_with_its_memory():
    (name,) = reports.catalog_types("worker:1", "a:1", (_gpu(0, "Acme Z9", 7 * GIB),))
    t = get_device_type(name)
    assert (name, t.memory_bytes, t.kind.value) == ("ACME_Z9", 7 * GIB, "GPU")
    assert "worker:1" in t.description
    # The same model again: the same type; with other memory: a type of its own.
    assert reports.catalog_types("worker:2", "a:2", (_gpu(0, "Acme Z9", 7 * GIB),)) == (name,)
    (other,) = reports.catalog_types("worker:2", "a:2", (_gpu(0, "Acme Z9", 3 * GIB),))
    assert other == f"ACME_Z9_{3 * 1024}MIB" and get_device_type(other).memory_bytes == 3 * GIB


def test_catalog_types_no_usable_device_is_named():
    with pytest.raises(ValueError, match=r"Task worker:3 at h:9 reported no CPU or GPU "
                                         r"device\. Received: devices=\[\('/x:TPU:0', 'TPU'\)\]"):
        reports.catalog_types("worker:3", "h:9", (R("/x:TPU:0", "TPU", 1),))


@pytest.fixture
def no_reports():
    reports.forget()
    yield
    reports.forget()


def test_default_declarations_use_reports_of_every_worker(no_reports):
    from hetpipe_tf.cluster.tf_cluster import default_declarations

    spec = {"chief": ["h:1"], "worker": ["h:2", "h:3"]}
    assert default_declarations(spec) == {("worker", 0): ["LOCAL_CPU"],
                                          ("worker", 1): ["LOCAL_CPU"]}
    reports._reported[("worker", 0, "h:2")] = ("TITAN_V", "TITAN_V")
    assert default_declarations(spec) == {("worker", 0): ["LOCAL_CPU"],   # worker:1 unknown
                                          ("worker", 1): ["LOCAL_CPU"]}
    reports._reported[("worker", 1, "h:3")] = ("T4",)
    assert default_declarations(spec) == {"worker:0": ["TITAN_V", "TITAN_V"],
                                          "worker:1": ["T4"]}
    # Another cluster at other addresses has not reported.
    assert default_declarations({"worker": ["h:4", "h:3"]}) == {
        ("worker", 0): ["LOCAL_CPU"], ("worker", 1): ["LOCAL_CPU"]}


# --- real servers ------------------------------------------------------------------------

_SERVER = """
import sys, tensorflow as tf
cluster, job, index, cpus = sys.argv[1], sys.argv[2], int(sys.argv[3]), int(sys.argv[4])
config = tf.compat.v1.ConfigProto()
config.device_count["CPU"] = cpus
tf.distribute.Server(tf.train.ClusterSpec(eval(cluster)), job_name=job, task_index=index,
                     config=config, start=True).join()
"""


@pytest.fixture(scope="module")
def servers():
    """worker:0 with 2 logical CPU devices, worker:1 with 1; the chief is this test."""
    ports = free_ports(3)
    cluster = {"chief": [f"127.0.0.1:{ports[0]}"],
               "worker": [f"127.0.0.1:{ports[1]}", f"127.0.0.1:{ports[2]}"]}
    env = {**os.environ, "TF_CPP_MIN_LOG_LEVEL": "3"}
    procs = []
    try:
        for i, cpus in enumerate((2, 1)):
            procs.append(subprocess.Popen(
                [sys.executable, "-c", _SERVER, repr(cluster), "worker", str(i), str(cpus)],
                cwd=ROOT, env=env, stdin=subprocess.DEVNULL, stdout=subprocess.DEVNULL,
                stderr=subprocess.DEVNULL, preexec_fn=child_preexec(os.getpid())))
        deadline = time.monotonic() + 120
        for a in cluster["worker"]:
            while probe(a, 1.0) is not Health.OK:
                assert all(p.poll() is None for p in procs) and time.monotonic() < deadline
                time.sleep(0.2)
        yield cluster
    finally:
        for p in procs:
            os.kill(p.pid, signal.SIGKILL)
        for p in procs:
            p.wait(timeout=30)


def _env(cluster, devices=None):
    config = {"cluster": cluster, "task": {"type": "chief", "index": 0}}
    if devices is not None:
        config["hetpipe"] = {"devices": devices}
    return {"TF_CONFIG": json.dumps(config)}


def test_a_server_with_two_logical_cpus_reports_two_devices(servers):
    got = reports.request_devices(servers["worker"][0], 10.0)
    assert [(d.name, d.device_type) for d in got] == [
        ("/job:worker/replica:0/task:0/device:CPU:0", "CPU"),
        ("/job:worker/replica:0/task:0/device:CPU:1", "CPU")]
    assert [d.name for d in reports.request_devices(servers["worker"][1], 10.0)] == [
        "/job:worker/replica:0/task:1/device:CPU:0"]


def test_chief_builds_the_cluster_from_reports(servers, no_reports, monkeypatch, caplog):
    task = roles.find_task(None, _env(servers))
    # Everything connect_chief does but connecting this test process to the cluster.
    monkeypatch.setattr(roles, "connected_to_cluster", lambda: True)
    roles.connect_chief(task, 30.0)
    with caplog.at_level(logging.INFO, logger="hetpipe_tf.cluster.tf_cluster"):
        c = Cluster.from_tf_config(_env(servers))
    assert [(d.name, d.type_name, d.tf_device) for d in c.devices] == [
        ("worker0/cpu0", "LOCAL_CPU", "/job:worker/replica:0/task:0/device:CPU:0"),
        ("worker0/cpu1", "LOCAL_CPU", "/job:worker/replica:0/task:0/device:CPU:1"),
        ("worker1/cpu0", "LOCAL_CPU", "/job:worker/replica:0/task:1/device:CPU:0")]
    assert "as the hosts reported them" in caplog.text


def test_a_declaration_wins_over_reports(servers, no_reports, monkeypatch, caplog):
    declared = {"worker:0": ["T4"], "worker:1": ["A10", "A10"]}
    task = roles.find_task(None, _env(servers, declared))
    monkeypatch.setattr(roles, "connected_to_cluster", lambda: True)
    roles.connect_chief(task, 30.0)
    assert reports.known_declarations({"worker": dict(enumerate(servers["worker"]))}) is None
    # Reports kept from before do not override a declaration either.
    reports.collect(servers, 10.0)
    with caplog.at_level(logging.INFO, logger="hetpipe_tf.cluster.tf_cluster"):
        c = Cluster.from_tf_config(_env(servers, declared))
    assert [(d.name, d.type_name) for d in c.devices] == [
        ("worker0/gpu0", "T4"), ("worker1/gpu0", "A10"), ("worker1/gpu1", "A10")]
    assert "as TF_CONFIG declares them" in caplog.text


def test_collect_names_a_task_nobody_serves(no_reports):
    (port,) = free_ports(1)
    with pytest.raises(TaskUnreachableError, match=f"Task worker:0 at 127.0.0.1:{port}"):
        reports.collect({"worker": [f"127.0.0.1:{port}"]}, 2.0)
