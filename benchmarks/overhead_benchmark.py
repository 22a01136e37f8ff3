r"""The pipeline runtime's own cost per minibatch and how close it gets to the machine
(issue 9's speed goals), printed as ratios measured in one run.

  python -m benchmarks.overhead_benchmark

Logical CPU devices of this machine (4: a device runs one stage of a virtual worker, so 4
stages need 4; every other setting uses the first 2), one intra-op thread. Every timed setting runs
--steps minibatches of Keras `fit` (after an untimed warm-up epoch) --repeats times,
round-robin over the settings of a part so that load from other processes hits them alike;
the fastest epoch of each setting counts (this VM stalls now and then). Parts:

small  --small_depth x Dense(--small_width), batch --small_batch: plain Keras fit on device 0
       and the strategy with 1, 2 and 4 stages (even split, stage j on device j, N_m =
       stages; 1 stage runs in Keras' own step, `pipeline/in_graph.py`), and 1 stage through
       the threaded runtime (in_graph=False). Prints each one's ms per minibatch, the
       overhead over plain (strategy - plain, ms per minibatch) and 1 stage / plain as a
       throughput ratio (goal >= 0.8x).
large  --large_depth x Dense(--large_width), batch --large_batch: the machine's ceiling (two
       compiled full training steps -- forward, backward, SGD update -- run at once, one per
       device, against one alone: 2 / (time of two / time of one) is the most two devices
       give), plain Keras fit, and 2-stage pipelines (layers on stage 0 in --large_splits x
       N_m in --large_nm; the best counts). Goals: best pipeline / plain >= 1 and
       (best / plain) / ceiling >= 0.85.
vw     the large model as 2 virtual workers of 1 stage each (one per device, N_m = 1, D = 0,
       every minibatch of the dataset to one VW) against tf.distribute.MirroredStrategy over
       the same two devices on the same dataset (each minibatch split over both replicas),
       both relative to plain Keras. Goal: 2 VWs >= MirroredStrategy.
"""

from __future__ import annotations

import os

os.environ.setdefault("TF_CPP_MIN_LOG_LEVEL", "3")

import functools  # noqa: E402
import time  # noqa: E402
from typing import Callable  # noqa: E402

from absl import app, flags, logging  # noqa: E402

from benchmarks._cli import compensation, compensation_flag, op_threads, run  # noqa: E402
from benchmarks._timing import seconds_at_once  # noqa: E402

_STEPS = flags.DEFINE_integer("steps", 40, "Timed minibatches per epoch.", lower_bound=1)
_WARMUP = flags.DEFINE_integer("warmup_steps", 5, "Minibatches of the untimed warm-up epoch.",
                               lower_bound=1)
_REPEATS = flags.DEFINE_integer("repeats", 5, "Timed epochs per setting; the fastest counts.",
                                lower_bound=1)
_SMALL_DEPTH = flags.DEFINE_integer("small_depth", 4, "Dense layers of the small model.",
                                    lower_bound=4)
_SMALL_WIDTH = flags.DEFINE_integer("small_width", 64, "Units of the small model's layers.",
                                    lower_bound=1)
_SMALL_BATCH = flags.DEFINE_integer("small_batch", 32, "Minibatch of the small model.",
                                    lower_bound=2)
_LARGE_DEPTH = flags.DEFINE_integer("large_depth", 12, "Dense layers of the large model.",
                                    lower_bound=2)
_LARGE_WIDTH = flags.DEFINE_integer("large_width", 512, "Units of the large model's layers.",
                                    lower_bound=1)
_LARGE_BATCH = flags.DEFINE_integer("large_batch", 256, "Minibatch of the large model.",
                                    lower_bound=2)
_LARGE_NM = flags.DEFINE_list("large_nm", ["1", "2", "4"], "N_m of the 2-stage pipelines.")
_LARGE_SPLITS = flags.DEFINE_list(
    "large_splits", ["7", "6"],
    "Layers (of --large_depth + 1) on stage 0 of the 2-stage pipelines; each split is run "
    "with every --large_nm. The even split puts the extra layer on stage 0.")
