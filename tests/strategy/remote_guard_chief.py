"""The chief of tests/strategy/test_remote_guard.py (a subprocess: connecting to a cluster
changes the process's TensorFlow context for good).

argv[1]: JSON {"cluster": {...}, "victim_pid": int, "signal": "SIGKILL" | "SIGSTOP" | null,
"timeout_s": float, "at_batch": int}. Runs as the chief task of TF_CONFIG, trains ONE
virtual worker planned over the worker tasks' devices (one stage a worker), sends the
signal to the victim after `at_batch` batches, and prints one JSON line: the stages'
devices, the executor's class, what fit raised (type, message, task, address, stages,
VWs), the seconds from the signal to the error and those `strategy.close()` took.
"""

import json
import os
import signal
import sys
import time

os.environ.setdefault("TF_CPP_MIN_LOG_LEVEL", "3")
sys.modules.setdefault("sklearn", None)   # Keras imports it if installed: 1.5-2.5 CPU-s

import keras  # noqa: E402
import numpy as np  # noqa: E402


def main() -> None:
    args = json.loads(sys.argv[1])
    os.environ["TF_CONFIG"] = json.dumps({"cluster": args["cluster"],
                                          "task": {"type": "chief", "index": 0}})
    import hetpipe_tf as hp

    strategy = hp.HetPipeStrategy(n_m=2, fault_timeout_s=args["timeout_s"])
    rng = np.random.default_rng(0)
    x = rng.normal(size=(512, 8)).astype("float32")
    y = x[:, :1] * 2.0
    keras.utils.set_random_seed(0)
    with strategy.scope():
        model = keras.Sequential([keras.Input((8,)), keras.layers.Dense(16, activation="relu"),
                                  keras.layers.Dense(1)])
        model.compile(keras.optimizers.SGD(0.01), "mse")
    sent = {}

    class Inject(keras.callbacks.Callback):
        def on_train_batch_end(self, batch, logs=None):
            if batch == args["at_batch"] and not sent and args.get("signal"):
                os.kill(args["victim_pid"], getattr(signal, args["signal"]))
                sent["t"] = time.monotonic()

    out = {"raised": None}
    try:
        history = model.fit(x, y, batch_size=8, epochs=1, shuffle=False, verbose=0,
                            callbacks=[Inject()])
        out["loss"] = history.history["loss"][-1]
    except Exception as e:  # noqa: BLE001 - reported to the test
        out["raised"] = type(e).__name__
        out["message"] = str(e)
        for field in ("task", "address", "stages", "virtual_workers"):
            out[field] = getattr(e, field, None)
    out["after_s"] = time.monotonic() - sent["t"] if sent else None
    out["devices"] = [s.tf_device for p in strategy.plans for s in p.stages]
    out["executor"] = type(strategy.executor(model)).__name__
    t0 = time.monotonic()
    strategy.close()
    out["close_s"] = time.monotonic() - t0
    print(json.dumps(out), flush=True)
    os._exit(0)   # threads stuck in remote ops of a frozen task must not hold the exit


if __name__ == "__main__":
    main()
