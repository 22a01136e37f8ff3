r"""Time to accuracy on the paper's 16-GPU cluster, in virtual time (issue 27 item 3;
docs/time_to_accuracy.md).

  python -m experiments.paper_time_to_accuracy                  # both tasks, every row
  python -m experiments.paper_time_to_accuracy --tiny           # about a minute

For each task (`--tasks`): virtual seconds and epochs to `--target` validation accuracy,
and the final accuracy, on `paper_cluster()` (4 hosts x 4 GPUs: TITAN V, TITAN RTX,
RTX 2060, Quadro P4000), for
  - HetPipe, 4 VWs by NP, ED, ED-local (ED with each stage's parameters on its own host)
    and HD, at each D (`--distances`) and compensation (`--compensations`; "default" = the
    strategy's when none is given): TRAINED under the virtual clock
    (`HetPipeStrategy(plan=plans, clock=VirtualClock(cluster))`): the runtime's numerics
    in the order and at the virtual time of the cluster model (docs/virtual_clock.md);
    plans made against the catalog cluster from the task model's estimated profile;
  - Horovod (16 GPUs, a minibatch each), HetSeq (the same global batch in shares by
    speed), GPipe and 1F1B (the ED VWs, `--micro_batches`, in step): synchronous SGD over
    the global batch G, whose numerics do not depend on the cluster's order. Their epochs
    come from ONE plain Keras run per G (learning rate x G / --batch_size, Horovod's rule),
    their virtual seconds are those epochs' steps x the cluster model's seconds per step
    (`sim.horovod`, `sim.hetseq.hetseq`, `simulate` with the GPipe/1F1B schedule).
With `--pick` (default), the defaults' pick first (hetpipe_tf/strategy/pick.py): every
candidate of --policies x N_m 1..k x --distances with its cluster-model time per minibatch
and predicted epochs and virtual time to target (default compensation), and a line
"Picked: allocation ..., N_m = ..., D = ..." naming the allocation, N_m and D picked
jointly; the picked one is then trained as the row "HetPipe pick: ..." and printed with
its predicted and measured virtual time to target and the ratio to Horovod's.
Then, with `--estimate`, the decomposition ESTIMATE: each configuration's epochs on the
task x the cluster model's time per ImageNet epoch of VGG-19 and ResNet-152
(experiments/_tta_estimate.py), beside Section 8.4's figures.
"""

from __future__ import annotations

import os

os.environ.setdefault("TF_CPP_MIN_LOG_LEVEL", "3")

import time  # noqa: E402

from absl import app, flags, logging  # noqa: E402

from experiments import _paper_tta as tta  # noqa: E402
from experiments import _study  # noqa: E402

OPTIMIZERS = {"adam": ("Adam", {"learning_rate": 1e-3}),
              "momentum": ("SGD", {"learning_rate": 0.01, "momentum": 0.9})}

_TASKS = flags.DEFINE_list("tasks", list(tta.TASKS), f"Tasks, from {tta.TASKS}.")
_POLICIES = flags.DEFINE_list("policies", list(tta.POLICIES),
                              f"HetPipe allocations, from {tta.POLICIES}.")
_DISTANCES = flags.DEFINE_list("distances", ["0", "4", "32"], "Clock distances D.")
_COMPENSATIONS = flags.DEFINE_list("compensations", ["none", "default"],
                                   f"HetPipe compensations, from {tta.COMPENSATIONS}.")
_SCHEDULES = flags.DEFINE_list("schedules", list(tta.SCHEDULES), "Synchronous pipeline "
                               f"rows, from {tta.SCHEDULES}; empty: none.")
_SYNC = flags.DEFINE_bool("sync_rows", True, "Horovod, HetSeq and --schedules rows.")
_MICRO = flags.DEFINE_integer("micro_batches", 4, "M of GPipe/1F1B.", lower_bound=1)
_N_M = flags.DEFINE_integer("n_m", 0, "HetPipe's N_m (0: the stages of the VW, "
                            "min(Max_m, k)).", lower_bound=0)
