"""Lost tasks (hetpipe_tf/ps/faults.py, hetpipe_tf/cluster/probe.py): probes, the monitor,
the named error, and real `tf.distribute.Server` processes (2 workers + 1 ps on
127.0.0.1) killed (SIGKILL) or frozen (SIGSTOP) in the middle of a fit, stopped by pid
also on failure."""

import json
import time

import pytest

from hetpipe_tf.cluster.probe import Health, TaskUnreachableError, probe, wait_until_reachable
from hetpipe_tf.cluster.serve import free_ports, start_local_servers
from hetpipe_tf.ps.faults import (
    FaultOptions,
    FaultPolicy,
    TaskLostError,
    TaskMonitor,
    TaskUse,
    task_uses,
)
from tests.ps.fault_chiefs import BATCH
from tests.ps.fault_chiefs import run_chief as _chief
from tests.ps.fault_chiefs import silent_listener as _silent_listener


def test_options_and_policy_are_checked():
    assert FaultOptions.parse(5, "stop") == FaultOptions(5.0, FaultPolicy.STOP)
    assert FaultOptions.parse(5, "continue") == FaultOptions(5.0, FaultPolicy.CONTINUE)
    assert FaultPolicy.parse(FaultPolicy.STOP) is FaultPolicy.STOP
    with pytest.raises(ValueError, match="Received: on_fault='ignore'"):
        FaultPolicy.parse("ignore")
    for bad in (0, -1.0, float("inf"), True, "30"):
        with pytest.raises(ValueError, match="fault_timeout_s"):
            FaultOptions.parse(bad, "stop")


def test_task_uses_and_the_error_name_task_address_stages_and_vws():
    class P:
        def __init__(self, *devices):
            self.stages = [type("S", (), {"tf_device": d})() for d in devices]
    w = "/job:worker/replica:0/task:{}/device:CPU:{}"
    uses = task_uses([P(w.format(0, 0), w.format(1, 0)), P(w.format(1, 1))],
                     ["/job:ps/replica:0/task:0/device:CPU:0", "/device:CPU:0"])
    assert uses == {
        "worker:0": TaskUse(((0, 0, w.format(0, 0)),)),
        "worker:1": TaskUse(((0, 1, w.format(1, 0)), (1, 0, w.format(1, 1)))),
        "ps:0": TaskUse((), parameter_server=True)}
    e = TaskLostError("worker:1", "127.0.0.1:5", Health.SILENT, 3.2, uses["worker:1"], 2)
    assert e.virtual_workers == (0, 1) and e.task == "worker:1"
    text = str(e)
    assert "worker:1 at 127.0.0.1:5" in text and "3.2 s" in text
    assert f"stage 1 of VW 0 on {w.format(1, 0)}" in text and "VWs [0, 1]" in text
    ps = TaskLostError("ps:0", "h:1", Health.REFUSED, 0.0, uses["ps:0"], 3)
    assert ps.virtual_workers == (0, 1, 2) and "process is gone" in str(ps)


def test_probe_tells_refused_from_silent():
    port = free_ports(1)[0]
    assert probe(f"127.0.0.1:{port}", 1.0) is Health.REFUSED
    s, address = _silent_listener()
    try:
        t0 = time.monotonic()
        assert probe(address, 0.5) is Health.SILENT
        assert time.monotonic() - t0 < 5
    finally:
        s.close()


def test_unreachable_address_is_named_within_the_bound():
    address = f"127.0.0.1:{free_ports(1)[0]}"
    t0 = time.monotonic()
    with pytest.raises(TaskUnreachableError, match=f"worker:1 at {address}.*nothing listens"):
        wait_until_reachable({"worker:1": address}, timeout_s=1.0)
    assert time.monotonic() - t0 < 10
    s, silent = _silent_listener()
    try:
        with pytest.raises(TaskUnreachableError, match="does not answer TensorFlow's RPCs"):
            wait_until_reachable({"ps:0": silent}, timeout_s=1.0)
    finally:
        s.close()


def test_monitor_finds_a_dead_and_a_silent_task():
    dead = f"127.0.0.1:{free_ports(1)[0]}"
    s, silent = _silent_listener()
    found = {}
    try:
        t0 = time.monotonic()
        with TaskMonitor({"worker:0": dead, "ps:0": silent}, timeout_s=1.5,
                         on_lost=lambda t, h, sec: found.setdefault(
                             t, (h, time.monotonic() - t0))):
            deadline = time.monotonic() + 20
            while len(found) < 2 and time.monotonic() < deadline:
                time.sleep(0.05)
    finally:
        s.close()
    assert found["worker:0"][0] is Health.REFUSED and found["ps:0"][0] is Health.SILENT
    assert found["ps:0"][1] >= 1.0   # not before it was silent for about the timeout


