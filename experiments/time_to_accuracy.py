r"""Time to accuracy on THIS machine: HetPipe against synchronous data parallelism, with
and without staleness compensation (issue 20; docs/convergence.md).

--mode=time measures wall-clock seconds of the runtime on this machine's CPUs with a slow
device EMULATED by sleeping: the runtime's cost here, not what HetPipe promises on real
heterogeneous GPUs. Time to accuracy on the paper's cluster, in the cluster model's
virtual time: experiments/paper_time_to_accuracy.py (docs/time_to_accuracy.md).

  python -m experiments.time_to_accuracy --quick        # a few minutes on 2 cores
  python -m experiments.time_to_accuracy                # the whole table
  python -m experiments.time_to_accuracy --mode=gap     # accuracy at equal epochs (issue's table)
  python -m experiments.time_to_accuracy --mode=cost    # compensation's cost per minibatch
  python -m experiments.time_to_accuracy --mode=recurrent   # the default on LSTM / GRU models

--mode=time (the default) prints ONE table from one run, per task: wall-clock seconds and
epochs to --target validation accuracy, and the final accuracy, for
  - plain Keras on one device (the reference; not slowed),
  - synchronous data parallelism with equal batches on the emulated cluster: 4 VWs x 1
    stage at N_m = 1, D = 0 (exactly synchronous SGD over 4 workers; the slow device holds
    every step back): as WSP sums the VWs' updates, at 4x the rate (Horovod's linear
    scaling rule), and, with compensation average, MirroredStrategy's averaged step
    (--sync_average_row); the speed-up column is against the faster of the two,
  - HetPipe as the planner configures it (NP allocation: one VW per emulated host, each a
    2-stage pipeline): with the strategy's defaults (no n_m, D or compensation given: the
    row shows the N_m and D they chose), and at N_m = 2 (= min(Max_m, k), the throughput
    default) at D = 0, 4, 32 for every --compensations value, and at N_m = 1 with
    compensation none and average,
  - the synchronous schedules GPipe and 1F1B (--schedules, M = --micro_batches) on the
    same 2 VWs at each D, and HetSeq (every device the whole model, a share of each batch
    by its speed; one synchronous step per batch).
The cluster is 4 logical CPU devices of this machine on 2 emulated hosts, the last device
EMULATED at 0.5x (its tasks sleep for the extra time); the rows say so. The clock starts
when the first minibatch returned (tracing, planning and profiling are left out of every
row alike) and stops at the epoch end whose validation reached the target; validation
time is not counted. Wall-clock figures on a shared 2-core machine move by 10-20% between
runs: read them as ratios within one run.

--mode=gap prints the issue's accuracy table: the digits MLP (64-128-64-64-10, batch 32,
--epochs 4, the same initial weights and data order), plain Keras against 1 VW x 2 stages
at N_m = 2 and 2 VWs x 2 stages at N_m = 2, D = 4, per optimizer and compensation.

--mode=recurrent prints, for an LSTM seq2seq and a GRU tagger (hetpipe_tf.models) with
RMSprop and Adam, the training loss per epoch plain and on a 2-stage pipeline at N_m = 2
with the default compensation and named ones (--recurrent_settings), `fit` with validation
ending a pipeline run every epoch (experiments/_recurrent.py; --epochs, default 3).

--mode=cost times one stage's weight bookkeeping per minibatch (take a version, apply an
update: what the stage thread does besides the forward and backward) on a Dense stack of
--cost_width x --cost_width layers, at N_m = 2, with each compensation: the difference is
compensation's cost per minibatch and stage.

Tasks: `digits` is scikit-learn's 8x8 digits (load_digits ships inside scikit-learn, no
download; `pip install -e ".[bench]"`); `spirals` is a generated, harder task: four
interleaved spirals of two turns lifted to 16 features (hetpipe_tf.models.spirals, as
benchmarks/train.py's, at --spiral_turns / --spiral_noise), with a residual MLP; plain
Keras needs several epochs to the target 0.95 (at --spiral_turns=2.2 --spiral_noise=0.08,
train.py's task, every row reaches 0.9 in one or two epochs).
"""