_BATCH = flags.DEFINE_integer("batch_size", 8, "Minibatch of a GPU (Horovod) and of a "
                              "VW (HetPipe).", lower_bound=1)
_EPOCHS = flags.DEFINE_integer("epochs", 12, "Most epochs of a row.", lower_bound=1)
_TARGET = flags.DEFINE_float("target", 0.95, "Target validation accuracy.",
                             lower_bound=0.0, upper_bound=1.0)
_OPTIMIZER = flags.DEFINE_enum("optimizer", "adam", sorted(OPTIMIZERS), "Optimizer.")
_EXAMPLES = flags.DEFINE_integer("examples", 0, "Training examples (0: the task's).",
                                 lower_bound=0)
_SEED = flags.DEFINE_integer("seed", 0, "Seed of the initial weights and the data order.")
_ESTIMATE = flags.DEFINE_bool("estimate", True, "The VGG-19 / ResNet-152 estimate table.")
_CACHE = flags.DEFINE_string("cache_dir", "/tmp/hetpipe_profiles", "Where VGG-19 and "
                             "ResNet-152 profiles are cached (JSON).")
_PICK = flags.DEFINE_bool("pick", True, "The defaults' pick over --policies x N_m x "
                         "--distances, trained as a row, predicted vs measured.")
_TINY = flags.DEFINE_bool("tiny", False, "About a minute: the cnn task on 256 examples, 2 "
                          "epochs, Horovod and HetPipe NP at D=0 with compensation none, "
                          "the pick over NP and ED-local at D=0 and 4, no estimate "
                          "(overrides the row flags).")


def _check(values, allowed) -> bool:
    return all(v in allowed for v in values)


flags.register_validator("tasks", lambda v: bool(v) and _check(v, tta.TASKS),
                         f"--tasks: from {tta.TASKS}.")
flags.register_validator("policies", lambda v: _check(v, tta.POLICIES),
                         f"--policies: from {tta.POLICIES}.")
flags.register_validator("compensations", lambda v: _check(v, tta.COMPENSATIONS),
                         f"--compensations: from {tta.COMPENSATIONS}.")
flags.register_validator("schedules", lambda v: _check(v, tta.SCHEDULES),
                         f"--schedules: from {tta.SCHEDULES}.")
flags.register_validator("distances", lambda v: bool(v) and all(x.isdigit() for x in v),
                         "--distances: integers >= 0, e.g. 0,4,32.")


def settings() -> dict:
    """The run's rows and sizes from the flags (`--tiny` overrides them)."""
    if _TINY.value:
        return dict(tasks=["cnn"], rows=tta.row_set(["NP"], [0], ["none"], []),
                    epochs=2, examples=256, estimate=False,
                    pick=(["NP", "ED-local"], [0, 4]) if _PICK.value else None)
    distances = [int(d) for d in _DISTANCES.value]
    rows = tta.row_set(_POLICIES.value, distances, _COMPENSATIONS.value, _SCHEDULES.value)
    if not _SYNC.value:
        rows = tuple(r for r in rows if not r.kind.synchronous)
    return dict(tasks=_TASKS.value, rows=rows, epochs=_EPOCHS.value,
                examples=_EXAMPLES.value, estimate=_ESTIMATE.value,
                pick=(_POLICIES.value or list(tta.POLICIES), distances)
                if _PICK.value else None)


def _default_compensation():
    """The compensation HetPipeStrategy uses under WSP when none is given (docs/convergence.md
    "The defaults"): the pick's epoch model and its row's."""
    from hetpipe_tf.strategy.options import CompensationOptions

    return CompensationOptions.value


