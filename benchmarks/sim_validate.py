r"""Simulator against a real run on this machine (prints a table; asserts nothing).

  python -m benchmarks.sim_validate [--nm=1,2,4] [--steps=30] [--repeats=3]

The pipeline benchmark's model (benchmarks/pipeline_benchmark.py: 24 x Dense(512) +
Dense(10), batch 256) on ONE virtual worker of 2 logical CPU devices with one intra-op
thread each, device 0 EMULATED at speed factor 0.5, partitioned by the planner (measured
layer times). For each N_m: the measured throughput (best of --repeats epochs of --steps
minibatches, each epoch starting and ending with an empty pipeline, as in the benchmark)
against the simulator's prediction for the same --steps minibatches from empty:

  sim(plan):       the plan's stage times, compute_scale = 1;
  sim(plan x c):   compute_scale = c, the machine's MEASURED contention factor: the time
                   of two concurrent copies of a training step / one (the benchmark's
                   "machine ceiling"); on this 2-core VM two busy logical devices slow
                   each other down, which the per-device cost model cannot know;
  sim(trace):      the task durations measured in the run's own trace (median per stage
                   and kind) with the MODELLED updates: checks the schedule model; the
                   trace has no update spans (stage 0's runs outside every task, the other
                   stages' apply tasks are not traced).
  sim(plan x c_eff): contention only while devices compute at once: c_eff =
                   1 + (c - 1) f, f = the fraction of busy time during which another device
                   is busy too, read off the same simulation at c = 1 (`overlap_fraction`).

Every simulation charges each stage its MODELLED update (optimizer step + next weight
snapshot, `LayerCost.update_s` profiled per layer with the run's optimizer, summed over
the stage's layers: `sim.model.stage_update_times`), where the runtime runs it: stage 0
after the minibatch's backward, the other stages as an apply task; divided by the
emulated speed factor, as the runtime's emulation slows updates too. Beside
it, u0 model vs u0 measured: stage 0's modelled update and the median of the runtime's
own measurement of it (`update_s`) in the same run.

Then TWO virtual workers (`--sim_vws`): one stage each, on the 2 logical devices (one
EMULATED at 0.5x), data parallel through parameter servers under WSP (one PS per host,
default placement), for each N_m and D in --sim_d: measured (HetPipeStrategy with two
plans, --steps minibatches shared by both VWs) against the simulator (same plans, PS map
from the placement, --steps / 2 minibatches per VW).
"""

from __future__ import annotations

import os

os.environ.setdefault("TF_CPP_MIN_LOG_LEVEL", "3")

import dataclasses  # noqa: E402
import statistics  # noqa: E402
import time  # noqa: E402

from absl import app, flags  # noqa: E402
from benchmarks._cli import markdown_table, op_threads  # noqa: E402

_NM = flags.DEFINE_list("sim_nm", ["1", "2", "4"], "N_m values to compare.")
_SIM_STEPS = flags.DEFINE_integer("sim_steps", 30, "Timed minibatches per epoch.")
_SIM_REPEATS = flags.DEFINE_integer("sim_repeats", 3, "Timed epochs; the fastest counts.")
_SIM_VWS = flags.DEFINE_list("sim_vws", ["1", "2"], "Virtual-worker counts to validate.")
_SIM_D = flags.DEFINE_list("sim_d", ["0", "1"], "Clock distances D for two VWs.")


def _measure(pb, keras, ds, plan, steps: int, repeats: int, cluster=None,
             clock_distance: int = 0):
    from hetpipe_tf.strategy import HetPipeStrategy
    keras.utils.set_random_seed(0)
    strategy = HetPipeStrategy(cluster, plan=plan, clock_distance=clock_distance)
    with strategy.scope():
        model = pb._build(keras, "pipelined")
        model.compile(keras.optimizers.SGD(1e-3), "sparse_categorical_crossentropy")
    try:
        model.fit(ds, epochs=1, steps_per_epoch=5, verbose=0)
        best, best_trace = 0.0, []
        for _ in range(repeats):
            rt = strategy.pipeline(model)  # VW 0's
            n0 = len(rt.trace)
            start = time.perf_counter()
            model.fit(ds, epochs=1, steps_per_epoch=steps, verbose=0)
            batch = (plan[0] if isinstance(plan, list) else plan).batch_size
            rate = steps * batch / (time.perf_counter() - start)
            if rate > best:
                best, best_trace = rate, list(rt.trace[n0:])
        return best, best_trace, statistics.median(rt.update_s[-steps:])
    finally:
        strategy.close()