from __future__ import annotations

import os

os.environ.setdefault("TF_CPP_MIN_LOG_LEVEL", "3")

import time  # noqa: E402

from absl import app, flags, logging  # noqa: E402

from experiments import _cost, _study  # noqa: E402

OPTIMIZERS = {   # name -> (Keras class name, keyword arguments)
    "momentum": ("SGD", {"learning_rate": 0.05, "momentum": 0.9}),
    "adam": ("Adam", {"learning_rate": 1e-3}),
    "adamw": ("AdamW", {"learning_rate": 1e-3, "weight_decay": 1e-4}),
    "sgd": ("SGD", {"learning_rate": 0.1}),
    # Milder momentum settings, where staleness does not destabilise training and a
    # compensation's cost (a smaller effective step) shows (docs/convergence.md).
    "momentum_mild": ("SGD", {"learning_rate": 0.01, "momentum": 0.9}),
    "nesterov": ("SGD", {"learning_rate": 0.01, "momentum": 0.9, "nesterov": True}),
    "rmsprop_momentum": ("RMSprop", {"learning_rate": 2e-4, "momentum": 0.9}),
    "rmsprop": ("RMSprop", {"learning_rate": 1e-3}),   # Keras' default, no momentum
}
COMPENSATIONS = ("none", "predict", "momentum", "both", "average", "all", "both_dc",
                 "both_ga")
SCHEDULES = ("gpipe", "1f1b")
TASKS = ("digits", "spirals")
RECURRENT = ("seq2seq", "tagger")
SPEED_FACTORS = (1.0, 1.0, 1.0, 0.5)
HOSTS = 2

_MODE = flags.DEFINE_enum("mode", "time", ["time", "gap", "cost", "recurrent"],
                          "time: time to accuracy; gap: accuracy at equal epochs (the "
                          "issue's table); cost: compensation's cost per minibatch; "
                          "recurrent: the compensation default on recurrent models.")
_RECURRENT = flags.DEFINE_list("recurrent_workloads", list(RECURRENT), "--mode=recurrent: "
                               f"workloads, from {RECURRENT}.")
_RECURRENT_OPTIMIZERS = flags.DEFINE_list("recurrent_optimizers", ["rmsprop", "adam"],
                                          "--mode=recurrent: optimizers, from "
                                          f"{sorted(OPTIMIZERS)}.")
_RECURRENT_EXAMPLES = flags.DEFINE_integer("recurrent_examples", 0, "--mode=recurrent: "
                                          "training examples (0: each workload's).",
                                          lower_bound=0)
_RECURRENT_SETTINGS = flags.DEFINE_list(
    "recurrent_settings", ["plain", "default", "none"], "--mode=recurrent: rows: "
    "plain (Keras on one device), default (no compensation given) or compensation names "
    f"from {COMPENSATIONS}.")
_COST_WIDTH = flags.DEFINE_integer("cost_width", 512, "--mode=cost: layer width.",
                                   lower_bound=1)
_COST_LAYERS = flags.DEFINE_integer("cost_layers", 4, "--mode=cost: layers.", lower_bound=1)
_COST_ROUNDS = flags.DEFINE_integer("cost_rounds", 300, "--mode=cost: minibatches per timed "
                                    "round (5 rounds, the median printed).", lower_bound=1)
_QUICK = flags.DEFINE_bool("quick", False, "A few minutes: the digits task only, fewer "
                           "epochs, D in {0, 4}.")
_TASKS = flags.DEFINE_list("tasks", list(TASKS), f"Tasks, from {TASKS}.")
_OPTIMIZERS = flags.DEFINE_list("optimizers", ["momentum", "adam"],
                                f"Optimizers, from {sorted(OPTIMIZERS)}.")
_COMPENSATIONS = flags.DEFINE_list("compensations", ["none", "both", "average", "all"],
                                   f"Compensations of the HetPipe rows, from {COMPENSATIONS} "
                                   "(predict and momentum alone: docs/convergence.md).")
