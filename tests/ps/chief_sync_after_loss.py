"""The chief of tests/ps/test_continue.py's check of why cluster jobs set
TF_PS_DISABLE_ASYNC_EXECUTOR_GLOBALLY (a subprocess: connecting to a cluster changes the
process's TensorFlow context for good).

argv[1]: JSON {"cluster": {...}, "victim_pid": int, "wait_s": float}. Connects as the chief,
puts a variable on the ps and one on each worker, SIGKILLs the victim (worker:1), checks
that ops on the ps and worker:0 still run, then calls `context.async_wait()` (what Keras'
`tf_sync` does at every epoch end) on a thread, without and then with
TF_PS_DISABLE_ASYNC_EXECUTOR_GLOBALLY=True, and prints one JSON line: whether the ps and
worker:0 answered, and whether each async_wait returned within `wait_s`.
"""

import json
import os
import signal
import sys
import threading
import time

os.environ.setdefault("TF_CPP_MIN_LOG_LEVEL", "3")
sys.modules.setdefault("sklearn", None)   # Keras imports it if installed: 1.5-2.5 CPU-s


def main() -> None:
    args = json.loads(sys.argv[1])
    import tensorflow as tf
    from tensorflow.python.eager import context

    cluster = args["cluster"]
    tf.config.experimental_connect_to_cluster(tf.train.ClusterSpec(cluster), job_name="chief")
    devices = {t: f"/job:{t.split(':')[0]}/replica:0/task:{t.split(':')[1]}/device:CPU:0"
               for t in ("ps:0", "worker:0", "worker:1")}
    variables = {}
    for t, d in devices.items():
        with tf.device(d):
            variables[t] = tf.Variable(tf.ones([4]))
    os.kill(args["victim_pid"], signal.SIGKILL)
    time.sleep(1.0)
    out = {}
    try:
        with tf.device(devices["worker:1"]):
            (variables["worker:1"] * 2.0).numpy()
        out["lost_worker_op"] = "ran"
    except tf.errors.OpError as e:
        out["lost_worker_op"] = type(e).__name__
    variables["ps:0"].assign_add(tf.ones([4]))
    out["ps"] = float(variables["ps:0"].numpy()[0])
    out["worker0"] = float(variables["worker:0"].numpy()[0])
    def returns(wait_s: float) -> bool:
        done = threading.Event()

        def sync() -> None:
            try:
                context.async_wait()
            except Exception:  # noqa: BLE001 - an error is an answer too
                pass
            done.set()

        threading.Thread(target=sync, daemon=True).start()
        return done.wait(wait_s)

    os.environ.pop("TF_PS_DISABLE_ASYNC_EXECUTOR_GLOBALLY", None)
    out["async_wait_returned"] = returns(args["wait_s"])
    # What hetpipe_tf sets for cluster jobs (as ParameterServerStrategyV2 does).
    os.environ["TF_PS_DISABLE_ASYNC_EXECUTOR_GLOBALLY"] = "True"
    out["async_wait_returned_with_env"] = returns(args["wait_s"])
    print(json.dumps(out), flush=True)
    os._exit(0)   # the sync thread may never return


if __name__ == "__main__":
    main()
