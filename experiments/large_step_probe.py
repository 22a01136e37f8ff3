r"""Where a large-step 2-stage pipeline's time goes (prints; asserts nothing).

  python -m experiments.large_step_probe

The overhead benchmark's large model (12 x Dense(512) + Dense(10), batch 256) on logical
CPU devices with one intra-op thread, as in `benchmarks.overhead_benchmark --parts=large`.
Three probes, each printed with its setting (docs/performance.md "What bounds the goals"):

1. CPU against wall time per minibatch (`time.process_time()` around --steps-minibatch
   fits, best of 3): plain Keras fit and the 6+7 pipeline at N_m = 2 and 4, and the CPU
   of the busiest threads (`/proc/self/task/*/stat`: TensorFlow's `tf_Compute` op
   threads, the stage threads' Python, Keras' own thread). A compiled
   step keeps more than one core busy through inter-op parallelism; the pipeline's extra
   CPU is work the ceiling's two plain steps do not do.
2. Stage 0's tasks from the runtime's trace at N_m = 2 (median forward, backward, update,
   busy share, and the gaps between tasks by the kinds around them).
3. Six Dense(512) layers alone, one thread: one compiled step (forward, backward, SGD)
   against the same work as a non-last stage does it (forward under an eager tape around
   its compiled call, the tape's gradient through `_keras_shim.gradient_flat`, a separate
   update call; both calls through `compiled_method`).
4. An SGD step over 13 x 512x512 variables written in place or by value, with the
   previous version released or alive (the copy-on-write copy that writing by value
   avoids; `_keras_shim.write_by_value`).
"""

from __future__ import annotations

import os

os.environ.setdefault("TF_CPP_MIN_LOG_LEVEL", "3")

import collections  # noqa: E402
import statistics  # noqa: E402
import time  # noqa: E402

from absl import app, flags, logging  # noqa: E402

from hetpipe_tf.observe.threads import thread_cpu  # noqa: E402

_STEPS = flags.DEFINE_integer("steps", 60, "Timed minibatches per fit.", lower_bound=10)


def _setup():
    import tensorflow as tf
    cpu = tf.config.list_physical_devices("CPU")[0]
    tf.config.set_logical_device_configuration(
        cpu, [tf.config.LogicalDeviceConfiguration()] * 2)
    tf.config.threading.set_intra_op_parallelism_threads(1)
    tf.config.threading.set_inter_op_parallelism_threads(6)
    return [d.name for d in tf.config.list_logical_devices("CPU")]


def _thread_cpu() -> collections.Counter:
    """CPU seconds so far of this process's threads, by name (observe/threads.py)."""
    return collections.Counter(thread_cpu())


def _cpu_and_wall(model, ds) -> tuple[float, float, collections.Counter]:
    """(wall ms, process CPU ms, CPU ms by thread name) per minibatch of the fastest of 3
    fits."""
    model.fit(ds, epochs=1, steps_per_epoch=10, verbose=0)
    best = None
    for _ in range(3):
        w0, c0, t0 = time.perf_counter(), time.process_time(), _thread_cpu()
        model.fit(ds, epochs=1, steps_per_epoch=_STEPS.value, verbose=0)
        per = _thread_cpu()
        per.subtract(t0)
        got = ((time.perf_counter() - w0) / _STEPS.value * 1e3,
               (time.process_time() - c0) / _STEPS.value * 1e3,
               collections.Counter({k: v / _STEPS.value * 1e3 for k, v in per.items() if v}))
        best = got if best is None or got[0] < best[0] else best
    return best


def _print_threads(per: collections.Counter) -> None:
    top = ", ".join(f"{name} {ms:.2f}" for name, ms in per.most_common(4))
    print(f"      by thread (CPU ms per minibatch): {top}")


def _pipelined(keras, devices, n_m):
    from hetpipe_tf.models import dense_stack
    from hetpipe_tf.strategy import HetPipeStrategy, manual_plan
    plan = manual_plan(dense_stack(12, 512, "pipe"), [(devices[0], 6), (devices[1], 7)],
                       n_m=n_m)
    strategy = HetPipeStrategy(plan=plan)
    with strategy.scope():
        model = dense_stack(12, 512, "pipe")
        model.compile(keras.optimizers.SGD(1e-3), "sparse_categorical_crossentropy")
    return strategy, model


def _probe_cpu(tf, keras, np, devices, ds) -> None:
    from hetpipe_tf.models import dense_stack
    print(f"[1] CPU and wall ms per minibatch (best of 3 fits of {_STEPS.value})")
    with tf.device(devices[0]):
        plain = dense_stack(12, 512, "plain")
        plain.compile(keras.optimizers.SGD(1e-3), "sparse_categorical_crossentropy")
    wall, cpu, per = _cpu_and_wall(plain, ds)
    print(f"  plain Keras fit   wall {wall:6.2f}  cpu {cpu:6.2f}")
    _print_threads(per)
    for n_m in (2, 4):
        strategy, model = _pipelined(keras, devices, n_m)
        wall, cpu, per = _cpu_and_wall(model, ds)
        print(f"  6+7, N_m={n_m}        wall {wall:6.2f}  cpu {cpu:6.2f}")
        _print_threads(per)
        strategy.close()