def _union(intervals: list[tuple[float, float]]) -> list[tuple[float, float]]:
    out: list[list[float]] = []
    for a, b in sorted(intervals):
        if out and a <= out[-1][1]:
            out[-1][1] = max(out[-1][1], b)
        else:
            out.append([a, b])
    return [(a, b) for a, b in out]


def overlap_fraction(events) -> float:
    """Share of all devices' busy time during which at least one other device is busy."""
    by_device: dict[tuple[int, int], list] = {}
    for e in events:
        by_device.setdefault((e.vw, e.task.stage), []).append((e.start, e.end))
    busy = {d: _union(iv) for d, iv in by_device.items()}
    total = overlapped = 0.0
    for d, mine in busy.items():
        others = _union([iv for o, ivs in busy.items() if o != d for iv in ivs])
        for a, b in mine:
            total += b - a
            overlapped += sum(max(0.0, min(b, y) - max(a, x)) for x, y in others)
    return overlapped / total if total else 0.0


def _trace_times(trace, k: int) -> tuple[list[float], list[float]]:
    from hetpipe_tf.core.schedule import TaskKind
    by = {}
    for e in trace:
        by.setdefault((e.task.stage, e.task.kind), []).append(e.end - e.start)
    fwd, bwd = [], []
    for j in range(k):
        if j == k - 1:
            fb = statistics.median(by[(j, TaskKind.FORWARD_BACKWARD)])
            fwd.append(fb / 3)
            bwd.append(2 * fb / 3)
        else:
            fwd.append(statistics.median(by[(j, TaskKind.FORWARD)]))
            bwd.append(statistics.median(by[(j, TaskKind.BACKWARD)]))
    return fwd, bwd


def _profile(keras, model, cluster, batch_size: int):
    """The planner's profile of `model`, with the update of the runs' optimizer."""
    from hetpipe_tf.partitioner.planner import measurable_devices
    from hetpipe_tf.partitioner.profiling import profile_model
    return profile_model(model, batch_size, sorted({d.type_name for d in cluster.devices}),
                         measure_on=measurable_devices(cluster.devices),
                         optimizer=keras.optimizers.SGD(1e-3))


def _table(rows) -> None:
    print("\n" + markdown_table(rows))
    print("(samples/s; ratio = simulated / measured)")


