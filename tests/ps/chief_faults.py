"""The chief of tests/ps/test_faults.py and benchmarks/fault_detection.py (a subprocess:
connecting to a cluster changes the process's TensorFlow context for good).

argv[1]: JSON {"cluster": {...}, "victim_pid": int, "signal": "SIGKILL" | "SIGSTOP" |
null, "on_fault": "stop" | "continue", "timeout_s": float, "at_batch": int,
"epochs": int, "at_epoch_end": send it in the last epoch's on_epoch_end instead (after
the epoch's drain), "checkpoint": path or absent, "plans": [[device, ...] per VW] or absent,
"hang_dump_s": seconds before the stack dump of a hang (150 if absent), "stall_dump_s":
the same counted from fit's last batch (absent: none)}.
Runs as the chief task of TF_CONFIG (HetPipeStrategy connects it), trains 2 one-stage VWs
(NP allocation, one per worker task, w_global on the ps task; with "plans", one VW per
list, its layers split evenly over those devices), sends the
signal to the victim after `at_batch` batches, and prints one JSON line: what fit raised
(type, message, task, address, VWs; "fit_raised": whether fit itself raised it), the seconds
from the signal to the error and to fit's end, the
VWs' assignment, and the final loss. With on_fault="continue" also: the VWs dropped and
when (seconds after the signal), the seconds to the first batch after the drop, each
epoch's loss and a checksum of the model's weights at each epoch end, evaluate's loss, and
(with "checkpoint") whether the ModelCheckpoint file loads with the final weights.
"""

import faulthandler
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
    # A hang prints every thread's stack to stderr and exits, well before the test's own
    # 300 s limit, so the test fails with the stacks instead of a bare timeout. With
    # "stall_dump_s", fit's batches re-arm the dump with that shorter delay: a hang in fit
    # then costs stall_dump_s after the last batch, not the whole limit, while a slow but
    # moving run on a loaded machine is never cut short.
    hang_s = args.get("hang_dump_s", 150)
    faulthandler.dump_traceback_later(hang_s, exit=True)
    stall_s = args.get("stall_dump_s")
    os.environ["TF_CONFIG"] = json.dumps({"cluster": args["cluster"],
                                          "task": {"type": "chief", "index": 0}})
    import hetpipe_tf as hp

    def make_model():
        return keras.Sequential([keras.Input((8,)),
                                 keras.layers.Dense(16, activation="relu", name="d1"),
                                 keras.layers.Dense(1, name="d2")])

    options = dict(n_m=1, clock_distance=0, fault_timeout_s=args["timeout_s"],
                   on_fault=args.get("on_fault", "stop"))
    if args.get("plans"):   # one list of stage devices per VW, split evenly at the first fit
        from hetpipe_tf.strategy import even_plan

        options["plan"] = lambda m: [even_plan(m, devices, n_m=1) for devices in args["plans"]]
    else:
        options["allocation"] = "NP"
    strategy = hp.HetPipeStrategy(**options)
    rng = np.random.default_rng(0)
    x = rng.normal(size=(args.get("samples", 1024), 8)).astype("float32")
    y = x[:, :1] * 2.0
    keras.utils.set_random_seed(0)
    with strategy.scope():
        model = make_model()
        model.compile(keras.optimizers.Adam(0.01), "mse")
    sent = {}
    epoch_weights = []

    class Inject(keras.callbacks.Callback):
        def on_train_batch_end(self, batch, logs=None):
            if stall_s:
                faulthandler.dump_traceback_later(stall_s, exit=True)
            if batch == args["at_batch"] and not sent and args.get("signal"):
                os.kill(args["victim_pid"], getattr(signal, args["signal"]))
                sent["t"] = time.monotonic()
            elif sent and "first_batch_after_drop" not in sent:
                coord = strategy.coordinator(self.model)
                if coord is not None and getattr(coord, "dropped_at", None):
                    sent["first_batch_after_drop"] = time.monotonic()

        def on_epoch_end(self, epoch, logs=None):
            epoch_weights.append(float(sum(np.abs(w).sum() for w in model.get_weights())))
            if (args.get("at_epoch_end") and epoch == args.get("epochs", 1) - 1 and not sent
                    and args.get("signal")):
                os.kill(args["victim_pid"], getattr(signal, args["signal"]))
                sent["t"] = time.monotonic()

        def on_train_end(self, logs=None):   # evaluate, its tracing, close: the long delay
            faulthandler.dump_traceback_later(hang_s, exit=True)

    callbacks = [Inject()]
    if args.get("checkpoint"):
        callbacks.append(keras.callbacks.ModelCheckpoint(args["checkpoint"]))

    out = {"raised": None, "fit_raised": False}
    try:
        try:
            history = model.fit(x, y, batch_size=8, epochs=args.get("epochs", 1),
                                shuffle=False, verbose=0, callbacks=callbacks)
        except Exception:
            out["fit_raised"] = True
            raise
        finally:
            if sent:
                out["fit_end_s"] = time.monotonic() - sent["t"]
        out["loss"] = history.history["loss"][-1]
        out["losses"] = history.history["loss"]
        out["epoch_weights"] = epoch_weights
        out["evaluate"] = float(model.evaluate(x, y, batch_size=64, verbose=0))
        if args.get("checkpoint"):
            loaded = keras.models.load_model(args["checkpoint"])
            out["checkpoint_matches"] = all(
                np.allclose(a, b) for a, b in zip(loaded.get_weights(), model.get_weights()))
    except Exception as e:  # noqa: BLE001 - reported to the test
        out["raised"] = type(e).__name__
        out["message"] = str(e)
        for field in ("task", "address", "virtual_workers"):
            out[field] = getattr(e, field, None)
    out["after_s"] = time.monotonic() - sent["t"] if sent else None
    coord = strategy.coordinator(model)
    if coord is not None:
        out["assignment"] = [list(a) for a in coord.assignment]
        out["devices"] = [[s.tf_device for s in p.stages] for p in strategy.plans]
        out["dropped"] = sorted(getattr(coord, "dropped", ()))
        if sent and getattr(coord, "dropped_at", None):
            out["drop_s"] = min(coord.dropped_at.values()) - sent["t"]
            if "first_batch_after_drop" in sent:
                out["first_batch_s"] = sent["first_batch_after_drop"] - sent["t"]
    t0 = time.monotonic()
    strategy.close()
    out["close_s"] = time.monotonic() - t0
    print(json.dumps(out), flush=True)
    os._exit(0)   # threads stuck in remote ops of a frozen task must not hold the exit


if __name__ == "__main__":
    main()