def _probe_trace(keras, devices, ds) -> None:
    print("[2] stage 0 of 6+7, N_m=2, from the runtime's trace")
    strategy, model = _pipelined(keras, devices, 2)
    model.fit(ds, epochs=1, steps_per_epoch=10, verbose=0)
    rt = strategy.pipeline(model)
    runs = []
    for _ in range(3):   # the fastest fit of 3 (this VM stalls now and then)
        first, ufirst = len(rt.trace), len(rt.update_s)
        start = time.perf_counter()
        model.fit(ds, epochs=1, steps_per_epoch=_STEPS.value, verbose=0)
        runs.append((time.perf_counter() - start, first, len(rt.trace), ufirst,
                     len(rt.update_s)))
    wall, first, end, ufirst, uend = min(runs)
    events = sorted((e for e in rt.trace[first:end] if e.task.stage == 0),
                    key=lambda e: e.start)
    updates = list(rt.update_s[ufirst:uend])
    for kind in ("FORWARD", "BACKWARD"):
        d = [(e.end - e.start) * 1e3 for e in events if e.task.kind.name == kind]
        print(f"  {kind.lower():9} median {statistics.median(d):6.2f} ms")
    print(f"  update    median {statistics.median(updates) * 1e3:6.2f} ms")
    busy = sum(e.end - e.start for e in events) + sum(updates)
    print(f"  busy {busy / wall:.0%} of {wall / _STEPS.value * 1e3:.2f} ms per minibatch")
    gaps = collections.defaultdict(list)
    for a, b in zip(events, events[1:]):
        gaps[(a.task.kind.name.lower(), b.task.kind.name.lower())].append((b.start - a.end) * 1e3)
    for (a, b), d in sorted(gaps.items()):
        note = " (the update included)" if a == "backward" else ""
        print(f"  gap {a:>8} -> {b:<8} n={len(d):3}  median {statistics.median(d):5.2f} ms{note}")
    strategy.close()


def _probe_split(tf, keras) -> None:
    from hetpipe_tf import _shim as keras_shim
    from hetpipe_tf.pipeline.compiled import compiled_method
    print("[3] 6 x Dense(512), batch 256, alone: fused step vs the stage's split calls")
    layers = [keras.layers.Dense(512, activation="relu") for _ in range(6)]
    x = tf.random.normal((256, 512))
    g = tf.random.normal((256, 512))

    def forward(h):
        for layer in layers:
            h = layer(h)
        return h
    forward(x)
    variables = [v for layer in layers for v in layer.trainable_variables]
    opt = keras.optimizers.SGD(1e-3)
    opt.build(variables)

    @tf.function
    def fused():
        with tf.GradientTape() as tape:
            out = forward(x)
        opt.apply_gradients(zip(tape.gradient(out, variables, output_gradients=g), variables))

    class Calls:   # compiled as a stage compiles its calls (pipeline/compiled.py)
        def forward(self, h):
            return forward(tf.stop_gradient(h))

        def update(self, grads):
            opt.apply_gradients(zip(grads, variables))
    calls = Calls()
    tf_variables = [keras_shim.variable_handle(v) for v in variables]
    handles = [v.handle for v in tf_variables]   # what the tape differentiates
    compiled_forward = compiled_method(calls.forward)
    update = compiled_method(calls.update)

    def split():   # as Stage.forward / Stage.backward run it
        tape = tf.GradientTape(watch_accessed_variables=False)
        with tape:
            tape.watch(tf_variables)
            out = compiled_forward(x)
        update(keras_shim.gradient_flat(tape, [out], handles, [g]))

    for name, fn in (("one compiled step", fused), ("tape forward + backward + update", split)):
        fn()
        fn()
        best = min(_seconds(fn, 40) for _ in range(5))
        print(f"  {name:32} {best * 1e3:6.2f} ms")


def _probe_by_value(tf) -> None:
    print("[4] 13 x 512x512 variables, SGD step, with and without a version alive")
    variables = [tf.Variable(tf.random.normal((512, 512))) for _ in range(13)]
    grads = [tf.random.normal((512, 512)) for _ in range(13)]

    def step(write):
        @tf.function
        def fn():
            for v, g in zip(variables, grads):
                write(v, 1e-3 * g)
            return [tf.identity(v) for v in variables]   # the next version: shares buffers
        return fn

    in_place = step(lambda v, x: v.assign_sub(x))
    by_value = step(lambda v, x: v.assign(v - x))
    for name, fn in (("in place (assign_sub)", in_place), ("by value (assign(v - x))", by_value)):
        for alive in (False, True):
            held = fn()
            if not alive:
                held = None

            def call(fn=fn, alive=alive):
                nonlocal held
                out = fn()
                held = out if alive else None   # a kept version shares the buffers
            best = min(_seconds(call, 50) for _ in range(5))
            print(f"  {name:26} version {'alive' if alive else 'released':8} "
                  f"{best * 1e3:6.2f} ms")
    del held


def _seconds(fn, n: int) -> float:
    start = time.perf_counter()
    for _ in range(n):
        fn()
    return (time.perf_counter() - start) / n


def main(argv) -> None:
    del argv
    logging.set_verbosity(logging.WARNING)   # not the plan tables
    devices = _setup()
    import keras
    import numpy as np
    import tensorflow as tf
    from hetpipe_tf.models import random_features
    ds = random_features(512, 256, batches=8)
    _probe_cpu(tf, keras, np, devices, ds)
    _probe_trace(keras, devices, ds)
    _probe_split(tf, keras)
    _probe_by_value(tf)


if __name__ == "__main__":
    app.run(main)
