r"""Memory soak: the process RSS over a long training of a tiny model with HetPipeStrategy.

  python -m benchmarks.soak                       # 15,000 minibatches, 1 VW x 2 stages
  python -m benchmarks.soak --virtual_workers=2   # 2 VWs x 2 stages (4 logical CPUs), WSP

Trains 2 x Dense(8) (batch 8, SGD, regression on a fixed random set) for --minibatches
minibatches as epochs of --chunk steps (every epoch end drains the pipeline: a run
boundary) and reads the process' resident set size (VmRSS of /proc/self/status) after
every epoch. Prints the setting, the RSS after warm-up (the first epoch end at or after
--warmup minibatches: TensorFlow's traces and allocator pools are made by then), in the
middle, when the runtime's record windows are full (virtual_workers x 10,000 minibatches,
if reached) and at the end, the growth per 1,000 minibatches between these points, every
epoch end's reading, and how many parameter-server pushes were recorded and kept (2 VWs).
One run on whatever machine runs it (a shared 2-core VM for the figures in
docs/observe.md): RSS moves with the allocator, so read small differences as noise.
"""

from __future__ import annotations

import os

os.environ.setdefault("TF_CPP_MIN_LOG_LEVEL", "3")

import time  # noqa: E402

from absl import app, flags, logging  # noqa: E402

from benchmarks._cli import compensation, compensation_flag, run  # noqa: E402

_MINIBATCHES = flags.DEFINE_integer("minibatches", 15_000, "Minibatches to train (Keras "
                                    "steps, over all virtual workers).", lower_bound=1)
_CHUNK = flags.DEFINE_integer("chunk", 500, "Minibatches per epoch (steps_per_epoch); "
                              "the RSS is read at every epoch end.", lower_bound=1)
_WARMUP = flags.DEFINE_integer("warmup", 1_000, "Minibatches before the baseline RSS "
                               "reading.", lower_bound=1)
_VWS = flags.DEFINE_integer("virtual_workers", 1, "Virtual workers of 2 stages each: 1 "
                            "(one pipeline, no parameter servers) or 2 (WSP through "
                            "parameter servers).", lower_bound=1, upper_bound=2)
_NM = flags.DEFINE_integer("nm", 2, "Minibatches in flight N_m per virtual worker.",
                           lower_bound=1)
_D = flags.DEFINE_integer("clock_distance", 1, "WSP clock distance D (2 virtual workers).",
                          lower_bound=0)
_COMPENSATION = compensation_flag("none")
_BATCH_SIZE = flags.DEFINE_integer("batch_size", 8, "Minibatch size.", lower_bound=1)

STAGES = 2
WIDTH = 8


@flags.multi_flags_validator(["minibatches", "chunk", "warmup"], message=(
    "--minibatches must be a multiple of --chunk and leave at least two epochs after "
    "--warmup, e.g. --minibatches=15000 --chunk=500 --warmup=1000."))
def _check_lengths(values: dict) -> bool:
    n, chunk, warmup = values["minibatches"], values["chunk"], values["warmup"]
    return n % chunk == 0 and n - _round_up(warmup, chunk) >= 2 * chunk


