r"""HetSeq mode on logical CPU devices, one of them EMULATED slower: samples/s of shares by
speed against equal shares and against MirroredStrategy, in one run.

  python -m benchmarks.hetseq_benchmark            # small_cnn, 4 devices, the last at 0.5x
  python -m benchmarks.hetseq_benchmark --model=mlp --input_size=512 --batch_size=2048

Rows (each a warm-up fit, then fits of 1 + --steps minibatches of --batch_size, timed from
the end of the first step to the end of the epoch, repeated --repeats times, interleaved;
the best of each is printed):

1. HetSeq, shares by speed: `HetPipeStrategy(cluster, data_parallel="hetseq")` on devices
   EMULATED at --base_speed x --speed_factors. The planner profiles the model and prints
   the shares it chose. Emulation (--emulation=speeds, docs/hetseq.md): the 4 logical
   devices share this machine's 2 cores and start their shares together, so each one's
   measured time is inflated by the others' work, unevenly, and the library's rule (sleep
   (1/f - 1) x the measured time) multiplies that. Here every share instead takes
   per-sample time x share / factor: the per-sample time is measured once, as K / the
   samples/s of row 4 (all devices working at once, at real speed), and is the same for
   every row; base_speed 0.5 keeps even the fast devices' emulated time above their real
   work (the overruns are counted and printed).
2. HetSeq, equal shares: the same executor and emulation, shares=[N/K] * K. Row 1 / row 2
   is what choosing shares by speed buys (the issue's goal: >= 1.3x at 0.5x).
3. HetSeq, equal shares, every device at the base speed: the cluster without the slow
   device (what the shares by speed can at best approach: 3.5 / 4 of it).
4. HetSeq, equal shares, every device at real speed (factors 1).
5. tf.distribute.MirroredStrategy on the same logical devices, equal split, at real speed:
   TensorFlow cannot be told to slow one replica down, so it is compared with row 4 (same
   devices, same speed, same equal split: the two executors' own costs), and on the
   emulated cluster it is ESTIMATED as row 2 x (row 5 / row 4): an equal split waits for
   the slow device whoever runs it.

With --split_wsp two more rows, both under the library's own emulation (each stage sleeps
(1/f - 1) x its measured time; no per-sample calibration, so they are compared only with
each other):

6. HetSeq, shares by speed, synchronous (clock_distance 0).
7. `data_parallel="wsp_split"` at D = 0 with one one-stage plan a device (`even_plan`,
   no predicted times: shares by the emulated factors, the same as row 6's): one-device
   virtual workers under WSP with split batches (ps/split.py), in lockstep (what the
   parameter-server path costs or saves against HetSeq's executor).
8. `data_parallel="hetseq", clock_distance=1`: the same, up to one wave apart. Row 8 /
   row 7 is what bounded staleness buys, row 8 / row 6 the two modes against each other.

The logical devices share this machine's cores (2 here), so K devices computing at once
do not run K times faster than one: the ratios, not absolute figures, carry over.
"""

from __future__ import annotations

import os

os.environ.setdefault("TF_CPP_MIN_LOG_LEVEL", "3")

import time  # noqa: E402

from absl import app, flags  # noqa: E402

from benchmarks._cli import run, speed_factors_flag  # noqa: E402
from hetpipe_tf.model_names import MODEL_NAMES  # noqa: E402

_MODEL = flags.DEFINE_enum("model", "small_cnn", MODEL_NAMES, "Model.")
_INPUT_SIZE = flags.DEFINE_integer("input_size", 0, "Features of mlp / image side; 0 = the "
                                   "model's default.", lower_bound=0)
_NUM_CLASSES = flags.DEFINE_integer("num_classes", 10, "Output classes.", lower_bound=2)
_BATCH_SIZE = flags.DEFINE_integer("batch_size", 256, "Global batch size.", lower_bound=1)
_SPEED = speed_factors_flag(["1", "1", "1", "0.5"], "EMULATED speed factor per logical CPU "
                            "device (1 = real speed).")
_BASE = flags.DEFINE_float(
    "base_speed", 0.5, "Every device's EMULATED speed is base_speed x its --speed_factors "
    "entry, so that even the fast devices' emulated time exceeds their real work (which "
    "then never shows through).", lower_bound=0.01, upper_bound=1.0)
_EMULATION = flags.DEFINE_enum(
    "emulation", "speeds", ["speeds", "measured"], "How a device is EMULATED slower: "
    "'speeds': each share takes per-sample time x share / factor, the per-sample time "
    "measured once (the equal split at real speed, all devices working at once) and the "
    "same for every row, whatever the shared cores do to its real work; 'measured': the "
    "library's default, it sleeps (1/f - 1) x its measured time, which the logical devices "
    "sharing this machine's cores inflate unevenly.")
