"""The chief of tests/ps/test_continue.py's inter-op starvation test (a subprocess:
connecting to a cluster changes the process's TensorFlow context for good).

argv[1]: JSON {"cluster": {...} (2 workers and this chief), "victim_pid": worker:0's pid,
"inter_op": the chief's inter-op threads, "wait_s": how long the other VW's call may take}.
Stands for cause 6 of docs/cluster_jobs.md "Going on without a lost VW": tensors made on
worker:0, which is then frozen (SIGSTOP) with their data still there; threads add 1 to
them; meanwhile another thread ("the other VW") calls, hosted on worker:1, a tf.function
that updates a variable on the chief's CPU (as the shared metrics update does). First the
adds run under worker:0's device (the fix), then, on fresh tensors, on the chief's
default device (as `loss + extra` did), one per inter-op thread. Prints one JSON line:
whether the other VW's call finished, in how many seconds, after each.
"""

import faulthandler
import json
import os
import signal
import sys
import threading
import time

os.environ.setdefault("TF_CPP_MIN_LOG_LEVEL", "3")
sys.modules.setdefault("sklearn", None)   # Keras imports it if installed: 1.5-2.5 CPU-s


def main() -> None:
    faulthandler.enable()   # a crash names its Python stacks in the test's message
    args = json.loads(sys.argv[1])
    import tensorflow as tf

    tf.config.threading.set_inter_op_parallelism_threads(args["inter_op"])
    from hetpipe_tf._shim import tf_executors
    from hetpipe_tf.cluster.roles import dispatch

    dispatch(None, 120.0, env={"TF_CONFIG": json.dumps(
        {"cluster": args["cluster"], "task": {"type": "chief", "index": 0}})})
    w0, w1 = ("/job:worker/replica:0/task:%d/device:CPU:0" % i for i in (0, 1))
    with tf.device("/job:chief/replica:0/task:0/device:CPU:0"):
        v = tf.Variable(0.0)

    @tf.function
    def update(x):
        v.assign_add(x)
        return v.read_value() * 2.0

    @tf.function
    def square(x):
        return x * x

    n = args["inter_op"]
    with tf.device(w1):
        update(tf.constant(1.0)).numpy()   # traced and registered before the freeze
    with tf.device(w0):
        made = [square(tf.constant(3.0)) for _ in range(2 * n)]
    for t in made:
        t.shape   # noqa: B018 - made: ready, their data still on worker:0
    warmed = threading.Barrier(2 * n + 1)
    go = {"task": threading.Event(), "chief": threading.Event()}

    def add(x, where):
        with tf_executors.own_executor():
            with tf.device(w0):   # the add kernel cached before the freeze, as in a fit
                warm = square(tf.constant(2.0))
            if where == "task":
                with tf.device(w0):
                    (warm + 1.0).numpy()
            else:
                (warm + 1.0).numpy()
            warmed.wait()
            go[where].wait()
            if where == "task":
                with tf.device(w0):
                    x + 1.0   # noqa: B018 - waits for worker:0 (never answers)
            else:
                x + 1.0   # noqa: B018

    for k, x in enumerate(made):
        threading.Thread(target=add, args=(x, "task" if k < n else "chief"),
                         daemon=True).start()
    warmed.wait()
    os.kill(args["victim_pid"], signal.SIGSTOP)
    out = {}
    for where in ("task", "chief"):
        go[where].set()
        time.sleep(2.0)   # the adds are waiting by now
        done = {}

        def other_vw():
            with tf_executors.own_executor():
                with tf.device(w1):
                    done["value"] = float(update(tf.constant(1.0)).numpy())

        t0 = time.monotonic()
        t = threading.Thread(target=other_vw, daemon=True)
        t.start()
        t.join(args["wait_s"])
        out[where] = {"done": "value" in done, "seconds": round(time.monotonic() - t0, 2)}
    print(json.dumps(out), flush=True)
    # Exit with worker:0 still frozen: resumed, it would answer the stuck adds while this
    # process tears down under them (a crash at exit under load). The test's
    # start_local_servers kills it, stopped or not.
    os._exit(0)   # threads stuck on the frozen task must not hold the exit


if __name__ == "__main__":
    main()