_SCHEDULES = flags.DEFINE_list("schedules", list(SCHEDULES), "--mode=time: rows of these "
                               f"synchronous pipeline schedules, from {SCHEDULES} (2 VWs "
                               "as the planner makes them, each minibatch one step); empty: "
                               "none.")
_MICRO = flags.DEFINE_integer("micro_batches", 4, "M of the --schedules rows.", lower_bound=1)
_HETSEQ = flags.DEFINE_bool("hetseq_rows", True, "--mode=time: a HetSeq row (every device "
                            "the whole model, a share of each batch by its speed).")
_DEFAULT_ROW = flags.DEFINE_bool("default_row", True, "--mode=time: a row of the strategy "
                                 "with no n_m, clock_distance or compensation (its defaults; "
                                 "the row shows the N_m and D they chose).")
_DISTANCES = flags.DEFINE_list("distances", ["0", "4", "32"], "Clock distances D.")
_EPOCHS = flags.DEFINE_integer("epochs", 0, "Epochs (0: 12 for time, 4 for gap; --quick "
                               "time: 8).", lower_bound=0)
_TARGET = flags.DEFINE_float("target", 0.0, "Target validation accuracy (0: 0.95 for both "
                             "tasks).", lower_bound=0.0)
_BATCH = flags.DEFINE_integer("batch_size", 32, "Minibatch size.", lower_bound=1)
_SEED = flags.DEFINE_integer("seed", 0, "Seed of the initial weights and the data order.")
_WIDTH = flags.DEFINE_integer("width", 0, "Hidden widths x this (digits: 128-64-64; "
                              "spirals: 64): more compute per minibatch against the "
                              "runtime's fixed cost, so the emulated slow device matters. "
                              "0: 1 for --mode=gap (the issue's model), 4 for --mode=time.",
                              lower_bound=0)
_SPIRALS = flags.DEFINE_integer("spiral_examples", 4096, "Generated spirals training "
                                "examples (validation: a quarter as many).", lower_bound=32)
# The spirals' shape: at benchmarks/train.py's 2.2 / 0.08 every row reaches 0.9 within one or
# two epochs, so its seconds are one epoch's, mostly noise. Two turns with less noise need 4-5
# epochs of plain Keras with momentum SGD for 0.95 (docs/convergence.md).
_TURNS = flags.DEFINE_float("spiral_turns", 4.4, "Spirals: radians per unit radius (2.2: "
                            "about one turn, the earlier task; 4.4: two).", lower_bound=0.0)
_NOISE = flags.DEFINE_float("spiral_noise", 0.04, "Spirals: standard deviation of the "
                            "Gaussian noise on each point (the earlier task: 0.08).",
                            lower_bound=0.0)
_SYNC_AVERAGE = flags.DEFINE_bool("sync_average_row", True, "--mode=time: also synchronous "
                                  "DP with averaged updates (MirroredStrategy's step; the "
                                  "plain row sums the 4 VWs' updates); the speed-up column "
                                  "is against the faster of the sync DP rows.")
_NM1 = flags.DEFINE_bool("nm1_rows", True, "--mode=time: also HetPipe at N_m = 1 (no local "
                         "staleness), compensation none and average; --mode=gap: also 2 VWs "
                         "at N_m = 1, D = 4, per compensation.")


def _check(values, allowed) -> bool:
    return bool(values) and all(v in allowed for v in values)


flags.register_validator("tasks", lambda v: _check(v, TASKS), f"--tasks: from {TASKS}.")
flags.register_validator("optimizers", lambda v: _check(v, OPTIMIZERS),
                         f"--optimizers: from {sorted(OPTIMIZERS)}.")
flags.register_validator("compensations", lambda v: _check(v, COMPENSATIONS),
                         f"--compensations: from {COMPENSATIONS}.")
flags.register_validator("recurrent_workloads", lambda v: _check(v, RECURRENT),
                         f"--recurrent_workloads: from {RECURRENT}.")
