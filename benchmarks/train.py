r"""Train for real on an embedded default: the README's main job.

  python -m benchmarks.train

One virtual worker over a local emulated heterogeneous cluster: logical CPU devices of this
machine, the second EMULATED at half speed (its stage sleeps for the extra time; emulation
only). The planner profiles the model and partitions it; HetPipeStrategy trains it with
N_m minibatches in flight under plain Keras `model.fit`. The task is generated offline:
four interleaved spirals, lifted to 16 features (learnable, not linear). Prints the cluster,
the plan, Keras' progress and the final validation accuracy; exits non-zero if the model
did not learn (accuracy <= --min_accuracy).
"""

from __future__ import annotations

import os

os.environ.setdefault("TF_CPP_MIN_LOG_LEVEL", "3")

from absl import app, flags  # noqa: E402

_EPOCHS = flags.DEFINE_integer("epochs", 6, "Training epochs.", lower_bound=1)
_BATCH_SIZE = flags.DEFINE_integer("batch_size", 64, "Minibatch size.", lower_bound=1)
_EXAMPLES = flags.DEFINE_integer("examples", 8192, "Generated training examples.",
                                 lower_bound=1)
_NM = flags.DEFINE_integer("nm", 0, "Minibatches in flight; 0 = the planner's default "
                           "min(Max_m, devices).", lower_bound=0)
_SPEED = flags.DEFINE_list("speed_factors", ["1.0", "0.5"],
                           "Emulated speed factor per device (one logical CPU each).")
_MIN_ACCURACY = flags.DEFINE_float("min_accuracy", 0.5, "Exit with 1 below this accuracy.")


@flags.validator("speed_factors", message="--speed_factors must be numbers in (0, 1], one "
                 "per device, at least one device.")
def _check_speed(values: list[str]) -> bool:
    try:
        return bool(values) and all(0 < float(v) <= 1 for v in values)
    except ValueError:
        return False


def make_data(n: int, seed: int = 0):
    """Four interleaved spirals in 2-D, lifted to 16 features."""
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
    """A residual MLP: skip connections that may cross stage cuts."""
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


def main(argv: list[str]) -> int:
    if len(argv) > 1:
        raise app.UsageError(f"Unexpected arguments: {argv[1:]}")
    from hetpipe_tf.cluster.local import configure_logical_devices
    from hetpipe_tf.cluster.spec import Cluster

    factors = [float(v) for v in _SPEED.value]
    configure_logical_devices(len(factors))
    import keras
    import tensorflow as tf

    from hetpipe_tf import HetPipeStrategy

    cluster = Cluster.local(["LOCAL_CPU"] * len(factors), emulated_speed_factors=factors)
    print(cluster.describe())
    x, y = make_data(_EXAMPLES.value)
    xv, yv = make_data(1024, seed=1)
    train = tf.data.Dataset.from_tensor_slices((x, y)).shuffle(len(x), seed=0).batch(
        _BATCH_SIZE.value, drop_remainder=True)
    val = tf.data.Dataset.from_tensor_slices((xv, yv)).batch(256)
    keras.utils.set_random_seed(0)
    strategy = HetPipeStrategy(cluster, n_m=_NM.value or None)
    with strategy.scope():
        model = build_model()
        model.compile(keras.optimizers.Adam(1e-3), "sparse_categorical_crossentropy",
                      metrics=["accuracy"])
    try:
        model.fit(train, validation_data=val, epochs=_EPOCHS.value, verbose=2)
        print(strategy.plan.table())
        _, accuracy = model.evaluate(val, verbose=0)
    finally:
        strategy.close()
    print(f"Final validation accuracy: {accuracy:.3f} (chance 0.25)")
    return 0 if accuracy > _MIN_ACCURACY.value else 1


if __name__ == "__main__":
    app.run(main)