def test_unreachable_task_fails_the_strategy_before_training(monkeypatch):
    import hetpipe_tf as hp

    ports = free_ports(3)
    cluster = {"chief": [f"127.0.0.1:{ports[0]}"], "worker": [f"127.0.0.1:{ports[1]}"],
               "ps": [f"127.0.0.1:{ports[2]}"]}
    monkeypatch.setenv("TF_CONFIG", json.dumps(
        {"cluster": cluster, "task": {"type": "chief", "index": 0}}))
    with pytest.raises(TaskUnreachableError, match=f"127.0.0.1:{ports[1]}"):
        hp.HetPipeStrategy(allocation="NP", fault_timeout_s=1.0)


# About 20 s each: the victim is a server process of its own, the tasks it leaves running
# share one process (a TensorFlow start-up less), and the chief is a third.
@pytest.mark.parametrize("victim, sig", [
    ("worker:1", "SIGKILL"),
    pytest.param("worker:1", "SIGSTOP", marks=pytest.mark.slow),
    pytest.param("ps:0", "SIGKILL", marks=pytest.mark.slow),
    pytest.param("ps:0", "SIGSTOP", marks=pytest.mark.slow),
])
def test_lost_task_stops_fit_with_the_named_error(victim, sig):
    with start_local_servers({"worker": 2, "ps": 1}, own_process=[victim]) as servers:
        out = _chief(servers.cluster, servers.pid_of(victim), sig)
    job, index = victim.split(":")
    assert out["raised"] == "TaskLostError", out
    assert out["task"] == victim and out["address"] == servers.cluster[job][int(index)]
    assert out["virtual_workers"] == ([1] if job == "worker" else [0, 1])
    assert ("process is gone" if sig == "SIGKILL" else "has not answered") in out["message"]
    # Bound: fault_timeout_s (3 s); generous slack for a loaded 2-core machine.
    assert out["after_s"] < 3.0 + 10.0, out
    assert out["close_s"] < 10.0, out


def test_guard_ends_a_call_stuck_on_a_frozen_task_and_abandons_the_abort():
    """Whatever the chief waits in (here a call that never returns, as a push to a frozen
    task does), the guard raises the TaskLostError once the task is lost; an abort after
    it does not wait for remote work (the abandon path) and raises nothing."""
    import threading

    from hetpipe_tf.ps.faults import FaultGuard

    s, silent = _silent_listener()
    never = threading.Event()
    abandoned = []
    guard = FaultGuard(FaultOptions(1.5), {"worker:1": TaskUse(((1, 0, "/job:worker/task:1"),))},
                       {"worker:1": silent}, num_virtual_workers=2)
    try:
        t0 = time.monotonic()
        with pytest.raises(TaskLostError, match="worker:1") as e:
            guard.call(never.wait)
        assert time.monotonic() - t0 < 1.5 + 10
        assert e.value.virtual_workers == (1,) and guard.fatal is e.value
        with pytest.raises(TaskLostError):   # every later call fails at once
            guard.call(lambda: None)
        guard.call_or_abandon(never.wait, lambda: abandoned.append(True))
        assert abandoned == [True]
    finally:
        never.set()
        guard.close()
        s.close()


# The end of fit (strategy/guards.py, FaultGuard.check_alive): a worker frozen or killed in
# the last epoch's on_epoch_end (after its drain: nothing of the fit needs the worker any
# more) or at its last batch (the final drain waits for it) is reported by that fit.
# Epochs of 8 batches: the fit's length plays no part in what is checked.
@pytest.mark.parametrize("sig, at_epoch_end", [
    ("SIGSTOP", True),
    pytest.param("SIGKILL", True, marks=pytest.mark.slow),
    pytest.param("SIGSTOP", False, marks=pytest.mark.slow),
])
def test_task_lost_at_the_last_epochs_end_raises_from_fit_within_the_bound(sig, at_epoch_end):
    timeout_s, samples = 5.0, 64
    last_batch = samples // BATCH - 1
    with start_local_servers({"worker": 2, "ps": 1}, own_process=["worker:1"]) as servers:
        out = _chief(servers.cluster, servers.pid_of("worker:1"), sig, timeout_s=timeout_s,
                     epochs=2,
                     at_batch=-1 if at_epoch_end else last_batch,
                     at_epoch_end=at_epoch_end, samples=samples)
    assert out["raised"] == "TaskLostError" and out["fit_raised"], out
    assert out["task"] == "worker:1" and out["virtual_workers"] == [1], out
    # Slack for a loaded 2-core machine (19 s seen beside a full -n 2 suite run).
    assert out["fit_end_s"] < timeout_s + 25.0, out
    assert out["close_s"] < 10.0, out