_COMPENSATION = compensation_flag("none")
_PARTS = flags.DEFINE_list("parts", ["small", "large", "vw"], "Which parts to run.")

flags.register_validator("large_nm", lambda v: bool(v) and all(s.isdigit() and int(s) > 0
                                                               for s in v),
                         "--large_nm must be positive integers.")
flags.register_validator("large_splits", lambda v: bool(v) and all(s.isdigit() and int(s) > 0
                                                                   for s in v),
                         "--large_splits must be positive integers.")
flags.register_validator("parts", lambda v: bool(v) and set(v) <= {"small", "large", "vw"},
                         "--parts takes small, large and/or vw.")
flags.register_validator("small_batch", lambda v: v % 2 == 0,
                         "--small_batch must be even (MirroredStrategy splits it in two).")
flags.register_validator("large_batch", lambda v: v % 2 == 0,
                         "--large_batch must be even (MirroredStrategy splits it in two).")


class _Setting:
    """One timed configuration: `epoch()` runs --steps minibatches and returns seconds."""

    def __init__(self, name: str, epoch: Callable[[], float], close=lambda: None):
        self.name = name
        self.epoch = epoch
        self.close = close
        self.times: list[float] = []

    @property
    def best_ms(self) -> float:
        return 1e3 * min(self.times) / _STEPS.value

    @property
    def range_ms(self) -> str:
        return (f"{1e3 * min(self.times) / _STEPS.value:.2f}-"
                f"{1e3 * max(self.times) / _STEPS.value:.2f}")


def _time_round_robin(settings: list[_Setting]) -> None:
    for _ in range(_REPEATS.value):
        for s in settings:
            s.times.append(s.epoch())


def _fit_setting(name: str, model, ds, close=lambda: None) -> _Setting:
    model.fit(ds, epochs=1, steps_per_epoch=_WARMUP.value, verbose=0)

    def epoch() -> float:
        start = time.perf_counter()
        model.fit(ds, epochs=1, steps_per_epoch=_STEPS.value, verbose=0)
        return time.perf_counter() - start
    return _Setting(name, epoch, close)


def _compile(keras, model) -> None:
    model.compile(keras.optimizers.SGD(1e-3), "sparse_categorical_crossentropy")


def _plain(keras, tf, ds, device: str, depth: int, width: int) -> _Setting:
    from hetpipe_tf.models import dense_stack
    keras.utils.set_random_seed(0)
    with tf.device(device):
        model = dense_stack(depth, width, "plain")
        _compile(keras, model)
    return _fit_setting("plain Keras fit", model, ds)


def _strategy(keras, ds, name: str, depth: int, width: int, plans, **kwargs) -> _Setting:
    from hetpipe_tf.models import dense_stack
    from hetpipe_tf.strategy import HetPipeStrategy
    keras.utils.set_random_seed(0)
    strategy = HetPipeStrategy(plan=plans, compensation=compensation(_COMPENSATION), **kwargs)
    with strategy.scope():
        model = dense_stack(depth, width, "pipelined")
        _compile(keras, model)
    return _fit_setting(name, model, ds, strategy.close)


def _even(keras, depth: int, width: int, devices: list[str], n_m: int):
    from hetpipe_tf.models import dense_stack
    from hetpipe_tf.strategy import even_plan
    return even_plan(dense_stack(depth, width, "pipelined"), devices, n_m=n_m)


