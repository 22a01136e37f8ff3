"""Train for real on an embedded default: one virtual worker over a local emulated
heterogeneous cluster of logical CPU devices (the second device EMULATED at half speed).

    python -m hetpipe_tf.strategy.demo

Prints the planner's plan, Keras' progress and the final accuracy (a few minutes at most
on 2 cores; offline: the data set is generated).
"""

from __future__ import annotations

import os
import sys

os.environ.setdefault("TF_CPP_MIN_LOG_LEVEL", "2")


def make_data(n: int, seed: int = 0):
    """Four interleaved spirals in 2-D, lifted to 16 features: learnable, not linear."""
    import numpy as np

    rs = np.random.RandomState(seed)
    classes = rs.randint(0, 4, n)
    t = rs.rand(n) * 3.0 + 0.3
    angle = t * 2.2 + classes * (np.pi / 2)
    xy = np.stack([t * np.cos(angle), t * np.sin(angle)], 1) + 0.08 * rs.randn(n, 2)
    feats = np.concatenate([xy, np.sin(xy * 1.7), np.cos(xy * 1.3), xy ** 2 / 4,
                            np.sin(xy[:, :1] * xy[:, 1:] * 0.8), rs.randn(n, 7) * 0.1], 1)
    return feats.astype("float32"), classes.astype("int32")


def build_model(width: int = 128, depth: int = 6):
    import keras

    inp = keras.Input((16,), name="features")
    h = keras.layers.Dense(width, activation="relu", name="dense_in")(inp)
    for i in range(depth):
        r = keras.layers.Dense(width, activation="relu", name=f"block{i}_a")(h)
        r = keras.layers.Dense(width, name=f"block{i}_b")(r)
        h = keras.layers.Add(name=f"block{i}_add")([h, r])
        h = keras.layers.Activation("relu", name=f"block{i}_relu")(h)
    out = keras.layers.Dense(4, activation="softmax", name="classes")(h)
    return keras.Model(inp, out, name="spiral_resmlp")


def main(argv=None) -> int:
    from hetpipe_tf.cluster.spec import Cluster, configure_logical_devices

    configure_logical_devices(2)
    import keras
    import tensorflow as tf

    from hetpipe_tf.strategy import HetPipeStrategy

    cluster = Cluster.local(["LOCAL_CPU", "LOCAL_CPU"], emulated_speed_factors=[1.0, 0.5])
    print("Cluster (device 1 is EMULATED at 0.5x speed):")
    for d in cluster.devices:
        print(f"  {d.name}: {d.tf_device}, emulated_speed_factor={d.emulated_speed_factor}")
    x, y = make_data(8192)
    xv, yv = make_data(1024, seed=1)
    batch = 64
    train = tf.data.Dataset.from_tensor_slices((x, y)).shuffle(8192, seed=0).batch(
        batch, drop_remainder=True)
    val = tf.data.Dataset.from_tensor_slices((xv, yv)).batch(256)
    keras.utils.set_random_seed(0)
    strategy = HetPipeStrategy(cluster)
    with strategy.scope():
        model = build_model()
        model.compile(keras.optimizers.Adam(1e-3), "sparse_categorical_crossentropy",
                      metrics=["accuracy"])

    class PrintPlan(keras.callbacks.Callback):
        def on_epoch_begin(self, epoch, logs=None):
            if epoch == 1:
                print(strategy.plan.table())

    model.fit(train, validation_data=val, epochs=6, callbacks=[PrintPlan()], verbose=2)
    print(strategy.plan.table())
    loss, acc = model.evaluate(val, verbose=0)
    print(f"Final validation accuracy: {acc:.3f} (chance 0.25)")
    strategy.close()
    return 0 if acc > 0.5 else 1


if __name__ == "__main__":
    sys.exit(main(sys.argv))
