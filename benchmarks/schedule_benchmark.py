r"""Synchronous schedules (GPipe, 1F1B) on logical CPU devices: bubble, throughput, memory.

  python -m benchmarks.schedule_benchmark [--stages=2,4] [--micro_batches=1,2,4,8]

Model: --depth Dense(--width, relu) + Dense(10, softmax), batch --batch_size, an
equal-layer split over k logical CPU devices of this machine (one intra-op thread each),
trained with model.fit under HetPipeStrategy. One run; every figure is measured in it.

1. Bubble. Every stage is EMULATED at --emulated_speed x (its actions sleep (1/f - 1) x
   their measured time: emulation only), so that k stages on this machine's 2 cores
   overlap as k devices would. Per minibatch, bubble = 1 - (mean busy time of a stage) /
   (first action's start to last backward's end), averaged over --steps minibatches,
   from the executor's action trace (the last stage's F holds its forward, loss and
   backward; its B only sends). Next to it: the simulator's replay of the same action
   lists with the measured mean action times (core/sync_schedule.replay) and GPipe's
   formula (K-1)/(M+K-1) for equal stage times.
2. Throughput (samples/s, best of --repeats epochs of --steps minibatches) of HETPIPE
   (N_m = k), GPIPE and ONE_F_ONE_B on the same plan and the same EMULATED devices, as
   ratios to HETPIPE; then what splitting a minibatch costs on this machine: GPIPE on ONE
   stage (nothing to overlap) at real speed with M micro-batches against M = 1.
3. Memory per stage (2 stages, real speed, batch --memory_batch_size), with and without
   re-materialization, next to the planner's prediction (partitioner/cost.py with
   SyncMemory). Every logical CPU device allocates from TensorFlow's one CPU allocator, so
   no allocator figure is a stage's (docs/memory.md); measured is an ACCOUNTING: the
   stage's variables' bytes + a gradient + the accumulator, plus the micro-batches it
   holds at once (from its action list) x what one micro-batch keeps, measured by the
   allocator around one lone forward of that stage (outputs included; under
   re-materialization without them: they go to the next stage, the stage keeps its
   inputs) + its received input; under re-materialization plus the peak of one lone
   recomputing backward; the
   last stage: the peak of one lone forward+loss+backward task + its held input
   gradients. Lone tasks run on the whole minibatch and count 1/M, so every measured
   buffer is a large one.
"""

from __future__ import annotations

import os

os.environ.setdefault("TF_CPP_MIN_LOG_LEVEL", "3")
# TensorFlow keeps CPU allocator statistics (get_memory_info, reset_memory_stats) only
# with its BFC CPU allocator in builds whose default allocator does not (the
# `tensorflow` wheel that keras-hub pulls in): ask for it before TF is imported.
os.environ.setdefault("TF_CPU_ALLOCATOR_USE_BFC", "true")

import logging  # noqa: E402

from absl import app, flags  # noqa: E402

from benchmarks._cli import (  # noqa: E402
    compensation, compensation_flag, markdown_table, op_threads, run)
from benchmarks._timing import best_rate  # noqa: E402

_STAGES = flags.DEFINE_list("stages", ["2", "4"], "Pipeline stages K of parts 1 and 2.")
_MICRO = flags.DEFINE_list("micro_batches", ["1", "2", "4", "8"], "M values.")
_STEPS = flags.DEFINE_integer("steps", 6, "Timed minibatches per setting.", lower_bound=1)
_WARMUP = flags.DEFINE_integer("warmup_steps", 2, "Untimed minibatches first.", lower_bound=1)
_REPEATS = flags.DEFINE_integer("repeats", 2, "Timed epochs per throughput; the best counts.",
                                lower_bound=1)
_BATCH = flags.DEFINE_integer("batch_size", 64, "Minibatch size.", lower_bound=1)
_WIDTH = flags.DEFINE_integer("width", 256, "Units of every hidden Dense layer.", lower_bound=1)
_DEPTH = flags.DEFINE_integer("depth", 8, "Hidden Dense layers.", lower_bound=1)
_MEM_BATCH = flags.DEFINE_integer("memory_batch_size", 1024, "Minibatch size of part 3.",
                                  lower_bound=1)
