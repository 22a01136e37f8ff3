"""The chief of tests/ps/test_faults.py and benchmarks/fault_detection.py (a subprocess:
connecting to a cluster changes the process's TensorFlow context for good).

argv[1]: JSON {"cluster": {...}, "victim_pid": int, "signal": "SIGKILL" | "SIGSTOP" |
null, "on_fault": "stop" | "continue", "timeout_s": float, "at_batch": int,
"epochs": int}. Runs as the chief task of TF_CONFIG (HetPipeStrategy connects it), trains
2 one-stage VWs (NP allocation, one per worker task, w_global on the ps task), sends the
signal to the victim after `at_batch` batches, and prints one JSON line: what fit raised
(type, message, task, address, VWs), the seconds from the signal to the error, the
VWs' assignment, and the final loss.
"""

import json
import os
import signal
import sys
import time

os.environ.setdefault("TF_CPP_MIN_LOG_LEVEL", "3")

import keras  # noqa: E402
import numpy as np  # noqa: E402


def main() -> None:
    args = json.loads(sys.argv[1])
    os.environ["TF_CONFIG"] = json.dumps({"cluster": args["cluster"],
                                          "task": {"type": "chief", "index": 0}})
    import hetpipe_tf as hp

    strategy = hp.HetPipeStrategy(allocation="NP", n_m=1, clock_distance=0,
                                  fault_timeout_s=args["timeout_s"],
                                  on_fault=args.get("on_fault", "stop"))
    rng = np.random.default_rng(0)
    x = rng.normal(size=(args.get("samples", 1024), 8)).astype("float32")
    y = x[:, :1] * 2.0
    keras.utils.set_random_seed(0)
    with strategy.scope():
        model = keras.Sequential([keras.Input((8,)), keras.layers.Dense(16, activation="relu"),
                                  keras.layers.Dense(1)])
        model.compile(keras.optimizers.Adam(0.01), "mse")
    sent = {}

    class Inject(keras.callbacks.Callback):
        def on_train_batch_end(self, batch, logs=None):
            if batch == args["at_batch"] and not sent and args.get("signal"):
                os.kill(args["victim_pid"], getattr(signal, args["signal"]))
                sent["t"] = time.monotonic()

    out = {"raised": None}
    try:
        history = model.fit(x, y, batch_size=8, epochs=args.get("epochs", 1), shuffle=False,
                            verbose=0, callbacks=[Inject()])
        out["loss"] = history.history["loss"][-1]
    except Exception as e:  # noqa: BLE001 - reported to the test
        out["raised"] = type(e).__name__
        out["message"] = str(e)
        for field in ("task", "address", "virtual_workers"):
            out[field] = getattr(e, field, None)
    out["after_s"] = time.monotonic() - sent["t"] if sent else None
    coord = strategy.coordinator(model)
    if coord is not None:
        out["assignment"] = [list(a) for a in coord.assignment]
        out["dropped"] = sorted(getattr(coord, "dropped", ()))
    t0 = time.monotonic()
    strategy.close()
    out["close_s"] = time.monotonic() - t0
    print(json.dumps(out), flush=True)
    os._exit(0)   # threads stuck in remote ops of a frozen task must not hold the exit


if __name__ == "__main__":
    main()