_SPLIT_WSP = flags.DEFINE_bool(
    "split_wsp", False, "Also time rows 6-8: synchronous HetSeq against WSP with split "
    "batches at D = 0 and 1, both under the library's measured-time emulation.")
_STEPS = flags.DEFINE_integer("steps", 30, "Timed minibatches per fit.", lower_bound=1)
_REPEATS = flags.DEFINE_integer("repeats", 3, "Timed fits per row (best kept).",
                                lower_bound=1)


def _model():
    from hetpipe_tf import models

    return models.build_model(_MODEL.value, input_size=_INPUT_SIZE.value or None,
                              num_classes=_NUM_CLASSES.value)


def _compiled(keras, scope):
    with scope:
        model = _model()
        model.compile(keras.optimizers.SGD(0.01), "sparse_categorical_crossentropy")
    return model


def _timed(model, ds) -> float:
    """Samples/s of the steps after a fit's first one, to the end of its epoch (the
    executor drained): a fit's own start (iterators, callbacks) is left out for every row."""
    import keras

    marks = {}

    class Clock(keras.callbacks.Callback):
        def on_train_batch_end(self, batch, logs=None):
            if batch == 0:
                marks["start"] = time.perf_counter()

        def on_epoch_end(self, epoch, logs=None):   # after Keras read (drained) the metrics
            marks["end"] = time.perf_counter()

    model.fit(ds, epochs=1, steps_per_epoch=_STEPS.value + 1, verbose=0, callbacks=[Clock()])
    return _STEPS.value * _BATCH_SIZE.value / (marks["end"] - marks["start"])