def _ceiling(tf, keras, devices: list[str], depth: int, width: int, batch: int):
    """(one, two): settings timing one compiled full training step on device 0, and two
    copies at once (one per device, on two threads)."""
    from hetpipe_tf.models import dense_stack
    steps = []
    for d in devices:
        with tf.device(d):
            model = dense_stack(depth, width, "copy")
            opt = keras.optimizers.SGD(1e-3)
            opt.build(model.trainable_variables)
            x = tf.random.normal((batch, width))
            y = tf.zeros((batch,), tf.int32)
        loss_fn = keras.losses.SparseCategoricalCrossentropy()

        @tf.function
        def step(model=model, opt=opt, x=x, y=y, d=d):
            with tf.device(d):
                with tf.GradientTape() as tape:
                    loss = loss_fn(y, model(x, training=True))
                opt.apply_gradients(zip(tape.gradient(loss, model.trainable_variables),
                                        model.trainable_variables))
                return loss
        for _ in range(_WARMUP.value):
            step().numpy()
        steps.append(step)

    def loop(step):
        for _ in range(_STEPS.value):
            step().numpy()

    def one() -> float:
        start = time.perf_counter()
        loop(steps[0])
        return time.perf_counter() - start

    def two() -> float:
        return seconds_at_once([functools.partial(loop, s) for s in steps])
    return _Setting("one full step", one), _Setting("two full steps at once", two)


def _small(tf, keras, np, devices) -> None:
    from hetpipe_tf.models import random_features
    depth, width, batch = _SMALL_DEPTH.value, _SMALL_WIDTH.value, _SMALL_BATCH.value
    ds = random_features(width, batch, batches=8)
    print(f"\n[small] {depth} x Dense({width}) + Dense(10), batch {batch}")
    plain = _plain(keras, tf, ds, devices[0], depth, width)
    settings = [plain]
    for k in (1, 2, 4):
        plan = _even(keras, depth, width, devices[:k], n_m=k)
        settings.append(_strategy(keras, ds, f"{k} stage(s), N_m={k}", depth, width, plan))
    # The 1-stage row runs in Keras' step (in_graph); this one through the stage thread.
    settings.append(_strategy(keras, ds, "1 stage, threaded", depth, width,
                              _even(keras, depth, width, devices[:1], n_m=1),
                              in_graph=False))
    try:
        _time_round_robin(settings)
    finally:
        for s in settings:
            s.close()
    base = plain.best_ms
    for s in settings:
        extra = "" if s is plain else (f"  overhead {s.best_ms - base:6.2f} ms/minibatch  "
                                       f"= {base / s.best_ms:.2f}x plain")
        print(f"  {s.name:22} {s.best_ms:7.2f} ms/minibatch (epochs {s.range_ms}){extra}")
    one = settings[1]
    print(f"  GOAL 1-stage strategy / plain Keras fit >= 0.80x: {base / one.best_ms:.2f}x "
          f"(small steps, batch {batch})")


def _large(tf, keras, np, devices) -> float:
    from hetpipe_tf.models import dense_stack, random_features
    depth, width, batch = _LARGE_DEPTH.value, _LARGE_WIDTH.value, _LARGE_BATCH.value
    ds = random_features(width, batch, batches=8)
    print(f"\n[large] {depth} x Dense({width}) + Dense(10), batch {batch}")
    one, two = _ceiling(tf, keras, devices[:2], depth, width, batch)
    plain = _plain(keras, tf, ds, devices[0], depth, width)
    from hetpipe_tf.strategy import manual_plan
    layers = depth + 1
    for k in _LARGE_SPLITS.value:
        if int(k) >= layers:
            raise app.UsageError(
                f"--large_splits puts layers on stage 0 of a {layers}-layer model, so each "
                f"must be below {layers}. Received: {k}; e.g. --large_splits={layers // 2}.")
    pipes = [_strategy(keras, ds, f"2 stages {k}+{layers - int(k)}, N_m={n}", depth, width,
                       manual_plan(dense_stack(depth, width, "pipelined"),
                                   [(devices[0], int(k)), (devices[1], layers - int(k))],
                                   n_m=int(n)))
             for k in _LARGE_SPLITS.value for n in _LARGE_NM.value]
    settings = [one, two, plain, *pipes]
    try:
        _time_round_robin(settings)
    finally:
        for s in settings:
            s.close()
    ceiling = 2 * one.best_ms / two.best_ms
    print(f"  one full step alone    {one.best_ms:7.2f} ms (epochs {one.range_ms}); two at "
          f"once {two.best_ms:7.2f} ms (epochs {two.range_ms}): ceiling {ceiling:.2f}x")
    print(f"  {plain.name:26} {plain.best_ms:7.2f} ms/minibatch (epochs {plain.range_ms})")
    for s in pipes:
        print(f"  {s.name:26} {s.best_ms:7.2f} ms/minibatch (epochs {s.range_ms})  "
              f"= {plain.best_ms / s.best_ms:.2f}x plain")
    best = min(pipes, key=lambda s: s.best_ms)
    speedup = plain.best_ms / best.best_ms
    print(f"  GOAL best 2-stage pipeline ({best.name}) / plain >= 1.00x: {speedup:.2f}x")
    print(f"  GOAL best 2-stage pipeline / ceiling >= 0.85: {speedup / ceiling:.2f} "
          f"({speedup:.2f}x of {ceiling:.2f}x)")
    return ceiling


