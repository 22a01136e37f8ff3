r"""Throughput of one pipelined virtual worker under Keras fit (printed ratios, one run).

  python -m benchmarks.pipeline_benchmark

Model: --depth Dense(--width) layers with ReLU and a 10-way softmax, batch --batch_size, on
2 logical CPU devices of this machine, one intra-op thread each. Every figure is a ratio of
throughputs (samples/s over --steps minibatches after a warm-up epoch; the best of
--repeats such epochs) measured in this run:

1. N_m = 1, 2, 4, 8 over the planner's 2-stage plan, normalised to N_m = 1 (the metric of
   the paper's Figure 4). The ceiling printed before it is this machine's: the time of two
   independent copies of one training step running at once on the two devices, relative to
   one copy (2 / that ratio is the most any 2-device pipeline can gain here).
2. The 1-stage strategy against plain Keras fit on the same device.
3. Device 0 EMULATED at half speed (its tasks sleep for the extra time; emulation only): the
   planner's plan against an equal-layer split over the devices in the cluster's order.
"""

from __future__ import annotations

import os

os.environ.setdefault("TF_CPP_MIN_LOG_LEVEL", "3")

import dataclasses  # noqa: E402
import functools  # noqa: E402
import time  # noqa: E402

from absl import app, flags  # noqa: E402

from benchmarks._cli import compensation, compensation_flag, op_threads, run  # noqa: E402
from benchmarks._timing import best_rate, seconds_at_once  # noqa: E402

_STEPS = flags.DEFINE_integer("steps", 30, "Timed minibatches per measurement.", lower_bound=1)
_WARMUP = flags.DEFINE_integer("warmup_steps", 5, "Minibatches of the untimed warm-up epoch.",
                               lower_bound=1)
_BATCH_SIZE = flags.DEFINE_integer("batch_size", 256, "Minibatch size.", lower_bound=1)
_WIDTH = flags.DEFINE_integer("width", 512, "Units of every hidden Dense layer.",
                              lower_bound=1)
_DEPTH = flags.DEFINE_integer("depth", 24, "Hidden Dense layers.", lower_bound=2)
_NM = flags.DEFINE_list("nm", ["1", "2", "4", "8"], "N_m values of part 1.")
_REPEATS = flags.DEFINE_integer("repeats", 5, "Timed epochs per setting; the fastest counts.",
                                lower_bound=1)
_COMPENSATION = compensation_flag("none")
_PARTS = flags.DEFINE_list("parts", ["1", "2", "3"], "Which parts to run.")

flags.register_validator("nm", lambda v: all(s.isdigit() and int(s) > 0 for s in v),
                         "--nm must be positive integers.")
flags.register_validator("parts", lambda v: set(v) <= {"1", "2", "3"},
                         "--parts takes 1, 2 and/or 3.")


def _build(keras, name: str):
    from hetpipe_tf.models import dense_stack
    return dense_stack(_DEPTH.value, _WIDTH.value, name)


def _dataset(tf, np):
    from hetpipe_tf.models import random_features
    return random_features(_WIDTH.value, _BATCH_SIZE.value, batches=8)


def _throughput(model, ds) -> float:
    """Best samples/s of --repeats timed epochs of --steps after a --warmup_steps epoch."""
    return best_rate(model, ds, _STEPS.value, _BATCH_SIZE.value, _REPEATS.value,
                     _WARMUP.value)


def _strategy_throughput(keras, ds, plan) -> float:
    from hetpipe_tf.strategy import HetPipeStrategy
    keras.utils.set_random_seed(0)
    strategy = HetPipeStrategy(plan=plan, compensation=compensation(_COMPENSATION))
    with strategy.scope():
        model = _build(keras, "pipelined")
        model.compile(keras.optimizers.SGD(1e-3), "sparse_categorical_crossentropy")
    try:
        return _throughput(model, ds)
    finally:
        strategy.close()