def main(argv: list[str]) -> None:
    if len(argv) > 1:
        raise app.UsageError(f"Unexpected positional arguments. Received: {argv[1:]}.")
    relative = [float(v) for v in _SPEED.value]
    factors = [_BASE.value * f for f in relative]
    k = len(factors)
    if _BATCH_SIZE.value % k:
        raise app.UsageError(
            "Equal shares and MirroredStrategy split the batch evenly over the devices. "
            f"Received: --batch_size={_BATCH_SIZE.value} for {k} devices; use a multiple of "
            f"{k}.")
    from hetpipe_tf.cluster.local import configure_logical_devices
    configure_logical_devices(k)
    import keras
    import tensorflow as tf

    from hetpipe_tf.cluster.spec import Cluster
    from hetpipe_tf.models import random_inputs
    from hetpipe_tf.partitioner.shares import DeviceSpeed
    from hetpipe_tf.strategy import HetPipeStrategy, even_plan

    emulated = Cluster.local(["LOCAL_CPU"] * k, emulated_speed_factors=factors)
    real = Cluster.local(["LOCAL_CPU"] * k)   # every device at real speed
    print(emulated.describe())
    equal = [_BATCH_SIZE.value // k] * k
    tf.get_logger().setLevel("ERROR")   # MirroredStrategy logs every reduction at INFO
    rows = {
        "HetSeq, shares by speed (emulated)": HetPipeStrategy(emulated, data_parallel="hetseq"),
        "HetSeq, equal shares (emulated)": HetPipeStrategy(emulated, data_parallel="hetseq",
                                                           shares=equal),
        "HetSeq, equal shares (emulated, none slower)": HetPipeStrategy(
            Cluster.local(["LOCAL_CPU"] * k, emulated_speed_factors=[_BASE.value] * k),
            data_parallel="hetseq", shares=equal),
        "HetSeq, equal shares, all at real speed": HetPipeStrategy(
            real, data_parallel="hetseq", shares=equal),
        "MirroredStrategy, all at real speed": tf.distribute.MirroredStrategy(
            [d.tf_device for d in real.devices]),
    }
    measured = set()   # rows under the library's own (measured-time) emulation
    if _SPLIT_WSP.value:
        measured = {"HetSeq, by speed, D=0 (measured emulation)",
                    "WSP split batches, D=0 (measured emulation)",
                    "WSP split batches, D=1 (measured emulation)"}
        rows["HetSeq, by speed, D=0 (measured emulation)"] = HetPipeStrategy(
            emulated, data_parallel="hetseq")
        rows["WSP split batches, D=0 (measured emulation)"] = HetPipeStrategy(
            plan=lambda m: [even_plan(m, [d.tf_device], n_m=1,   # one VW a device
                                      speed_factors=[d.emulated_speed_factor])
                            for d in emulated.devices],
            data_parallel="wsp_split", compensation="none")   # named: no staleness at D=0
        rows["WSP split batches, D=1 (measured emulation)"] = HetPipeStrategy(
            emulated, data_parallel="hetseq", clock_distance=1)
    fitted = {}
    for name, strategy in rows.items():
        model = _compiled(keras, strategy.scope())
        ds = random_inputs(model, _BATCH_SIZE.value, _NUM_CLASSES.value)
        print(f"\n{name}: first step (tracing; the shares are printed)")
        model.fit(ds, epochs=1, steps_per_epoch=1, verbose=0)
        fitted[name] = (model, ds)
    by_speed = rows["HetSeq, shares by speed (emulated)"]
    model = fitted["HetSeq, shares by speed (emulated)"][0]
    shares = by_speed.executor(model).shares
    # Calibration: seconds a device takes per sample at real speed when all K work at once
    # (their shares start together and share the cores): K / samples per second of the
    # equal split at real speed. The emulated devices take that / their factor.
    real_model, real_ds = fitted["HetSeq, equal shares, all at real speed"]
    real_model.fit(real_ds, epochs=1, steps_per_epoch=2, verbose=0)
    per_sample = k / _timed(real_model, real_ds)
    executors = {}
    for name, strategy in rows.items():
        if isinstance(strategy, HetPipeStrategy) and name not in measured:
            ex = strategy.executor(fitted[name][0])
            executors[name] = ex
            if (_EMULATION.value == "speeds"
                    and min(s.emulated_speed_factor for s in ex.stages) < 1):
                ex.emulate_speeds = tuple(
                    DeviceSpeed(s.device, per_sample / s.emulated_speed_factor)
                    for s in ex.stages)
    for model, ds in fitted.values():
        model.fit(ds, epochs=1, steps_per_epoch=2, verbose=0)   # warm-up
    for ex in executors.values():
        for s in ex.stages:
            s.emulation_overruns = 0
    best = {name: 0.0 for name in rows}
    for _ in range(_REPEATS.value):   # interleaved, so drifts of the machine hit every row
        for name, (model, ds) in fitted.items():
            best[name] = max(best[name], _timed(model, ds))
    print(f"\n{_MODEL.value}, global batch {_BATCH_SIZE.value}, {k} logical CPU devices, "
          f"relative speeds {relative}, EMULATED speed factors {factors} (base "
          f"{_BASE.value:g}), best of {_REPEATS.value} x {_STEPS.value} steps:")
    print(f"shares chosen by speed: {list(shares.sizes)} (equal: {equal}); emulation: "
          f"{_EMULATION.value}" + (f", {per_sample * 1e3:.3f} ms a sample at real speed "
                                   "(row 4, all devices at once)"
                                   if _EMULATION.value == "speeds" else ""))
    for name, v in best.items():
        print(f"  {name:46} {v:9.1f} samples/s")
    a, b = best["HetSeq, shares by speed (emulated)"], best["HetSeq, equal shares (emulated)"]
    ideal = best["HetSeq, equal shares (emulated, none slower)"]
    c = best["HetSeq, equal shares, all at real speed"]
    m = best["MirroredStrategy, all at real speed"]
    print(f"shares by speed / equal shares, emulated: {a / b:.2f}x (goal >= 1.3x; the "
          f"devices' speeds bound it by {sum(relative) / (k * min(relative)):.2f}x); "
          f"of the cluster without the slow device: {a / ideal:.2f}")
    for name, ex in executors.items():
        over = sum(s.emulation_overruns for s in ex.stages)
        if ex.emulate_speeds is not None and over:
            print(f"  note: {name}: in {over} device tasks the real work outlasted the "
                  "emulated time (their time shows through; lower --base_speed)")
    print(f"HetSeq / MirroredStrategy, both equal shares, every device at real speed: "
          f"{c / m:.2f}x")
    print(f"HetSeq by speed (emulated) / MirroredStrategy on the emulated cluster, estimated "
          f"as HetSeq's equal shares there x (MirroredStrategy / HetSeq at real speed): "
          f"{(a / b) * (c / m):.2f}x")
    if measured:
        sync, d0, d1 = (best[n] for n in sorted(measured))
        print(f"Under the measured-time emulation, same shares: WSP split batches at D=1 / "
              f"synchronous HetSeq {d1 / sync:.2f}x; at D=0 / synchronous HetSeq "
              f"{d0 / sync:.2f}x; D=1 / D=0 {d1 / d0:.2f}x")
    for s in rows.values():
        if isinstance(s, HetPipeStrategy):
            s.close()


if __name__ == "__main__":
    run(main)