def _vw(tf, keras, np, devices) -> None:
    from hetpipe_tf.models import dense_stack, random_features
    from hetpipe_tf.strategy import even_plan
    depth, width, batch = _LARGE_DEPTH.value, _LARGE_WIDTH.value, _LARGE_BATCH.value
    ds = random_features(width, batch, batches=8)
    print(f"\n[vw] {depth} x Dense({width}) + Dense(10), batch {batch}")
    plain = _plain(keras, tf, ds, devices[0], depth, width)
    model = dense_stack(depth, width, "pipelined")
    plans = [even_plan(model, [d], n_m=1) for d in devices[:2]]
    vws = _strategy(keras, ds, "2 VWs x 1 stage, D=0", depth, width, plans, clock_distance=0)
    tf.get_logger().setLevel("ERROR")   # MirroredStrategy logs every reduction at INFO
    keras.utils.set_random_seed(0)
    mirrored = tf.distribute.MirroredStrategy(devices[:2])
    with mirrored.scope():
        mmodel = dense_stack(depth, width, "mirrored")
        _compile(keras, mmodel)
    mirror = _fit_setting("MirroredStrategy", mmodel, ds)
    settings = [plain, vws, mirror]
    try:
        _time_round_robin(settings)
    finally:
        for s in settings:
            s.close()
    for s in settings:
        print(f"  {s.name:22} {s.best_ms:7.2f} ms/minibatch (epochs {s.range_ms})  "
              f"= {plain.best_ms / s.best_ms:.2f}x plain")
    print(f"  GOAL 2 VWs x 1 stage (D=0) / MirroredStrategy >= 1.00x: "
          f"{mirror.best_ms / vws.best_ms:.2f}x (batch {batch} per minibatch both)")


def main(argv: list[str]) -> None:
    if len(argv) > 1:
        raise app.UsageError(f"Unexpected positional arguments. Received: {argv[1:]}; "
                             "pass options as --flag=value (--helpshort lists them).")
    comp = compensation(_COMPENSATION)
    from hetpipe_tf.cluster.local import configure_logical_devices
    configure_logical_devices(4)   # 4 stages need 4 devices (a device runs one stage)
    logging.set_verbosity(logging.WARNING)   # the strategy logs every plan at INFO
    import keras
    import numpy as np
    import tensorflow as tf
    op_threads(1, 6)
    from hetpipe_tf.cluster.spec import Cluster
    devices = [d.tf_device for d in Cluster.local(["LOCAL_CPU"] * 4).devices]
    print(f"Logical CPU devices on this machine's cores, 1 intra-op thread; {_STEPS.value} "
          f"timed minibatches per epoch, the fastest of {_REPEATS.value} epochs per setting "
          f"(round-robin); compensation {comp.value} in every HetPipe setting.")
    if "small" in _PARTS.value:
        _small(tf, keras, np, devices)
    if "large" in _PARTS.value:
        _large(tf, keras, np, devices)
    if "vw" in _PARTS.value:
        _vw(tf, keras, np, devices)


if __name__ == "__main__":
    run(main)