_SPEED = flags.DEFINE_float("emulated_speed", 0.25, "EMULATED speed factor of every stage in "
                            "parts 1 and 2 (1 = real speed).", lower_bound=0.01, upper_bound=1)
_COMPENSATION = compensation_flag("none")
_PARTS = flags.DEFINE_list("parts", ["1", "2", "3"], "Which parts to run.")

flags.register_validator("stages", lambda v: all(s.isdigit() and int(s) > 0 for s in v),
                         "--stages must be positive integers.")
flags.register_validator("micro_batches", lambda v: all(s.isdigit() and int(s) > 0 for s in v),
                         "--micro_batches must be positive integers.")
flags.register_validator("parts", lambda v: set(v) <= {"1", "2", "3"},
                         "--parts takes 1, 2 and/or 3.")


def _build(keras):
    from hetpipe_tf.models import dense_stack
    return dense_stack(_DEPTH.value, _WIDTH.value, "stack")


def _fit(keras, ds, k, factor, schedule, m, remat=False, n_m=None):
    """(strategy, model) after a warm-up epoch."""
    from hetpipe_tf.core.sync_schedule import Schedule
    from hetpipe_tf.strategy import HetPipeStrategy, even_plan
    devices = [f"/job:localhost/replica:0/task:0/device:CPU:{j}" for j in range(k)]
    keras.utils.set_random_seed(0)
    plan = even_plan(_build(keras), devices, n_m=n_m or 1, speed_factors=[factor] * k)
    kw = (dict(n_m=n_m, in_graph=False) if schedule is Schedule.HETPIPE
          else dict(schedule=schedule, micro_batches=m, rematerialize=remat))
    strategy = HetPipeStrategy(plan=plan, compensation=compensation(_COMPENSATION), **kw)
    with strategy.scope():
        model = _build(keras)
        model.compile(keras.optimizers.SGD(1e-3), "sparse_categorical_crossentropy")
    model.fit(ds, epochs=1, steps_per_epoch=_WARMUP.value, verbose=0)
    return strategy, model


def _bubbles(rt, first: int, k: int, m: int):
    """(measured bubble, replayed bubble) over the minibatches from action_trace[first:]."""
    from hetpipe_tf.core.sync_schedule import ActionKind, replay
    per_mb: dict = {}
    for p, a, t0, t1 in rt.action_trace[first:]:
        if a.kind is not ActionKind.APPLY:
            per_mb.setdefault(p, []).append((a, t0, t1))
    measured, times = [], {}
    for p, acts in per_mb.items():
        span = max(t1 for _, _, t1 in acts) - min(t0 for _, t0, _ in acts)
        busy = [sum(t1 - t0 for a, t0, t1 in acts if a.stage == j) for j in range(k)]
        measured.append(1 - sum(busy) / k / span)
        for a, t0, t1 in acts:
            times.setdefault((a.stage, a.kind), []).append(t1 - t0)
    mean = {key: sum(v) / len(v) for key, v in times.items()}
    lists = rt.actions_for(m)
    timed = replay(lists, lambda a: mean.get((a.stage, a.kind), 0.0))
    busy = [sum(t.end - t.start for t in timed if t.action.stage == j) for j in range(k)]
    span = max(t.end for t in timed)
    return sum(measured) / len(measured), 1 - sum(busy) / k / span


def _throughput(model, ds) -> float:
    return best_rate(model, ds, _STEPS.value, _BATCH.value, _REPEATS.value)


def _part1(keras, ds, stages, micro) -> None:
    from hetpipe_tf.core.sync_schedule import Schedule, bubble_fraction
    print(f"\n1. Bubble, every stage EMULATED at {_SPEED.value:g}x speed (emulation: actions "
          "sleep the extra time).")
    rows = [("K", "schedule", "M", "measured bubble", "replay of the lists", "(K-1)/(M+K-1)")]
    for k in stages:
        for schedule in (Schedule.GPIPE, Schedule.ONE_F_ONE_B):
            for m in micro:
                strategy, model = _fit(keras, ds, k, _SPEED.value, schedule, m)
                try:
                    rt = strategy.pipeline(model)
                    first = len(rt.action_trace)
                    model.fit(ds, epochs=1, steps_per_epoch=_STEPS.value, verbose=0)
                    got, sim = _bubbles(rt, first, k, m)
                finally:
                    strategy.close()
                rows.append((str(k), schedule.name, str(m), f"{got:.3f}", f"{sim:.3f}",
                             f"{bubble_fraction(k, m):.3f}"))
                print("  " + " ".join(rows[-1]), flush=True)
    print(markdown_table(rows))