def _two_virtual_workers(pb, keras, ds, cluster, ceiling, steps, repeats, nms, ds_):
    """Measured vs simulated throughput of 2 one-stage VWs under WSP."""
    from hetpipe_tf.partitioner.milp import plan_virtual_workers
    from hetpipe_tf.partitioner.planner import plan_model
    from hetpipe_tf.ps.placement import place_parameters, traffic
    from hetpipe_tf.sim.engine import simulate
    from hetpipe_tf.sim.model import SimConfig, from_plan

    from hetpipe_tf.sim.model import stage_update_times

    vws = [[d] for d in cluster.devices]
    model = pb._build(keras, "planned2")
    first = plan_model(model, cluster, pb._BATCH_SIZE.value, devices=vws[0], n_m=1,
                       profile=_profile(keras, model, cluster, pb._BATCH_SIZE.value))
    rows = [("N_m", "D", "measured", "sim(plan)", "ratio", f"sim(plan x {ceiling:.2f})",
             "ratio", "f", "sim(plan x c_eff)", "ratio")]
    for n_m in nms:
        plans = plan_virtual_workers(first.profile, vws, cluster=cluster, n_m=n_m)
        placement = place_parameters(first.profile, plans, cluster)
        ps = traffic(placement, plans, first.profile, cluster)
        for d in ds_:
            measured, _, _ = _measure(pb, keras, ds, list(plans), steps, repeats, cluster, d)
            cfg = SimConfig(n_m=n_m, clock_distance=d, num_waves=max(1, steps // (2 * n_m)))
            def run(scale):
                return simulate([from_plan(p, cluster, name=f"vw{w}", compute_scale=scale,
                                           ps={j: [(t.ps_host, t.bytes) for t in st]
                                               for j, st in enumerate(ps[w])},
                                           update_s=stage_update_times(
                                               p, first.profile))
                                 for w, p in enumerate(plans)], cfg, cluster)

            base = run(1.0)
            f = overlap_fraction(base.events)
            preds = [base.samples_per_s, run(ceiling).samples_per_s,
                     run(1.0 + (ceiling - 1.0) * f).samples_per_s]
            cells = [(f"{pr:.0f}", f"{pr / measured:.2f}") for pr in preds]
            rows.append((str(n_m), str(d), f"{measured:.0f}", *cells[0], *cells[1],
                         f"{f:.2f}", *cells[2]))
            print(f"  2 VWs, N_m={n_m}, D={d}: measured {measured:.0f} samples/s", flush=True)
    print("\nTwo virtual workers (one stage each, device 0 EMULATED at 0.5x), WSP through "
          "one parameter server per host:")
    _table(rows)


def main(argv: list[str]) -> None:
    from benchmarks import pipeline_benchmark as pb
    from hetpipe_tf.cluster.local import configure_logical_devices
    configure_logical_devices(2)
    import keras
    import numpy as np
    import tensorflow as tf
    op_threads(1, 4)
    from hetpipe_tf.cluster.spec import Cluster
    from hetpipe_tf.partitioner.planner import plan_model
    from hetpipe_tf.sim.engine import simulate
    from hetpipe_tf.sim.model import SimConfig, VirtualWorker, from_plan, stage_update_times

    steps, repeats = _SIM_STEPS.value, _SIM_REPEATS.value
    ds = pb._dataset(tf, np)
    cluster = Cluster.local(["LOCAL_CPU", "LOCAL_CPU"], emulated_speed_factors=[0.5, 1.0])
    ceiling = pb._machine_ceiling(tf, keras, [d.tf_device for d in cluster.devices])
    nms = [int(v) for v in _NM.value]
    print(f"contention factor c (2 concurrent step copies / 1, measured now) = {ceiling:.2f}")
    if "2" in _SIM_VWS.value:
        two = Cluster.local(["LOCAL_CPU", "LOCAL_CPU"], hosts=2,
                            emulated_speed_factors=[0.5, 1.0])
        _two_virtual_workers(pb, keras, ds, two, ceiling, steps, repeats, nms,
                             [int(v) for v in _SIM_D.value])
    if "1" not in _SIM_VWS.value:
        return
    model = pb._build(keras, "planned")
    result = plan_model(model, cluster, pb._BATCH_SIZE.value, n_m=max(nms),
                        profile=_profile(keras, model, cluster, pb._BATCH_SIZE.value))
    plan = result.plan
    upd = stage_update_times(plan, result.profile)
    print(plan.table())
    print("modelled update per stage (ms, optimizer SGD, not emulated): "
          + ", ".join(f"{u * 1e3:.1f}" for u in upd))
    rows = [("N_m", "measured", "sim(plan)", "ratio", f"sim(plan x {ceiling:.2f})", "ratio",
             "sim(trace)", "ratio", "f", "sim(plan x c_eff)", "ratio", "u0 model ms",
             "u0 measured ms")]
    for n_m in nms:
        p = dataclasses.replace(plan, n_m=n_m)
        measured, trace, update_s = _measure(pb, keras, ds, p, steps, repeats)
        waves = max(1, steps // n_m)
        cfg = SimConfig(n_m=n_m, num_waves=waves)
        preds = []
        for scale in (1.0, ceiling):
            vw = from_plan(p, cluster, compute_scale=scale, update_s=upd)
            preds.append(simulate([vw], cfg, cluster).samples_per_s)
        fwd, bwd = _trace_times(trace, p.num_stages)
        vw = VirtualWorker("trace", tuple(
            dataclasses.replace(s, forward_s=f, backward_s=b)
            for s, f, b in zip(from_plan(p, cluster, update_s=upd).stages, fwd, bwd)),
            p.batch_size)
        preds.append(simulate([vw], cfg, cluster).samples_per_s)
        f = overlap_fraction(simulate([from_plan(p, cluster, update_s=upd)], cfg,
                                      cluster).events)
        c_eff = 1.0 + (ceiling - 1.0) * f
        eff = simulate([from_plan(p, cluster, compute_scale=c_eff, update_s=upd)],
                       cfg, cluster).samples_per_s
        rows.append((str(n_m), f"{measured:.0f}",
                     *(x for pr in preds for x in (f"{pr:.0f}", f"{pr / measured:.2f}")),
                     f"{f:.2f}", f"{eff:.0f}", f"{eff / measured:.2f}",
                     f"{upd[0] * 1e3:.1f}", f"{update_s * 1e3:.1f}"))
        print(f"  N_m={n_m}: trace task medians fwd={[round(x * 1e3, 1) for x in fwd]} ms "
              f"bwd={[round(x * 1e3, 1) for x in bwd]} ms", flush=True)
    print("\nOne virtual worker of 2 stages:")
    _table(rows)


if __name__ == "__main__":
    app.run(main)
