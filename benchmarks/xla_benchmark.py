r"""XLA per stage: the same pipeline with `compile(jit_compile=False)` and `True` side by
side, printed as ratios measured in one run (hetpipe_tf/strategy/xla.py).

  python -m benchmarks.xla_benchmark

--depth x Dense(--width) + Dense(10), batch --batch, split evenly into --stages stages on
as many logical CPU devices of this machine (one intra-op thread each), N_m = --n_m, HetPipe's
schedule (--schedule=gpipe or 1f1b: that synchronous schedule with --micro_batches), Keras'
`fit` on fixed random minibatches. Both settings are built from the same initial weights;
each runs an untimed warm-up epoch of --warmup_steps minibatches (XLA compiles there), then
--repeats timed epochs of --steps minibatches, round-robin so that load from other
processes hits both alike. Printed per setting: throughput (samples/s) and wall and CPU
milliseconds per minibatch (CPU: this process's user + system time over the epoch, all
threads) of the fastest epoch; then on / off as ratios; then max |dw|, the largest
difference of any weight between the two models, which trained on the same minibatches.
"""

from __future__ import annotations

import os

os.environ.setdefault("TF_CPP_MIN_LOG_LEVEL", "3")

import time  # noqa: E402

from absl import app, flags, logging  # noqa: E402

from benchmarks._cli import (compensation, compensation_flag, markdown_table,  # noqa: E402
                             op_threads, run)

_DEPTH = flags.DEFINE_integer("depth", 8, "Dense layers of the model.", lower_bound=1)
_WIDTH = flags.DEFINE_integer("width", 256, "Units of the model's layers.", lower_bound=1)
_BATCH = flags.DEFINE_integer("batch", 64, "Minibatch size.", lower_bound=1)
_STAGES = flags.DEFINE_integer("stages", 2, "Pipeline stages, one logical CPU device each.",
                               lower_bound=1, upper_bound=4)
_N_M = flags.DEFINE_integer("n_m", 2, "Minibatches in flight (1 under --schedule gpipe or "
                            "1f1b).", lower_bound=1)
_SCHEDULE = flags.DEFINE_enum("schedule", "hetpipe", ["hetpipe", "gpipe", "1f1b"],
                              "The pipeline's schedule.")
_MICRO = flags.DEFINE_integer("micro_batches", 4, "Micro-batches per minibatch under gpipe "
                              "and 1f1b.", lower_bound=1)
_STEPS = flags.DEFINE_integer("steps", 30, "Timed minibatches per epoch.", lower_bound=1)
_WARMUP = flags.DEFINE_integer("warmup_steps", 5, "Minibatches of the untimed warm-up epoch "
                               "(XLA compiles there).", lower_bound=1)
_REPEATS = flags.DEFINE_integer("repeats", 3, "Timed epochs per setting; the fastest counts.",
                                lower_bound=1)
_INTRA = flags.DEFINE_integer("intra_op_threads", 1, "TensorFlow's intra-op threads (the "
                              "logical devices share them).", lower_bound=1)
_COMPENSATION = compensation_flag("none")


class _Setting:
    """One model under its own strategy; `epoch()` times --steps minibatches."""

    def __init__(self, jit: bool, model, strategy, ds):
        self.jit, self.model, self.strategy, self.ds = jit, model, strategy, ds
        self.wall: list[float] = []
        self.cpu: list[float] = []

    def fit(self, steps: int) -> None:
        self.model.fit(self.ds, epochs=1, steps_per_epoch=steps, shuffle=False, verbose=0)

    def epoch(self) -> None:
        wall, cpu = time.perf_counter(), time.process_time()
        self.fit(_STEPS.value)
        self.cpu.append(time.process_time() - cpu)
        self.wall.append(time.perf_counter() - wall)

    @property
    def best(self) -> int:
        return min(range(len(self.wall)), key=self.wall.__getitem__)

    @property
    def ms(self) -> float:
        return 1e3 * self.wall[self.best] / _STEPS.value

    @property
    def cpu_ms(self) -> float:
        return 1e3 * self.cpu[self.best] / _STEPS.value

    @property
    def rate(self) -> float:
        return _STEPS.value * _BATCH.value / self.wall[self.best]