def _part2(keras, ds, k, micro) -> None:
    from hetpipe_tf.core.sync_schedule import Schedule
    print(f"\n2. Throughput on the same {k}-stage plan, every stage EMULATED at "
          f"{_SPEED.value:g}x speed.")
    strategy, model = _fit(keras, ds, k, _SPEED.value, Schedule.HETPIPE, None, n_m=k)
    try:
        base = _throughput(model, ds)
    finally:
        strategy.close()
    rows = [("schedule", "M", "samples/s", "vs HETPIPE"),
            (f"HETPIPE (N_m={k})", "-", f"{base:.1f}", "1.00")]
    for schedule in (Schedule.GPIPE, Schedule.ONE_F_ONE_B):
        for m in micro:
            strategy, model = _fit(keras, ds, k, _SPEED.value, schedule, m)
            try:
                tput = _throughput(model, ds)
            finally:
                strategy.close()
            rows.append((schedule.name, str(m), f"{tput:.1f}", f"{tput / base:.2f}"))
    print(markdown_table(rows))
    print("\n   Splitting a minibatch on this machine: GPIPE on one stage, real speed.")
    rows = [("M", "samples/s", "vs M=1")]
    one = None
    for m in sorted({1, *micro}):
        strategy, model = _fit(keras, ds, 1, 1.0, Schedule.GPIPE, m)
        try:
            tput = _throughput(model, ds)
        finally:
            strategy.close()
        one = one or tput
        rows.append((str(m), f"{tput:.1f}", f"{tput / one:.2f}"))
    print(markdown_table(rows))


def _nbytes(tensors) -> int:
    return sum(int(t.shape.num_elements()) * t.dtype.size for t in tensors
               if t is not None)


def _grown(tf, fn):
    """(result, bytes the allocator holds more after fn, its peak above the start)."""
    info = lambda: tf.config.experimental.get_memory_info("CPU:0")  # noqa: E731
    tf.config.experimental.reset_memory_stats("CPU:0")
    start = info()["current"]
    out = fn()
    return out, info()["current"] - start, info()["peak"] - start


def _accounted(tf, rt, x, y, m: int) -> list[int]:
    """Per stage: weights + gradient + accumulator (bytes of its variables) + held x the
    bytes one micro-batch keeps (one lone forward there, outputs included, + its received
    input) + under re-materialization the peak of one lone recomputing backward; the last
    stage: the peak of one lone forward+loss+backward task + held x its input gradients.
    Lone tasks run on the whole minibatch's rows and count 1/M of it, so every measured
    buffer is a large one."""
    from hetpipe_tf.core.sync_schedule import peak_alive
    inputs = list(rt.stages[0].program.model_inputs(x))
    scale = tf.constant(1.0 / m)
    lists = rt.actions_for(m)
    out = []
    for j, stage in enumerate(rt.stages):
        sw = rt.versions.stages[j]
        tvals, nvals = sw.snapshot()
        acc = _nbytes(tvals) if m > 1 else 0
        fixed = _nbytes(tvals) + _nbytes(nvals) + _nbytes(tvals) + acc
        held = peak_alive(lists[j])
        in_bytes = _nbytes(inputs) if j else 0
        if stage.is_last:
            _, _, peak = _grown(tf, lambda: stage.forward_backward_scaled(
                tvals, nvals, inputs, y, None, scale))
            out.append(fixed + (peak + held * in_bytes) / m)
            break
        fwd = stage.forward_remat if rt.rematerialize else stage.forward
        (outputs, _, _, saved), kept, _ = _grown(tf, lambda: fwd(tvals, nvals, inputs))
        work = 0
        if rt.rematerialize:   # the outputs go to the next stage; only inputs are kept
            kept = max(0, kept - _nbytes(outputs))
            bwd = lambda: stage.backward_remat(saved, [tf.zeros_like(o) for o in outputs],  # noqa: E731
                                               scale)
            _, _, work = _grown(tf, bwd)
        out.append(fixed + (held * (kept + in_bytes) + work) / m)
        inputs = outputs
    return out


