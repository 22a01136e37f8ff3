r"""WSP freshness: accuracy of two virtual workers with and without fresh pulls.

  python -m experiments.wsp_freshness
  python -m experiments.wsp_freshness --optimizers=sgd,momentum,adam --distances=0,4,32

Trains a digits-like MLP (64 -> 64 -> 64 -> 10) with 2 virtual workers x 2 stages on 4
logical CPU devices, N_m = 2, under WSP with clock distance D (--compensation, by default
none: the paper's rules), once with `fresh_pulls` off ("before": a VW pulls only at wave
ends with clock c >= D, and at run starts) and once on ("after": at every wave end it also
takes whatever newer w_global the servers hold, without waiting), beside plain Keras on
one device from the same initial weights.
Clocks continue across epochs in both (docs/wsp.md). Prints one row per setting: final
test accuracy, pulls taken without waiting, the largest clock distance and the time
spent waiting for other VWs' waves. An optimizer that fails prints its error in its row.

The data are SYNTHETIC (scikit-learn's digits are not assumed installed and
keras.datasets downloads): 1797 8x8 images of 10 classes, each a fixed pattern of three
strokes, shifted by up to 2 pixels, scaled and noised (plain Keras SGD reaches about 0.96
in 10 epochs, as on the real digits).
"""

from __future__ import annotations

import os

os.environ.setdefault("TF_CPP_MIN_LOG_LEVEL", "3")

import re  # noqa: E402
import time  # noqa: E402

from absl import app, flags, logging  # noqa: E402

from experiments import _study  # noqa: E402

OPTIMIZERS = {   # name -> (Keras class name, keyword arguments)
    "sgd": ("SGD", {"learning_rate": 0.1}),
    "momentum": ("SGD", {"learning_rate": 0.02, "momentum": 0.9}),
    "adam": ("Adam", {"learning_rate": 2e-3}),
}

_OPTIMIZERS = flags.DEFINE_list("optimizers", ["sgd", "momentum", "adam"],
                                f"Optimizers to compare, from {sorted(OPTIMIZERS)}.")
_DISTANCES = flags.DEFINE_list("distances", ["0", "4", "32"], "Clock distances D.")
_EPOCHS = flags.DEFINE_integer("epochs", 10, "Training epochs.", lower_bound=1)
_BATCH_SIZE = flags.DEFINE_integer("batch_size", 32, "Minibatch size.", lower_bound=1)
_EXAMPLES = flags.DEFINE_integer("examples", 1797, "Generated examples (80% train, 20% "
                                 "test).", lower_bound=10)
_NM = flags.DEFINE_integer("nm", 2, "Minibatches in flight N_m per virtual worker.",
                           lower_bound=1)
_NOISE = flags.DEFINE_float("noise", 0.2, "Pixel noise of the synthetic digits.",
                            lower_bound=0.0)
_SEED = flags.DEFINE_integer("seed", 0, "Seed of the data; repeat r draws the initial "
                             "weights and the shuffling from seed + r.")
_COMPENSATION = flags.DEFINE_string(
    "compensation", "none", "Staleness compensation of the HetPipe rows: a hetpipe_tf "
    "Compensation name (docs/convergence.md). Default none: the paper's rules.")
_REPEATS = flags.DEFINE_integer("repeats", 3, "Trainings per setting (the VWs' interleaving "
                                "is not deterministic: one run says little).", lower_bound=1)

VWS, STAGES = 2, 2


@flags.validator("optimizers", message=f"--optimizers must name at least one of "
                 f"{sorted(OPTIMIZERS)}, e.g. --optimizers=sgd,adam.")
def _check_optimizers(values: list[str]) -> bool:
    return bool(values) and all(v in OPTIMIZERS for v in values)


@flags.validator("distances", message="--distances must be integers >= 0, e.g. "
                 "--distances=0,4,32.")
def _check_distances(values: list[str]) -> bool:
    return bool(values) and all(v.isdigit() for v in values)


def _train(name, weights0, train, test, strategy=None) -> dict:
    """Final test accuracy (and WSP figures) of one setting, or the error if it failed;
    `train()` makes the dataset."""
    t0 = time.perf_counter()
    row: dict = {}
    try:
        with _study.compiled(_build_model, OPTIMIZERS[name],
                             weights0, strategy) as model:
            model.fit(train(), epochs=_EPOCHS.value, shuffle=False, verbose=0)
            row["accuracy"] = model.evaluate(*test, verbose=0)[1]
            if strategy is not None:
                coord = strategy.coordinator(model)
                row["fresh"] = sum(s.fresh_pull_count for s in coord.syncs)
                row["spread"] = coord.servers.max_clock_distance
                row["wait"] = sum(s.wait_s for s in coord.syncs)
                row["clocks"] = coord.servers.clocks
    except Exception as e:  # noqa: BLE001 - printed in the row, the other rows go on
        row["error"] = _cause(e)
    row["seconds"] = time.perf_counter() - t0
    return row


def _build_model():
    from hetpipe_tf import models

    return models.digits_mlp((64, 64))   # 64 -> 64 -> 64 -> 10