def _round_up(n: int, step: int) -> int:
    return -(-n // step) * step


def rss_kib() -> int:
    """Resident set size of this process in KiB (VmRSS of /proc/self/status)."""
    with open("/proc/self/status") as f:
        for line in f:
            if line.startswith("VmRSS:"):
                return int(line.split()[1])
    raise OSError("/proc/self/status has no VmRSS line (not Linux?); this benchmark reads "
                  "the RSS from it.")


def _per_1000(a: tuple[int, int], b: tuple[int, int]) -> float:
    """RSS growth in KiB per 1,000 minibatches between two (minibatches, KiB) readings."""
    return (b[1] - a[1]) / (b[0] - a[0]) * 1000 if b[0] > a[0] else 0.0


def build_model():
    import keras

    return keras.Sequential([keras.Input((WIDTH,), name="x"),
                             keras.layers.Dense(WIDTH, activation="tanh", name="d1"),
                             keras.layers.Dense(WIDTH, name="d2")], name="soak")


def main(argv: list[str]) -> int:
    if len(argv) > 1:
        raise app.UsageError(f"Unexpected arguments: {argv[1:]}")
    rss_kib()   # fail early off Linux
    comp = compensation(_COMPENSATION)
    logging.set_verbosity(logging.ERROR)   # the VWs' plans: not news here
    from hetpipe_tf.cluster.local import configure_logical_devices

    vws = _VWS.value
    devices = configure_logical_devices(vws * STAGES)
    import keras
    import numpy as np
    import tensorflow as tf

    from hetpipe_tf import HetPipeStrategy
    from hetpipe_tf.pipeline.window import DEFAULT_HISTORY
    from hetpipe_tf.strategy import even_plan

    keras.utils.set_random_seed(0)
    batch, chunk, n = _BATCH_SIZE.value, _CHUNK.value, _MINIBATCHES.value
    rs = np.random.RandomState(0)
    x = rs.randn(64 * batch, WIDTH).astype("float32")
    y = np.tanh(x[:, ::-1]).astype("float32")
    data = (tf.data.Dataset.from_tensor_slices((x, y)).batch(batch, drop_remainder=True)
            .repeat())
    probe = build_model()
    plans = [even_plan(probe, devices[w * STAGES:(w + 1) * STAGES], n_m=_NM.value)
             for w in range(vws)]
    strategy = HetPipeStrategy(plan=plans if vws > 1 else plans[0], clock_distance=_D.value,
                               compensation=comp)
    with strategy.scope():
        model = build_model()
        model.compile(keras.optimizers.SGD(0.01), "mse")

    readings: list[tuple[int, int]] = []   # (minibatches done, RSS KiB) at every epoch end
    steps = {"done": 0}

    def on_epoch_end(epoch, logs=None):
        steps["done"] += chunk
        readings.append((steps["done"], rss_kib()))

    setting = (f"{vws} VW(s) x {STAGES} stages on {', '.join(devices[:vws * STAGES])}, "
               f"N_m={_NM.value}" + (f", D={_D.value}" if vws > 1 else "") +
               f", compensation {comp.value}" +
               f"; model 2 x Dense({WIDTH}), batch {batch}, SGD; {n:,} minibatches as "
               f"{n // chunk} epochs of {chunk}")
    print(f"Memory soak: {setting}.")
    print("One run on this machine (the figures in docs/observe.md: a shared 2-core VM); "
          f"RSS = VmRSS of /proc/self/status, read at every epoch end. Start: "
          f"{rss_kib() / 1024:.1f} MiB.", flush=True)
    t0 = time.perf_counter()
    with strategy:
        model.fit(data, epochs=n // chunk, steps_per_epoch=chunk, verbose=0, shuffle=False,
                  callbacks=[keras.callbacks.LambdaCallback(on_epoch_end=on_epoch_end)])
        seconds = time.perf_counter() - t0
        coord = strategy.coordinator(model)
        # (appended, kept): len() of a window counts every append, iteration the kept
        pushes = None if coord is None else (len(coord.servers.pushes),
                                             sum(1 for _ in coord.servers.pushes))
        updates = int(model.optimizer.iterations.numpy())

    warm = next(r for r in readings if r[0] >= _WARMUP.value)
    middle = min(readings, key=lambda r: abs(r[0] - (warm[0] + n) / 2))
    end = readings[-1]
    # Each VW's per-minibatch records are windows of DEFAULT_HISTORY of ITS minibatches
    # (a VW runs 1/vws of them): they stop growing after vws * DEFAULT_HISTORY minibatches,
    # so growth after that point is what is left.
    filled = vws * DEFAULT_HISTORY
    full = next((r for r in readings if r[0] >= max(filled, warm[0])), None)
    points = [("warm-up", warm), ("middle", middle)]
    if full is not None and full[0] < end[0] and full != middle:
        points.append((f"windows full ({filled:,})", full))
    points.append(("end", end))
    print(f"{'point':<24} {'minibatches':>11} {'RSS_MiB':>9}")
    for label, (done, kib) in sorted(points, key=lambda p: p[1][0]):
        print(f"{label:<24} {done:>11,} {kib / 1024:>9.1f}")
    print(f"growth per 1,000 minibatches, warm-up -> end: {_per_1000(warm, end):+.1f} KiB "
          f"({(end[1] - warm[1]) / 1024:+.1f} MiB over {end[0] - warm[0]:,} minibatches)")
    for (la, a), (lb, b) in zip(points, points[1:]):
        print(f"  {la} -> {lb}: {_per_1000(a, b):+.1f} KiB per 1,000 minibatches")
    print("RSS (MiB) at every epoch end: " +
          " ".join(f"{kib / 1024:.1f}" for _, kib in readings))
    print(f"updates applied: {updates:,}; {seconds:.0f} s ({seconds / n * 1e3:.1f} ms per "
          "minibatch)")
    if pushes is not None:
        print(f"ParameterServers.pushes: {pushes[0]:,} appended, {pushes[1]:,} kept")
    return 0


if __name__ == "__main__":
    run(main)