def _part3(tf, np, keras, m) -> None:
    from hetpipe_tf.models import random_features
    from hetpipe_tf.cluster.spec import Cluster
    from hetpipe_tf.core.sync_schedule import Schedule
    from hetpipe_tf.partitioner.cost import CostModel, SyncMemory
    from hetpipe_tf.partitioner.profiling import profile_model
    print(f"\n3. Memory per stage, 2 stages, M={m}, batch {_MEM_BATCH.value}, real speed: an "
          "ACCOUNTING of each stage's buffers (lone tasks measured with TF's CPU allocator) "
          "vs the planner's prediction.")
    ds = random_features(_WIDTH.value, _MEM_BATCH.value, batches=2)
    x, y = next(iter(ds))
    profile = profile_model(_build(keras), _MEM_BATCH.value, ["LOCAL_CPU"])
    cluster = Cluster.local(["LOCAL_CPU"] * 2)
    rows = [("schedule", "remat", "stage", "held", "measured MiB", "predicted MiB", "ratio")]
    for schedule in (Schedule.GPIPE, Schedule.ONE_F_ONE_B):
        for remat in (False, True):
            strategy, model = _fit(keras, ds, 2, 1.0, schedule, m, remat)
            try:
                rt = strategy.pipeline(model)
                measured = _accounted(tf, rt, x, y, m)
                plan = strategy.plan
            finally:
                strategy.close()
            sync = SyncMemory(m, schedule=schedule, rematerialize=remat)
            cm = CostModel(profile, cluster.devices, cluster, n_m=1, sync=sync)
            costs = cm.evaluate([plan.stages[0].last], list(cluster.devices))
            for j, (got, c) in enumerate(zip(measured, costs)):
                rows.append((schedule.name, str(remat), str(j), str(c.held),
                             f"{got / 2**20:.2f}", f"{c.memory_bytes / 2**20:.2f}",
                             f"{got / c.memory_bytes:.2f}"))
                print("  " + " ".join(rows[-1]), flush=True)
    print(markdown_table(rows))
    print("   (held: micro-batches the stage holds at once, from its action list, which the "
          "executor follows; MiB = 2^20 bytes; ratio = measured / predicted)")


def main(argv: list[str]) -> None:
    if len(argv) > 1:
        raise app.UsageError(f"Unexpected positional arguments. Received: {argv[1:]}; "
                             "pass options as --flag=value (--helpshort lists them).")
    stages = sorted({int(s) for s in _STAGES.value})
    micro = sorted({int(s) for s in _MICRO.value})
    if max(stages) > _DEPTH.value + 1:
        raise app.UsageError(f"--stages must not exceed the model's layers (--depth + 1 = "
                             f"{_DEPTH.value + 1}). Received: --stages={_STAGES.value}.")
    bad = [m for m in micro if _BATCH.value % m]
    if bad:
        raise app.UsageError(f"Every --micro_batches value must divide --batch_size. "
                             f"Received: {bad} for --batch_size={_BATCH.value}.")
    comp = compensation(_COMPENSATION)
    logging.getLogger("hetpipe_tf").setLevel(logging.WARNING)   # no plan tables per setting
    from hetpipe_tf.cluster.local import configure_logical_devices
    configure_logical_devices(max(stages + [2]))
    import keras
    import numpy as np
    import tensorflow as tf

    from hetpipe_tf.models import random_features
    op_threads(1, max(stages) + 2)
    print(f"Model: {_DEPTH.value} x Dense({_WIDTH.value}, relu) + Dense(10), batch "
          f"{_BATCH.value}, SGD; equal-layer split; {_STEPS.value} timed minibatches per "
          f"setting; logical CPU devices, 1 intra-op thread; compensation {comp.value}.")
    ds = random_features(_WIDTH.value, _BATCH.value, batches=4)
    if "1" in _PARTS.value:
        _part1(keras, ds, stages, micro)
    if "2" in _PARTS.value:
        _part2(keras, ds, stages[0], micro)
    if "3" in _PARTS.value:
        _part3(tf, np, keras, max(m for m in micro if _MEM_BATCH.value % m == 0))


if __name__ == "__main__":
    run(main)
