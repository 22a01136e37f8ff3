"""The model's metrics when several virtual workers update them from remote tasks: a
cluster job (2 worker + 1 ps `tf.distribute.Server` processes on 127.0.0.1, a chief
process, 2 one-stage VWs, Adam) reports the training accuracy of the same run in one
process. Each VW updates its own copy of the metric state inside its stage's call
(hetpipe_tf/strategy/vw_metrics.py) and Keras reads the VWs' states summed; a model with a
non-additive metric keeps the shared path (hetpipe_tf/ps/shared_calls.py `shapes_first`:
each VW's update runs whole under the shared metrics lock, tests/ps/test_shared_calls.py)."""

import json
import subprocess
import sys

from hetpipe_tf.cluster.serve import start_local_servers
from tests.benchmarks.binaries import ROOT

EPOCHS = 5
SAMPLES = 128


def _chief(cluster) -> dict:
    args = {"cluster": cluster, "epochs": EPOCHS, "samples": SAMPLES}
    proc = subprocess.run([sys.executable, "-m", "tests.ps.chief_metrics", json.dumps(args)],
                          cwd=ROOT, capture_output=True, text=True, timeout=300)
    assert proc.returncode == 0, proc.stderr[-3000:]
    return json.loads(proc.stdout.strip().splitlines()[-1])


def test_two_vws_on_server_processes_report_the_one_process_training_accuracy():
    local = _chief(None)
    with start_local_servers({"worker": 2, "ps": 1},
                             own_process=()) as servers:  # no victim: one serving process
        remote = _chief(servers.cluster)
    assert local["per_vw"] and remote["per_vw"], (local, remote)
    # The task is converged after the first epoch: every later epoch is exactly 1.0.
    assert local["accuracy"][1:] == [1.0] * (EPOCHS - 1), local
    assert all(a <= 1.0 for a in remote["accuracy"]), remote
    assert remote["accuracy"][1:] == local["accuracy"][1:], remote
    assert remote["loss"][-1] < 0.1, remote
    # Every minibatch of the last epoch counted once by each metric (loss and accuracy).
    assert local["counts"] == remote["counts"] == {"loss/count": SAMPLES,
                                                   "accuracy/count": SAMPLES}, remote