def pick_row(task, pick_over, cluster, profile) -> tuple:
    """(the pick, its Row) of `task` (its `profile`) over `pick_over` = (policies,
    distances); prints the candidates' table."""
    from hetpipe_tf.strategy.pick import epoch_model

    batch = _BATCH.value
    t0 = time.perf_counter()
    compensation = _default_compensation()
    picked = tta.pick(profile, cluster, pick_over[0], pick_over[1], compensation,
                      tta.BASE_EPOCHS[task.name], len(task.x) // batch)
    best = picked.best.candidate
    m = epoch_model(compensation)
    print(f"The defaults' pick ({len(picked.predictions)} candidates, "
          f"{time.perf_counter() - t0:.0f} s; compensation default, epochs = "
          f"{tta.BASE_EPOCHS[task.name]:g} x (1 + {m.local:g} (N_m - 1)) x "
          f"(1 + {m.global_:g} log2(1 + D))):", flush=True)
    print(_study.markdown_table(picked.rows()), flush=True)
    print(f"Picked: allocation {best.label}, N_m = {best.n_m}, D = {best.clock_distance}: the "
          f"least predicted virtual time to target of {len(picked.predictions)} candidates "
          f"(allocations {', '.join(pick_over[0])}; D in "
          f"{', '.join(map(str, pick_over[1]))}; N_m 1..k).", flush=True)
    return picked, tta.Row(tta.Kind.HETPIPE, best.label, best.clock_distance, "default",
                           n_m=best.n_m, picked=True)


def pick_summary(picked, row, found_s: dict) -> str:
    """One line: the pick's predicted and measured virtual time to target, and Horovod's."""
    measured = found_s.get(row)
    hv = next((s for r, s in found_s.items() if r.kind is tta.Kind.HOROVOD), None)
    text = (f"{row.label}: predicted {picked.best.seconds * 1e3:.2f} ms "
            f"({picked.best.epochs:.2f} epochs), measured "
            + ("not reached" if measured is None else f"{measured * 1e3:.2f} ms"))
    if measured and hv:
        text += f"; Horovod {hv * 1e3:.2f} ms: the pick {hv / measured:.2f}x sooner"
    return text + "."


def run_task(task, rows, epochs: int, devices, cluster, profile) -> tuple[list, dict, dict]:
    """(table rows, epochs to target per Row, virtual seconds to target per Row) of one
    task (its `profile`)."""
    import keras

    from hetpipe_tf.sim import VirtualClock
    from hetpipe_tf.strategy import HetPipeStrategy
    from hetpipe_tf.strategy.virtual_clock import local_plans

    batch, target, opt = _BATCH.value, _TARGET.value, OPTIMIZERS[_OPTIMIZER.value]
    keras.utils.set_random_seed(_SEED.value)
    weights0 = task.build().get_weights()
    plans = {(p, n): tta.hetpipe_plans(profile, cluster, p, n or _N_M.value)
             for p, n in {(r.policy, r.n_m) for r in rows if r.policy}}
    ed_plans = plans.get(("ED", 0))
    table = [("configuration", "N_m", "samples / step", "virtual us / sample",
              "virtual ms to target", "epochs to target", "final acc")]
    found: dict = {}
    found_s: dict = {}
    sync_runs: dict[int, list] = {}   # global batch -> accuracies per epoch
    for row in rows:
        t0, used = time.perf_counter(), ""
        if row.kind.synchronous:
            g = tta.global_batch(row, batch, len(ed_plans[0]) if ed_plans else 4,
                                 len(cluster.devices))
            if g not in sync_runs:
                hist, _ = tta.fit(task, tta.scaled(opt, g / batch), weights0, g, epochs,
                                  target, seed=_SEED.value, stop=False)
                sync_runs[g] = [a for _, a in hist]
            ed = ed_plans[0] if ed_plans else tta.hetpipe_plans(
                profile, cluster, "ED", _N_M.value)[0]
            step = tta.sync_step_s(row, profile, cluster, ed, _MICRO.value)
            steps = len(task.x) // g
            hist = tta.sync_history(sync_runs[g], steps, step)
            s, e = _study.to_target(hist, target)
            acc = hist[e - 1][1] if e else hist[-1][1]   # as if stopped at the target
            n_m, per_sample = "-", step / g
        else:
            vw_plans, shares = plans[(row.policy, row.n_m)]
            clock = VirtualClock(cluster, placement=shares)
            kwargs = {} if row.compensation == "default" else {
                "compensation": row.compensation}
            strategy = HetPipeStrategy(plan=local_plans(vw_plans, devices),
                                       clock_distance=row.d, clock=clock, **kwargs)
            hist, used = tta.fit(task, opt, weights0, batch, epochs, target, strategy,
                                 seed=_SEED.value)
            s, e = _study.to_target(hist, target)
            acc = hist[-1][1]
            g, n_m = f"{batch} per VW", str(vw_plans[0].n_m)
            per_sample = hist[-1][0] / (len(hist) * (len(task.x) // batch) * batch)
        found[row], found_s[row] = e, s
        label = row.label + (f" ({used})" if row.compensation == "default" else "")
        table.append((label, n_m, str(g), f"{per_sample * 1e6:.3f}",
                      _study.cell(None if s is None else s * 1e3, ".2f"),
                      _study.cell(e, "d"), f"{acc:.3f}"))
        print(f"  done: {' | '.join(table[-1])} ({time.perf_counter() - t0:.0f} s)",
              flush=True)
    return table, found, found_s


def main(argv: list[str]) -> int:
    if len(argv) > 1:
        raise app.UsageError(f"Unexpected arguments: {argv[1:]}")
    logging.set_verbosity(logging.ERROR)
    from hetpipe_tf.cluster.local import configure_logical_devices

    devices = list(configure_logical_devices(4)[:4])
    import hetpipe_tf.sim as sim
    from hetpipe_tf.cluster import spec

    cluster = getattr(sim, "paper_cluster", spec.paper_cluster)()
    s = settings()
    print(f"The paper's cluster ({len(cluster.devices)} GPUs: "
          f"{', '.join(tta.PAPER_TYPES)}; 4 each), virtual time of the cluster model "
          f"(hetpipe_tf.sim). Optimizer {OPTIMIZERS[_OPTIMIZER.value]}, batch "
          f"{_BATCH.value} per GPU (Horovod) / per VW (HetPipe), target {_TARGET.value}, at "
          f"most {s['epochs']} epochs, seed {_SEED.value}.")
    print("HetPipe rows: trained under the virtual clock, stopped at the target. "
          "Synchronous rows (Horovod, HetSeq, GPipe, 1F1B): epochs from one plain Keras run "
          "with the global batch (learning rate x global batch / batch), seconds = steps x "
          "the cluster model's s/step; GPipe/1F1B move no parameters between VWs in the "
          "model.")
    epochs_by_task = {}
    for name in s["tasks"]:
        task = tta.load_task(name, s["examples"])
        print(f"\n{name}: {task.what}", flush=True)
        profile = tta.task_profile(task, _BATCH.value)   # once: the pick's and the rows'
        rows = s["rows"]
        if s["pick"]:
            picked, row = pick_row(task, s["pick"], cluster, profile)
            rows = tuple(r for r in rows if r.kind.synchronous) + (row,) + tuple(
                r for r in rows if not r.kind.synchronous)
        table, found, found_s = run_task(task, rows, s["epochs"], devices, cluster, profile)
        print(_study.markdown_table(table), flush=True)
        if s["pick"]:
            print(pick_summary(picked, row, found_s), flush=True)
        # The estimate's HetPipe throughputs are at Table 4's N_m, not the pick's.
        epochs_by_task[name] = {r: e for r, e in found.items() if not r.picked}
    if s["estimate"]:
        from experiments import _tta_estimate

        print("\nESTIMATE (epochs on the task x the cluster model's time per ImageNet epoch; "
              "not a training of these models). Section 8.4: HetPipe reaches the target "
              + ", ".join(f"{m} {v}" for m, v in tta.PAPER_SOONER.items())
              + " sooner than Horovod.")
        speeds = {m: _tta_estimate.samples_per_s(m, s["rows"], _CACHE.value or None,
                                                 _MICRO.value)
                  for m in _tta_estimate.MODELS}
        for name, found in epochs_by_task.items():
            print(f"\n{name} epochs:")
            print(_study.markdown_table(_tta_estimate.estimate_rows(found, speeds)))
    return 0


if __name__ == "__main__":
    app.run(main)