def _setting(jit: bool, devices: list[str], comp, weights) -> _Setting:
    import keras

    from hetpipe_tf.models import dense_stack, random_features
    from hetpipe_tf.strategy import HetPipeStrategy, even_plan

    depth, width = _DEPTH.value, _WIDTH.value
    synchronous = _SCHEDULE.value != "hetpipe"
    n_m = 1 if synchronous else _N_M.value
    plan = even_plan(dense_stack(depth, width, "xla"), devices[:_STAGES.value], n_m=n_m)
    kwargs = dict(schedule=_SCHEDULE.value, micro_batches=_MICRO.value) if synchronous else {}
    strategy = HetPipeStrategy(plan=plan, compensation=comp, **kwargs)
    with strategy.scope():
        model = dense_stack(depth, width, "xla")
        model.set_weights(weights)
        model.compile(keras.optimizers.SGD(1e-3), "sparse_categorical_crossentropy",
                      jit_compile=jit)
    return _Setting(jit, model, strategy, random_features(width, _BATCH.value, batches=8))


def _max_dw(a, b) -> float:
    import numpy as np
    return max(float(np.max(np.abs(x - y))) for x, y in zip(a, b))


def main(argv: list[str]) -> None:
    if len(argv) > 1:
        raise app.UsageError(f"Unexpected positional arguments. Received: {argv[1:]}; "
                             "pass options as --flag=value (--helpshort lists them).")
    if _DEPTH.value + 1 < _STAGES.value:
        raise app.UsageError(
            f"Each stage needs a layer. Received: --stages={_STAGES.value} for "
            f"{_DEPTH.value + 1} layers; pass --depth >= {_STAGES.value - 1}.")
    comp = compensation(_COMPENSATION)
    from hetpipe_tf.cluster.local import configure_logical_devices
    configure_logical_devices(4)
    logging.set_verbosity(logging.WARNING)   # the strategy logs every plan at INFO
    import keras
    op_threads(_INTRA.value, 6)
    from hetpipe_tf.cluster.spec import Cluster
    from hetpipe_tf.models import dense_stack
    devices = [d.tf_device for d in Cluster.local(["LOCAL_CPU"] * 4).devices]

    keras.utils.set_random_seed(0)
    weights = dense_stack(_DEPTH.value, _WIDTH.value, "xla").get_weights()
    settings = [_setting(jit, devices, comp, weights) for jit in (False, True)]
    try:
        for s in settings:
            s.fit(_WARMUP.value)
        for _ in range(_REPEATS.value):
            for s in settings:
                s.epoch()
        off, on = settings
        dw = _max_dw(off.model.get_weights(), on.model.get_weights())
    finally:
        for s in settings:
            s.strategy.close()

    schedule = _SCHEDULE.value + (f", {_MICRO.value} micro-batches"
                                  if _SCHEDULE.value != "hetpipe" else f", N_m={_N_M.value}")
    print(f"XLA per stage: {_DEPTH.value} x Dense({_WIDTH.value}) + Dense(10), batch "
          f"{_BATCH.value}, {_STAGES.value} stage(s) (even split, one logical CPU device each, "
          f"{_INTRA.value} intra-op thread(s)), {schedule}, compensation {getattr(comp, 'value', 'default')}; "
          f"fastest of {_REPEATS.value} epochs of {_STEPS.value} minibatches after "
          f"{_WARMUP.value} warm-up minibatches.")
    rows = [("jit_compile", "samples/s", "ms/minibatch", "CPU ms/minibatch")]
    rows += [(str(s.jit), f"{s.rate:.0f}", f"{s.ms:.2f}", f"{s.cpu_ms:.2f}") for s in settings]
    print(markdown_table(rows))
    print(f"XLA on / off: throughput {on.rate / off.rate:.2f}x, CPU time per minibatch "
          f"{on.cpu_ms / off.cpu_ms:.2f}x")
    steps = _WARMUP.value + _REPEATS.value * _STEPS.value
    print(f"max |dw| between the two models after the same {steps} minibatches: {dw:.3g}")


if __name__ == "__main__":
    run(main)
