"""One virtual worker on remote tasks is guarded (hetpipe_tf/strategy/remote_guard.py): a
worker killed or frozen mid-fit ends `fit` with the named TaskLostError within
fault_timeout_s. Real `tf.distribute.Server` processes on 127.0.0.1 (2 workers; the chief
is a subprocess), stopped by pid also on failure."""

import json
import pathlib
import subprocess
import sys
import types

import pytest

from hetpipe_tf.cluster.serve import free_ports, start_local_servers
from hetpipe_tf.cluster.spec import Cluster
from hetpipe_tf.ps.faults import FaultOptions
from hetpipe_tf.strategy.remote_guard import guard_for

TIMEOUT_S = 3.0
ROOT = pathlib.Path(__file__).resolve().parents[2]   # the chief runs as tests.strategy...


def _plan(*devices):
    return types.SimpleNamespace(stages=[types.SimpleNamespace(tf_device=d) for d in devices])


def _guard(plans, cluster, faults=FaultOptions(TIMEOUT_S)):
    return guard_for(faults, tuple(plans), cluster)


def test_guard_only_for_one_vw_on_remote_tasks():
    ports = free_ports(2)
    spec = {"chief": [f"127.0.0.1:{ports[0]}"], "worker": [f"127.0.0.1:{ports[1]}"]}
    cluster = Cluster.from_tf_cluster_spec(spec, {"worker:0": ["LOCAL_CPU"]})
    remote = _plan("/job:worker/replica:0/task:0/device:CPU:0")
    guard = _guard([remote], cluster)
    try:
        assert guard.addresses == {"worker:0": spec["worker"][0]}
        assert guard.uses["worker:0"].stages == ((0, 0, remote.stages[0].tf_device),)
    finally:
        guard.close()
    assert _guard([remote], None) is None                  # a local job
    assert _guard([_plan("/device:CPU:0")], Cluster.local(["LOCAL_CPU"])) is None
    assert _guard([remote, remote], cluster) is None       # the coordinator's
    assert _guard([remote], cluster, faults=None) is None


def _train(x, y, guarded: bool, monkeypatch):
    import keras

    from hetpipe_tf.ps.faults import FaultGuard
    from hetpipe_tf.strategy import HetPipeStrategy, even_plan, modes
    from tests.strategy.helpers import DEVICES, skip_model

    guards = []
    if guarded:   # a guard watching no task: the runtime's calls go through it all the same
        monkeypatch.setattr(modes, "guard_for", lambda *args: guards.append(
            FaultGuard(FaultOptions(TIMEOUT_S), {}, {}, 1)) or guards[-1])
    strategy = HetPipeStrategy(plan=even_plan(skip_model(0), DEVICES[:2], n_m=2))
    with strategy.scope():
        model = skip_model(0)
        model.compile(keras.optimizers.SGD(0.01), "mse")
    history = model.fit(x, y, batch_size=8, epochs=2, verbose=0, shuffle=False)
    kind = type(strategy.executor(model)).__name__
    strategy.close()
    assert all(g.monitor._stop.is_set() for g in guards)   # close() stopped its monitor
    monkeypatch.undo()
    return kind, history.history["loss"], model.get_weights()


def test_guarded_runtime_trains_as_the_runtime_it_guards(monkeypatch):
    import numpy as np

    from tests.strategy.helpers import assert_weights_close, regression_data

    x, y = regression_data(64, 3)
    kind, loss, weights = _train(x, y, True, monkeypatch)
    ref_kind, ref_loss, ref_weights = _train(x, y, False, monkeypatch)
    assert (kind, ref_kind) == ("GuardedPipelineRuntime", "PipelineRuntime")
    np.testing.assert_allclose(loss, ref_loss, rtol=1e-6)
    assert_weights_close(weights, ref_weights, atol=1e-6)


def _chief(cluster, victim_pid, sig):
    args = {"cluster": cluster, "victim_pid": victim_pid, "signal": sig,
            "timeout_s": TIMEOUT_S, "at_batch": 8}
    proc = subprocess.run([sys.executable, "-m", "tests.strategy.remote_guard_chief",
                           json.dumps(args)], cwd=ROOT, capture_output=True, text=True,
                          timeout=300)
    assert proc.returncode == 0, proc.stderr[-4000:]
    return json.loads(proc.stdout.strip().splitlines()[-1])


# About 25 s each (3 TensorFlow processes on 2 cores): SIGKILL runs by default.
@pytest.mark.parametrize("sig", ["SIGKILL", pytest.param("SIGSTOP", marks=pytest.mark.slow)])
def test_one_vw_on_two_workers_lost_worker_named_within_the_bound(sig):
    with start_local_servers({"worker": 2}) as servers:
        out = _chief(servers.cluster, servers.pids[1], sig)
    # One VW of 2 stages, one on each worker task, run by the guarded runtime.
    assert out["executor"] == "GuardedPipelineRuntime", out
    assert sorted(out["devices"]) == [f"/job:worker/replica:0/task:{i}/device:CPU:0"
                                      for i in (0, 1)], out
    assert out["raised"] == "TaskLostError", out
    assert out["task"] == "worker:1" and out["address"] == servers.cluster["worker"][1]
    stage = out["devices"].index("/job:worker/replica:0/task:1/device:CPU:0")
    assert out["stages"] == [[0, stage, "/job:worker/replica:0/task:1/device:CPU:0"]]
    assert out["virtual_workers"] == [0]
    assert ("process is gone" if sig == "SIGKILL" else "has not answered") in out["message"]
    print(f"one VW, {sig} of worker:1: TaskLostError {out['after_s']:.2f} s after the signal "
          f"(fault_timeout_s={TIMEOUT_S}), close() {out['close_s']:.2f} s")   # shown with -s
    # Bound: fault_timeout_s; generous slack for a loaded 2-core machine.
    assert out["after_s"] < TIMEOUT_S + 10.0, out
    assert out["close_s"] < 10.0, out
