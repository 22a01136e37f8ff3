"""Pipeline benchmark (printed ratios from one run; not a timed test).

    python -m hetpipe_tf.strategy.bench [--steps=40 --width=1024 --depth=8 --batch=128]

On 2 logical CPU devices with one intra-op thread each, prints:
  1. throughput at N_m = 1, 2, 4, 8 (2 stages) normalised to N_m = 1 (paper Figure 4 metric);
  2. the 1-stage strategy's throughput relative to plain Keras fit on the same device;
  3. with device 1 EMULATED 2x slower: the planner's plan against an equal-layer split.
"""

from __future__ import annotations

import os
import sys
import time

os.environ.setdefault("TF_CPP_MIN_LOG_LEVEL", "3")

from absl import app, flags  # noqa: E402

FLAGS = flags.FLAGS
flags.DEFINE_integer("steps", 40, "Timed minibatches per measurement (after a warm-up).")
flags.DEFINE_integer("width", 1024, "Units of each hidden Dense layer.")
flags.DEFINE_integer("depth", 8, "Hidden Dense layers.")
flags.DEFINE_integer("batch", 128, "Minibatch size.")


def _model(keras, width, depth, name="bench_mlp"):
    inp = keras.Input((width,), name="x")
    h = inp
    for i in range(depth):
        h = keras.layers.Dense(width, activation="relu", name=f"dense{i}")(h)
    out = keras.layers.Dense(10, name="logits")(h)
    return keras.Model(inp, out, name=name)


def _throughput(model, ds_fn, steps) -> float:
    """Samples/s of an epoch of `steps` minibatches, after a warm-up epoch."""
    model.fit(ds_fn(), epochs=1, steps_per_epoch=4, verbose=0)
    t0 = time.perf_counter()
    model.fit(ds_fn(), epochs=1, steps_per_epoch=steps, verbose=0)
    return steps * FLAGS.batch / (time.perf_counter() - t0)


def main(argv):
    del argv
    from hetpipe_tf.cluster.spec import Cluster, configure_logical_devices

    configure_logical_devices(2)
    import keras
    import numpy as np
    import tensorflow as tf

    tf.config.threading.set_intra_op_parallelism_threads(1)
    tf.config.threading.set_inter_op_parallelism_threads(4)
    from hetpipe_tf.strategy import HetPipeStrategy, even_plan

    w, d, b, steps = FLAGS.width, FLAGS.depth, FLAGS.batch, FLAGS.steps
    rs = np.random.RandomState(0)
    x = rs.randn(b * 8, w).astype("float32")
    y = rs.randint(0, 10, b * 8).astype("int32")

    def ds_fn():
        return tf.data.Dataset.from_tensor_slices((x, y)).batch(b, drop_remainder=True).repeat()

    devices = ["/job:localhost/replica:0/task:0/device:CPU:0",
               "/job:localhost/replica:0/task:0/device:CPU:1"]

    def run(plan_fn=None, cluster=None):
        keras.utils.set_random_seed(0)
        strategy = HetPipeStrategy(cluster, plan=plan_fn)
        with strategy.scope():
            model = _model(keras, w, d)
            model.compile(keras.optimizers.SGD(0.001), "sparse_categorical_crossentropy")
        tput = _throughput(model, ds_fn, steps)
        plan = strategy.plan
        strategy.close()
        return tput, plan

    print(f"model: {d} x Dense({w}) + Dense(10), batch {b}, {steps} timed minibatches, "
          "2 logical CPU devices, 1 intra-op thread")
    base = None
    for n_m in (1, 2, 4, 8):
        tput, _ = run(lambda m, n=n_m: even_plan(m, devices, n_m=n))
        base = base or tput
        print(f"  2 stages, N_m={n_m}: {tput:8.1f} samples/s  = {tput / base:.2f}x N_m=1")

    keras.utils.set_random_seed(0)
    with tf.device(devices[0]):
        plain = _model(keras, w, d, name="plain")
        plain.compile(keras.optimizers.SGD(0.001), "sparse_categorical_crossentropy")
        plain_tput = _throughput(plain, ds_fn, steps)
    one, _ = run(lambda m: even_plan(m, devices[:1], n_m=1))
    print(f"  plain Keras fit: {plain_tput:8.1f} samples/s; 1-stage strategy: {one:8.1f} "
          f"samples/s = {one / plain_tput:.2f}x plain")

    cluster = Cluster.local(["LOCAL_CPU", "LOCAL_CPU"], emulated_speed_factors=[1.0, 0.5])
    equal, _ = run(lambda m: even_plan(m, [dv.tf_device for dv in cluster.devices], n_m=2,
                                       speed_factors=[1.0, 0.5]))
    planned, plan = run(cluster=cluster)
    print("  device 1 EMULATED at 0.5x speed:")
    print("    " + plan.table().replace("\n", "\n    "))
    print(f"    equal-layer split: {equal:8.1f} samples/s; planner's plan: {planned:8.1f} "
          f"samples/s = {planned / equal:.2f}x")
    return 0


if __name__ == "__main__":
    sys.exit(app.run(main))
