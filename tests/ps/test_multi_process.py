"""Two virtual workers on two `tf.distribute.Server` worker processes, w_global on a ps
server process, all on 127.0.0.1, driven by a chief process over TensorFlow's gRPC runtime.
The result equals synchronous data-parallel SGD computed here (N_m = 1, D = 0, one stage).
"""

import json
import subprocess
import sys

import numpy as np

from hetpipe_tf.cluster.serve import start_local_servers
from tests.benchmarks.binaries import ROOT
from tests.strategy.helpers import assert_weights_close, regression_data, skip_model

import keras  # noqa: E402  (after the helpers: same import order as the other tests)
import tensorflow as tf  # noqa: E402


def _sync_sgd(w0, assignment, batches, lr=0.05):
    probe = skip_model(0)
    w = [np.array(a, dtype="float32") for a in w0]
    for c in range(len(assignment[0])):
        total = [np.zeros_like(a) for a in w]
        for steps in assignment:
            probe.set_weights(w)
            x, y = batches[steps[c]]
            with tf.GradientTape() as tape:
                loss = keras.losses.MeanSquaredError()(y, probe(x, training=True))
            grads = tape.gradient(loss, probe.trainable_variables)
            total = [t - lr * g.numpy() for t, g in zip(total, grads)]
        w = [a + t for a, t in zip(w, total)]
    return w


def test_virtual_workers_on_server_processes_equal_synchronous_sgd():
    with start_local_servers({"worker": 2, "ps": 1},
                             own_process=()) as servers:  # no victim: one serving process
        proc = subprocess.run([sys.executable, "-m", "tests.ps.chief_wsp",
                               json.dumps(servers.cluster)],
                              cwd=ROOT, capture_output=True, text=True, timeout=240)
    assert proc.returncode == 0, proc.stderr[-3000:]
    out = json.loads(proc.stdout.strip().splitlines()[-1])
    assert out["ps_devices"] == ["/job:ps/replica:0/task:0/device:CPU:0"]
    assert out["local_devices"] == [["/job:worker/replica:0/task:0/device:CPU:0"],
                                    ["/job:worker/replica:0/task:1/device:CPU:0"]]
    assignment = out["assignment"]
    assert [len(a) for a in assignment] == [4, 4] and out["pushes"] == 8
    x, y = regression_data(64, 0)
    batches = [(x[i:i + 8], y[i:i + 8]) for i in range(0, 64, 8)]
    ref = _sync_sgd(out["w0"], assignment, batches)
    assert_weights_close([np.array(a, dtype="float32") for a in out["final"]], ref)
