"""The chief of tests/ps/test_multi_process.py (run as a subprocess: connecting to a
cluster changes the process's TensorFlow context for good).

argv[1]: the cluster dict as JSON (a "chief" task, 2 "worker" tasks, 1 "ps" task, all
served by the test). Trains 2 one-stage virtual workers, N_m = 1, D = 0, one on each worker
task, w_global on the ps task; prints one JSON line with the weights before and after, the
assignment and where the variables lived.
"""

import json
import os
import sys

os.environ.setdefault("TF_CPP_MIN_LOG_LEVEL", "3")
sys.modules.setdefault("sklearn", None)   # Keras imports it if installed: 1.5-2.5 CPU-s

import keras  # noqa: E402
import tensorflow as tf  # noqa: E402

from hetpipe_tf.cluster.spec import Cluster  # noqa: E402
from hetpipe_tf.strategy import HetPipeStrategy, even_plan  # noqa: E402
from tests.strategy.helpers import regression_data, skip_model  # noqa: E402


def main() -> None:
    cluster = json.loads(sys.argv[1])
    resolver = tf.distribute.cluster_resolver.SimpleClusterResolver(
        tf.train.ClusterSpec(cluster), task_type="chief", task_id=0, rpc_layer="grpc")
    tf.config.experimental_connect_to_cluster(resolver, job_name="chief",
                                              make_master_device_default=False)
    hp = Cluster.from_tf_cluster_spec(cluster, {"worker:0": ["LOCAL_CPU"],
                                                "worker:1": ["LOCAL_CPU"]})
    probe = skip_model(0)
    plans = [even_plan(probe, [d.tf_device], n_m=1) for d in hp.devices]
    strategy = HetPipeStrategy(hp, plan=plans, clock_distance=0)
    with strategy.scope():
        model = skip_model(0)
        model.compile(keras.optimizers.SGD(0.05), "mse")
    w0 = model.get_weights()
    x, y = regression_data(64, 0)
    model.fit(x, y, batch_size=8, epochs=1, shuffle=False, verbose=0)
    coord = strategy.coordinator(model)
    print(json.dumps({
        "w0": [w.tolist() for w in w0],
        "final": [w.tolist() for w in model.get_weights()],
        "assignment": [list(a) for a in coord.assignment],
        "ps_devices": sorted({v.device for v in coord.servers.variables}),
        "local_devices": [sorted({v.device for v in s.local}) for s in coord.syncs],
        "pushes": len(coord.servers.pushes),
    }))
    strategy.close()


if __name__ == "__main__":
    main()