def _cause(e: BaseException) -> str:
    """The innermost 'SomeError: message' line of an error (a stage's error reaches fit
    wrapped in a graph-execution error whose first line says nothing)."""
    text = f"{type(e).__name__}: {e}".replace("\\n", "\n")
    found = re.findall(r"\b(\w+(?:Error|Exception): [^\n]+)", text)
    return (found[-1] if found else text.splitlines()[0]).strip(" '\")")[:140]


def _summary(label: str, rows: list[dict]) -> str:
    """One table row over the repeats of a setting."""
    failed = [r for r in rows if "error" in r]
    if failed:
        return f"{label:<24} FAILED {failed[0]['error']}"
    acc = [r["accuracy"] for r in rows]
    line = (f"{label:<24} {sum(acc) / len(acc):>8.3f} {min(acc):>6.3f} {max(acc):>6.3f} "
            f"{sum(r['seconds'] for r in rows):>6.0f}")
    if "fresh" in rows[0]:
        line += (f"  {round(sum(r['fresh'] for r in rows) / len(rows)):>11} "
                 f"{max(r['spread'] for r in rows):>8} "
                 f"{sum(r['wait'] for r in rows) / len(rows):>6.1f}  "
                 f"{','.join(map(str, rows[-1]['clocks']))}")
    return line


def main(argv: list[str]) -> int:
    if len(argv) > 1:
        raise app.UsageError(f"Unexpected arguments: {argv[1:]}")
    from hetpipe_tf.pipeline.compensation import Compensation

    try:
        comp = Compensation.parse(_COMPENSATION.value)
    except ValueError as e:
        raise app.UsageError(f"--compensation: {e}") from None
    logging.set_verbosity(logging.ERROR)   # the VWs' plans and retracing notes: not news here
    from hetpipe_tf.cluster.local import configure_logical_devices

    devices = configure_logical_devices(VWS * STAGES)
    import keras
    import tensorflow as tf

    from hetpipe_tf import HetPipeStrategy, models
    from hetpipe_tf.strategy import even_plan

    n = _EXAMPLES.value
    x, y = models.synthetic_digits(n, _SEED.value, _NOISE.value)
    split = int(0.8 * n)
    test = (x[split:], y[split:])
    # Repeat r: initial weights and shuffling from seed + r, the same for every setting.
    repeats = []
    for r in range(_REPEATS.value):
        keras.utils.set_random_seed(_SEED.value + r)
        probe = _build_model()

        def train(seed=_SEED.value + r):
            # A new dataset per training: every setting sees the same epoch orders (a
            # reused one would continue its reshuffling sequence).
            return (tf.data.Dataset.from_tensor_slices((x[:split], y[:split]))
                    .shuffle(split, seed=seed)
                    .batch(_BATCH_SIZE.value, drop_remainder=True))  # HetPipe: equal batches

        repeats.append((probe.get_weights(), train))
    distances = [int(d) for d in _DISTANCES.value]
    print(f"Synthetic digits (not scikit-learn's): {split} train / {n - split} test examples, "
          f"batch {_BATCH_SIZE.value} ({split // _BATCH_SIZE.value} minibatches per epoch "
          f"over all VWs), {_EPOCHS.value} epochs, {_REPEATS.value} repeat(s) (seeds "
          f"{_SEED.value}..{_SEED.value + _REPEATS.value - 1}); {VWS} VWs x {STAGES} stages "
          f"on {devices[:VWS * STAGES]}, N_m={_NM.value}, compensation {comp.value}.\n"
          "before = fresh_pulls=False, after = fresh_pulls=True (clocks continue across "
          "epochs in both); accuracy = mean over repeats, min, max; fresh_pulls = pulls at "
          "wave ends with c < D per training; max_dist = largest clock spread.")
    header = (f"{'setting':<24} {'accuracy':>8} {'min':>6} {'max':>6} {'time_s':>6}  "
              f"{'fresh_pulls':>11} {'max_dist':>8} {'wait_s':>6}  clocks")
    for name in _OPTIMIZERS.value:
        print(f"\n--optimizer={name} ({OPTIMIZERS[name][0]} {OPTIMIZERS[name][1]})")
        print(header)
        rows = [_train(name, w0, train, test) for w0, train in repeats]
        print(_summary("plain Keras (1 device)", rows), flush=True)
        for d in distances:
            for fresh in (False, True):
                rows = []
                for w0, train in repeats:
                    plans = [even_plan(probe, devices[w * STAGES:(w + 1) * STAGES],
                                       n_m=_NM.value) for w in range(VWS)]
                    strategy = HetPipeStrategy(plan=plans, clock_distance=d,
                                               fresh_pulls=fresh, compensation=comp)
                    rows.append(_train(name, w0, train, test, strategy))
                    if "error" in rows[-1]:
                        break
                label = f"D={d} {'after' if fresh else 'before'}"
                print(_summary(label, rows), flush=True)
    return 0


if __name__ == "__main__":
    app.run(main)
