r"""Train a Keras model with HetSeq-style data parallelism over unequal devices.

  python examples/hetseq_train.py                     # 4 logical CPUs, the last EMULATED at 0.5x
  python examples/hetseq_train.py --shares=10,10,10,2 --batch_size=32

Every device holds the whole model; each batch is split into one share per device by its
speed (the planner profiles the model and prints the shares it chose and why), each
share's loss is weighted by its share of the batch, and the summed gradients are applied
once: every step equals one step of plain Keras on the whole batch (docs/hetseq.md). On a
machine with GPUs of different types, pass their cluster instead of `Cluster.local`.
"""

from __future__ import annotations

import argparse
import os

os.environ.setdefault("TF_CPP_MIN_LOG_LEVEL", "3")


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--speed_factors", default="1,1,1,0.5",
                        help="EMULATED speed per logical CPU device (1 = real speed)")
    parser.add_argument("--shares", default=None,
                        help="per-device batch sizes by hand (default: chosen by speed)")
    parser.add_argument("--batch_size", type=int, default=64)
    parser.add_argument("--epochs", type=int, default=3)
    args = parser.parse_args()
    factors = [float(v) for v in args.speed_factors.split(",")]

    from hetpipe_tf.cluster.local import configure_logical_devices
    configure_logical_devices(len(factors))   # before TensorFlow runs any op

    import keras
    import numpy as np

    from hetpipe_tf.cluster.spec import Cluster
    from hetpipe_tf.strategy import HetPipeStrategy

    cluster = Cluster.local(["LOCAL_CPU"] * len(factors), emulated_speed_factors=factors)
    shares = None if args.shares is None else [int(v) for v in args.shares.split(",")]
    strategy = HetPipeStrategy(cluster, data_parallel="hetseq", shares=shares)

    rs = np.random.RandomState(0)
    x = rs.randn(1000, 20).astype("float32")            # 1000 = 15 batches of 64 + 40
    y = (x[:, :3].sum(axis=1) > 0).astype("int32")
    with strategy.scope():
        model = keras.Sequential([keras.Input((20,)),
                                  keras.layers.Dense(64, activation="relu"),
                                  keras.layers.Dense(64, activation="relu"),
                                  keras.layers.Dense(2, activation="softmax")])
        model.compile(keras.optimizers.Adam(1e-3), "sparse_categorical_crossentropy",
                      metrics=["accuracy"])
    history = model.fit(x, y, batch_size=args.batch_size, epochs=args.epochs, verbose=2)
    executor = strategy.executor(model)
    print(f"shares of a batch of {args.batch_size}: {list(executor.shares.sizes)}; the "
          f"epoch's last, smaller batch was split {list(executor.splits)[-1]}")
    print(f"final loss {history.history['loss'][-1]:.4f}, accuracy "
          f"{history.history['accuracy'][-1]:.3f}")
    strategy.close()


if __name__ == "__main__":
    main()