def _machine_ceiling(tf, keras, devices) -> float:
    """Time of two concurrent copies of a compiled training step (one per device) / one."""
    steps = []
    for d in devices:
        with tf.device(d):
            model = _build(keras, "copy")
            x = tf.random.normal((_BATCH_SIZE.value, _WIDTH.value))

        @tf.function
        def step(model=model, x=x, d=d):
            with tf.device(d):
                with tf.GradientTape() as tape:
                    loss = tf.reduce_mean(model(x, training=True))
                return tape.gradient(loss, model.trainable_variables)
        step()
        steps.append(step)

    def loop(step):
        for _ in range(_STEPS.value):
            tf.nest.flatten(step())[0].numpy()

    start = time.perf_counter()
    loop(steps[0])
    one = time.perf_counter() - start
    return seconds_at_once([functools.partial(loop, s) for s in steps]) / one


def main(argv: list[str]) -> None:
    if len(argv) > 1:
        raise app.UsageError(f"Unexpected positional arguments. Received: {argv[1:]}; "
                             "pass options as --flag=value (--helpshort lists them).")
    comp = compensation(_COMPENSATION)
    from hetpipe_tf.cluster.local import configure_logical_devices
    configure_logical_devices(2)
    import keras
    import numpy as np
    import tensorflow as tf
    op_threads(1, 4)
    from hetpipe_tf.cluster.spec import Cluster
    from hetpipe_tf.partitioner.planner import plan_model
    from hetpipe_tf.strategy import even_plan

    ds = _dataset(tf, np)
    batch = _BATCH_SIZE.value
    print(f"Model: {_DEPTH.value} x Dense({_WIDTH.value}) + Dense(10), batch {batch}, "
          f"{_STEPS.value} timed minibatches; 2 logical CPU devices, 1 intra-op thread; "
          f"compensation {comp.value}.")
    cluster = Cluster.local(["LOCAL_CPU", "LOCAL_CPU"])
    devices = [d.tf_device for d in cluster.devices]
    max_nm = max(int(n) for n in _NM.value)

    if "1" in _PARTS.value:
        ceiling = _machine_ceiling(tf, keras, devices)
        print(f"\nThis machine: two copies of a training step at once take {ceiling:.2f}x the "
              f"time of one, so 2 devices give at most {2 / ceiling:.2f}x.")
        plan = plan_model(_build(keras, "planned"), cluster, batch, n_m=max_nm).plan
        print(plan.table())
        base = None
        for n in (int(v) for v in _NM.value):
            tput = _strategy_throughput(keras, ds, dataclasses.replace(plan, n_m=n))
            base = base or tput
            print(f"  N_m={n}: {tput:8.1f} samples/s = {tput / base:.2f}x N_m={_NM.value[0]}")

    if "2" in _PARTS.value:
        keras.utils.set_random_seed(0)
        with tf.device(devices[0]):
            plain = _build(keras, "plain")
            plain.compile(keras.optimizers.SGD(1e-3), "sparse_categorical_crossentropy")
        plain_tput = _throughput(plain, ds)
        one = plan_model(_build(keras, "planned"), cluster, batch, devices=[cluster.devices[0]],
                         n_m=1, measure=False).plan
        one_tput = _strategy_throughput(keras, ds, one)
        print(f"\n1-stage strategy: {one_tput:8.1f} samples/s; plain Keras fit on the same "
              f"device: {plain_tput:8.1f} samples/s = {one_tput / plain_tput:.2f}x plain")

    if "3" in _PARTS.value:
        slow = Cluster.local(["LOCAL_CPU", "LOCAL_CPU"], emulated_speed_factors=[0.5, 1.0])
        plan = plan_model(_build(keras, "planned"), slow, batch, n_m=2).plan
        equal = even_plan(_build(keras, "planned"), [d.tf_device for d in slow.devices], n_m=2,
                          speed_factors=[d.emulated_speed_factor for d in slow.devices])
        equal_tput = _strategy_throughput(keras, ds, equal)
        plan_tput = _strategy_throughput(keras, ds, plan)
        print("\nDevice 0 EMULATED at 0.5x speed (emulation: its tasks sleep the extra time).")
        print(plan.table())
        print(f"  equal-layer split ({equal.stages[0].num_layers}+{equal.stages[1].num_layers} "
              f"layers in device order): {equal_tput:8.1f} samples/s; planner's plan: "
              f"{plan_tput:8.1f} samples/s = {plan_tput / equal_tput:.2f}x")


if __name__ == "__main__":
    run(main)
