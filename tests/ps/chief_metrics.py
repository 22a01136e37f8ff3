"""The chief of tests/ps/test_metrics.py (a subprocess: connecting to a cluster changes the
process's TensorFlow context for good).

argv[1]: JSON {"cluster": {...} or null, "epochs": int}. With a cluster, runs as its chief
task (TF_CONFIG); without, as one process on 2 logical CPU devices. Trains 2 one-stage
virtual workers (NP allocation, Adam) on a separable classification task until it is
converged and prints one JSON line: every epoch's training loss and accuracy.
"""

import json
import os
import sys

os.environ.setdefault("TF_CPP_MIN_LOG_LEVEL", "3")
sys.modules.setdefault("sklearn", None)   # Keras imports it if installed: 1.5-2.5 CPU-s

import keras  # noqa: E402
import numpy as np  # noqa: E402


def main() -> None:
    args = json.loads(sys.argv[1])
    import hetpipe_tf as hp

    options = dict(allocation="NP", n_m=1, clock_distance=0)
    if args.get("cluster"):
        os.environ["TF_CONFIG"] = json.dumps({"cluster": args["cluster"],
                                              "task": {"type": "chief", "index": 0}})
        strategy = hp.HetPipeStrategy(**options)
    else:
        from hetpipe_tf.cluster.local import configure_logical_devices

        configure_logical_devices(2)
        strategy = hp.HetPipeStrategy(hp.Cluster.local(["LOCAL_CPU", "LOCAL_CPU"], hosts=2),
                                      **options)
    rng = np.random.default_rng(0)
    # Two classes 2 apart along the first feature: separable, 1.0 after an epoch or two.
    y = (np.arange(args.get("samples", 128)) % 2).astype("float32")[:, None]
    x = rng.normal(size=(len(y), 4)).astype("float32") * 0.3
    x[:, :1] += 2.0 * y - 1.0
    keras.utils.set_random_seed(0)
    with strategy.scope():
        model = keras.Sequential([keras.Input((4,)), keras.layers.Dense(1, activation="sigmoid")])
        model.compile(keras.optimizers.Adam(0.1), "binary_crossentropy", metrics=["accuracy"])
    history = model.fit(x, y, batch_size=8, epochs=args.get("epochs", 6), shuffle=False,
                        verbose=0)
    counts = {v.path: float(v.numpy()) for m in model.metrics for v in m.variables
              if v.path.endswith("count")}   # the last epoch's samples, per metric
    training = strategy.extended.pipelines[id(model)]
    per_vw = training.vw_metrics is not None and training.vw_metrics.active
    print(json.dumps({"loss": history.history["loss"], "accuracy": history.history["accuracy"],
                      "counts": counts, "per_vw": per_vw}), flush=True)
    strategy.close()
    os._exit(0)


if __name__ == "__main__":
    main()