flags.register_validator("recurrent_optimizers", lambda v: _check(v, OPTIMIZERS),
                         f"--recurrent_optimizers: from {sorted(OPTIMIZERS)}.")
flags.register_validator("recurrent_settings",
                         lambda v: _check(v, ("plain", "default") + COMPENSATIONS),
                         f"--recurrent_settings: plain, default or from {COMPENSATIONS}.")
flags.register_validator("schedules", lambda v: all(x in SCHEDULES for x in v),
                         f"--schedules: from {SCHEDULES}.")
flags.register_validator("distances", lambda v: bool(v) and all(x.isdigit() for x in v),
                         "--distances: integers >= 0, e.g. 0,4,32.")


# --- tasks -------------------------------------------------------------------------------
def load_task(name: str):
    """(x_train, y_train, x_val, y_val, build_model) of a task."""
    from hetpipe_tf import models

    if name == "digits":
        k = _width()
        return (*models.digits(),
                lambda: models.digits_mlp((128 * k, 64 * k, 64 * k)))
    x, y = models.spirals(_SPIRALS.value, seed=0, turns=_TURNS.value, noise=_NOISE.value)
    xv, yv = models.spirals(max(_SPIRALS.value // 4, 8), seed=1, turns=_TURNS.value,
                            noise=_NOISE.value)
    return x, y, xv, yv, lambda: models.spiral_resmlp(64 * _width(), depth=3)


def _width() -> int:
    return _WIDTH.value or (1 if _MODE.value == "gap" else 4)


# --- one training -------------------------------------------------------------------------
def train(task, opt: str, weights0, epochs: int, strategy=None, seed: int = 0) -> dict:
    import tensorflow as tf

    x, y, xv, yv, build = task
    ds = (tf.data.Dataset.from_tensor_slices((x, y)).shuffle(len(x), seed=seed)
          .batch(_BATCH.value, drop_remainder=True))
    val = tf.data.Dataset.from_tensor_slices((xv, yv)).batch(256)
    clock = _study.epoch_clock()
    row: dict = {}
    with _study.compiled(build, OPTIMIZERS[opt], weights0,
                         strategy) as model:
        model.fit(ds, validation_data=val, epochs=epochs, verbose=0, callbacks=[clock])
        row["history"] = clock.history
        if strategy is not None:
            row["n_m"] = strategy.extended.n_m
            row["d"] = strategy.extended.clock_distance
            row["compensation"] = strategy.extended.compensation.value
            row["stages"] = [p.num_stages for p in strategy.plans]
            servers = getattr(strategy.coordinator(model), "servers", None)
            if servers is not None:   # not in HetSeq mode
                row["spread"] = servers.max_clock_distance
    return row


# --- settings ----------------------------------------------------------------------------
def time_settings(cluster, devices, distances, compensations):
    """(label, make strategy or None) of the time table."""
    from hetpipe_tf import HetPipeStrategy
    from hetpipe_tf.strategy import even_plan

    def sync_dp(model_fn, compensation="none"):
        probe = model_fn()
        plans = [even_plan(probe, [d], n_m=1, speed_factors=[f])
                 for d, f in zip(devices, SPEED_FACTORS)]
        return HetPipeStrategy(plan=plans, clock_distance=0, compensation=compensation)

    out = [("plain Keras, 1 device (reference)", None),
           ("sync DP 4 VWs x 1 stage, N_m=1, D=0", sync_dp)]
    if _SYNC_AVERAGE.value:
        # WSP sums the 4 VWs' updates: the row above is synchronous SGD at 4x the rate
        # (the linear scaling rule); AVERAGE makes it MirroredStrategy's averaged step.
        out.append(("sync DP 4 VWs x 1 stage, N_m=1, D=0, averaged",
                    lambda m: sync_dp(m, "average")))
    if _DEFAULT_ROW.value:   # what the strategy picks when the user gives nothing
        out.append(("HetPipe NP 2 VWs (planner), defaults",
                     lambda _m: HetPipeStrategy(cluster, allocation="NP",
                                                num_virtual_workers=2)))
    for d in distances:
        for c in compensations:
            # N_m = 2 = min(Max_m, k), the throughput default (the defaults row shows what
            # the time-to-accuracy rule picks).
            out.append((f"HetPipe NP 2 VWs (planner), N_m=2, D={d}, {c}",
                        lambda _m, d=d, c=c: HetPipeStrategy(
                            cluster, allocation="NP", num_virtual_workers=2, n_m=2,
                            clock_distance=d, compensation=c)))
        for c in (("none", "average") if _NM1.value else ()):
            out.append((f"HetPipe NP 2 VWs (planner), N_m=1, D={d}, {c}",
                        lambda _m, d=d, c=c: HetPipeStrategy(
                            cluster, allocation="NP", num_virtual_workers=2,
                            clock_distance=d, n_m=1, compensation=c)))
    names = {"gpipe": "GPipe", "1f1b": "1F1B"}
    for sched in _SCHEDULES.value:
        for d in distances:
            out.append((f"{names[sched]} NP 2 VWs (planner), M={_MICRO.value}, D={d}",
                        lambda _m, d=d, sched=sched: HetPipeStrategy(
                            cluster, allocation="NP", num_virtual_workers=2,
                            clock_distance=d, schedule=sched,
                            micro_batches=_MICRO.value)))
    if _HETSEQ.value:
        out.append(("HetSeq 4 devices, shares by speed",
                    lambda _m: HetPipeStrategy(cluster, data_parallel="hetseq")))
    return out


def gap_settings(devices, compensations):
    from hetpipe_tf import HetPipeStrategy
    from hetpipe_tf.strategy import even_plan

    out = [("plain Keras", None)]
    for c in compensations:
        out.append((f"1 VW x 2 stages, N_m=2, {c}",
                    lambda m, c=c: HetPipeStrategy(plan=even_plan(m(), devices[:2], n_m=2),
                                                   compensation=c)))
        out.append((f"2 VWs x 2 stages, N_m=2, D=4, {c}",
                    lambda m, c=c: HetPipeStrategy(
                        plan=[even_plan(m(), devices[w * 2:w * 2 + 2], n_m=2)
                              for w in range(2)], clock_distance=4, compensation=c)))
    for c in (compensations if _NM1.value else ()):
        out.append((f"2 VWs x 2 stages, N_m=1, D=4, {c}",
                    lambda m, c=c: HetPipeStrategy(
                        plan=[even_plan(m(), devices[w * 2:w * 2 + 2], n_m=1)
                              for w in range(2)], clock_distance=4, compensation=c)))
    return out


def main(argv: list[str]) -> int:
    if len(argv) > 1:
        raise app.UsageError(f"Unexpected arguments: {argv[1:]}")
    logging.set_verbosity(logging.ERROR)
    from hetpipe_tf.cluster.local import configure_logical_devices
    from hetpipe_tf.cluster.spec import Cluster

    devices = configure_logical_devices(len(SPEED_FACTORS))[:len(SPEED_FACTORS)]
    import keras

    if _MODE.value == "cost":
        print(f"One stage's take + apply per minibatch on {devices[0]}: "
              f"{_COST_LAYERS.value} x ({_COST_WIDTH.value} x {_COST_WIDTH.value}) float32 "
              "weights, SGD momentum 0.9, N_m = 2, a stage of one of 2 VWs (median of 5 x "
              f"{_COST_ROUNDS.value} minibatches).")
        print(_study.markdown_table(_cost.cost_table(
            devices[0], COMPENSATIONS, _COST_WIDTH.value, _COST_LAYERS.value,
            _COST_ROUNDS.value)))
        return 0
    if _MODE.value == "recurrent":
        from experiments import _recurrent

        epochs = _EPOCHS.value or 3
        print(f"2 stages of a planned pipeline on {devices[:2]}, N_m = 2, {epochs} epochs "
              f"with validation (a run boundary at every epoch), seed {_SEED.value}; "
              "training loss per epoch.")
        rows = _recurrent.table(
            _RECURRENT.value, {o: OPTIMIZERS[o] for o in _RECURRENT_OPTIMIZERS.value},
            _RECURRENT_SETTINGS.value, epochs, _SEED.value,
            log=lambda m: print(m, flush=True), examples=_RECURRENT_EXAMPLES.value)
        print(_study.markdown_table(rows))
        return 0
    gap = _MODE.value == "gap"
    tasks = ["digits"] if (_QUICK.value or gap) else _TASKS.value
    distances = [int(d) for d in _DISTANCES.value]
    if _QUICK.value:
        distances = [d for d in distances if d <= 4] or distances[:1]
    epochs = _EPOCHS.value or (4 if gap else (8 if _QUICK.value else 12))
    cluster = Cluster.local(["LOCAL_CPU"] * len(SPEED_FACTORS), hosts=HOSTS,
                            emulated_speed_factors=list(SPEED_FACTORS))
    print("Wall-clock seconds on this machine (the runtime's cost here, with an emulated "
          "slow device; not HetPipe's promise: experiments.paper_time_to_accuracy gives the "
          "paper's cluster in virtual time).")
    print(f"{len(SPEED_FACTORS)} logical CPU devices of this machine on {HOSTS} emulated "
          f"hosts, speed factors {list(SPEED_FACTORS)} (the last EMULATED at 0.5x: its "
          f"tasks sleep); batch {_BATCH.value}, {epochs} epochs, seed {_SEED.value}, "
          f"widths x{_width()}.")
    for task_name in tasks:
        task = load_task(task_name)
        target = _TARGET.value or 0.95
        keras.utils.set_random_seed(_SEED.value)
        weights0 = task[4]().get_weights()
        settings = (gap_settings(devices, _COMPENSATIONS.value) if gap else
                    time_settings(cluster, devices, distances, _COMPENSATIONS.value))
        for opt in _OPTIMIZERS.value:
            print(f"\n{task_name}: {len(task[0])} train / {len(task[2])} validation "
                  f"examples; optimizer {opt} {OPTIMIZERS[opt]}"
                  + ("" if gap else f"; target accuracy {target}"))
            rows = [("setting", "final acc", "gap") if gap else
                    ("setting", "N_m", "s to target", "epochs", "final acc", "speed-up vs "
                     "sync DP", "D")]
            ref_acc, sync_s = None, None
            for label, make in settings:
                t0 = time.perf_counter()
                try:
                    r = train(task, opt, weights0, epochs,
                              None if make is None else make(task[4]), _SEED.value)
                except Exception as e:  # noqa: BLE001 - printed in its row
                    rows.append((label, f"FAILED {type(e).__name__}: {str(e)[:90]}",
                                 *[""] * (len(rows[0]) - 2)))
                    continue
                acc = r["history"][-1][1]
                if ref_acc is None:
                    ref_acc = acc
                if gap:
                    rows.append((label, f"{acc:.3f}", f"{acc - ref_acc:+.3f}"))
                else:
                    s, e = _study.to_target(r["history"], target)
                    if label.startswith("sync DP") and s is not None:
                        sync_s = s if sync_s is None else min(sync_s, s)   # the faster
                    compared = make is not None and not label.startswith("sync DP")
                    speed = f"{sync_s / s:.2f}x" if s and sync_s and compared else ""
                    if label.endswith("defaults"):   # what they chose
                        label += f" ({r.get('compensation')})"
                    rows.append((label, str(r.get("n_m", "-")), _study.cell(s, ".1f"),
                                 _study.cell(e, "d"), f"{acc:.3f}", speed,
                                 str(r.get("d", "-"))))
                logging.info("%s took %.0f s", label, time.perf_counter() - t0)
                print(f"  done: {label} ({time.perf_counter() - t0:.0f} s)", flush=True)
            print(_study.markdown_table(rows), flush=True)
    return 0


if __name__ == "__main__":
    app.run(main)
