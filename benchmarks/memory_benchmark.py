r"""Each pipeline stage's peak memory next to the planner's prediction (one run, this CPU).

  python -m benchmarks.memory_benchmark [--stages=2,4] [--nm=1,2,4] [--optimizers=sgd,adam]
      [--compensation=none]

Model: --depth Dense(--width, relu) + Dense(10, softmax), batch --batch_size, one virtual
worker of k logical CPU devices under HetPipeStrategy with the planner's plan for that
k, N_m and optimizer (layout from the catalog's estimated times: the memory prediction
does not depend on times). For each setting, --steps minibatches after a warm-up epoch.

PREDICTED: the plan's `memory_bytes` per stage (partitioner/cost.py: weights + gradients
+ optimizer slots + (N_m - 1) weight versions + the staleness compensation's buffers
(`PredictionMemory`, from --compensation) + held x (activations + received input)).

MEASURED, and how. There is no GPU here, and every logical CPU device allocates from
TensorFlow's ONE process-wide CPU allocator: `tf.config.experimental.get_memory_info`
works for CPU in TF 2.21 but reports the process, not a stage. So a stage's peak is an
ACCOUNTING of the buffers the stage holds, each term measured as follows:
  weights+slots   bytes of the stage's variables (w_local) and of its optimizer's
                  variables (slots, step counter), read off the live objects;
  versions        sampled every --sample_ms during the run: the distinct buffers (by data
                  address, so copy-on-write sharing counts once) of the stage's weight
                  versions, pending and in use by minibatches in flight, that are not the
                  variables' current buffers (a buffer's identity: the data pointer of
                  TensorFlow's DLPack export, which shares it);
  activations     (tape bytes x minibatches whose forward ran on the stage and whose
                  backward has not) + the distinct input buffers those minibatches hold
                  (received activations; the model input on stage 0), sampled; tape bytes
                  = growth of the allocator's bytes in use across ONE forward of that
                  stage run alone after the run (outputs + what its GradientTape keeps);
                  the last stage: the allocator's peak above the start during one lone
                  forward+backward task + its input;
                  (the last stage's lone-task peak less its one set of weight gradients,
                  which counts under grads);
  grads           sampled: the weight gradients waiting for the stage's apply task, at
                  least one set (a backward materialises one, of exactly the stage's
                  trainable bytes, even when the apply follows at once on stage 0);
  prediction      sampled (--compensation that predicts, N_m > 1): the distinct buffers
                  of the stage's predictor state, d as of each pending version
                  (`StageWeights._d_of`) and the latest d (`predictor.d`), with delay
                  compensation and Gap-Aware their whole lists (the last N_m updates and
                  ms or C*C). The predicted weights a forward reads are minibatch
                  versions: they count under versions.
measured = weights+slots + the largest sampled sum of the other terms. "grad sets" is
the most sets seen waiting at once (not part of that sum unless it was at its peak). Per setting, the process line gives the allocator's own peak during the run above
its level before it (all stages and Keras' step at once: a check of the accounting, not
a per-stage figure). ratio = measured / predicted; the goal is within 20% (0.8 to 1.2).
"""

from __future__ import annotations

import os

os.environ.setdefault("TF_CPP_MIN_LOG_LEVEL", "3")
# TensorFlow keeps CPU allocator statistics (get_memory_info, reset_memory_stats) only
# with its BFC CPU allocator in builds whose default allocator does not (the
# `tensorflow` wheel that keras-hub pulls in): ask for it before TF is imported.
os.environ.setdefault("TF_CPU_ALLOCATOR_USE_BFC", "true")

import ctypes  # noqa: E402
import threading  # noqa: E402
import weakref  # noqa: E402

from absl import app, flags  # noqa: E402

from benchmarks import _cli  # noqa: E402
from benchmarks._cli import markdown_table, op_threads, run  # noqa: E402

_STAGES = flags.DEFINE_list("stages", ["2", "4"], "Pipeline stages (logical CPU devices).")
_NM = flags.DEFINE_list("nm", ["1", "2", "4"], "N_m values (minibatches in flight).")
_OPTIMIZERS = flags.DEFINE_list("optimizers", ["sgd", "adam"], "Keras optimizer names.")
_DEPTH = flags.DEFINE_integer("depth", 8, "Hidden Dense layers.", lower_bound=1)
_WIDTH = flags.DEFINE_integer("width", 512, "Units of every hidden Dense layer.",
                              lower_bound=1)
_BATCH_SIZE = flags.DEFINE_integer("batch_size", 256, "Minibatch size.", lower_bound=1)
_STEPS = flags.DEFINE_integer("steps", 20, "Measured minibatches per setting.", lower_bound=1)
_COMPENSATION = _cli.compensation_flag("none")   # passed explicitly (docs/memory.md)
_SAMPLE_MS = flags.DEFINE_float("sample_ms", 1.0, "Sampling interval of the held buffers.",
                                lower_bound=0.1)

flags.register_validator("stages", lambda v: all(s.isdigit() and int(s) >= 2 for s in v),
                         "--stages must be integers >= 2.")
flags.register_validator("nm", lambda v: all(s.isdigit() and int(s) > 0 for s in v),
                         "--nm must be positive integers.")

MIB = 2**20


def _build(keras, name: str):
    from hetpipe_tf.models import dense_stack
    return dense_stack(_DEPTH.value, _WIDTH.value, name)


def _dataset(tf, np):
    from hetpipe_tf.models import random_features
    return random_features(_WIDTH.value, _BATCH_SIZE.value, batches=4)


_capsule_pointer = ctypes.pythonapi.PyCapsule_GetPointer
_capsule_pointer.restype = ctypes.c_void_p
_capsule_pointer.argtypes = [ctypes.py_object, ctypes.c_char_p]


def _address(t) -> int:
    """The tensor's buffer address: the data pointer of TensorFlow's DLPack export (it
    shares the buffer; `.numpy()` may copy a shared buffer, so its address says nothing)."""
    import tensorflow as tf
    capsule = tf.experimental.dlpack.to_dlpack(t)
    # A DLManagedTensor starts with a DLTensor, which starts with `void* data`.
    return ctypes.c_void_p.from_address(_capsule_pointer(capsule, b"dltensor")).value


def _buffers(tensors) -> dict[int, int]:
    """Buffer address -> bytes of each tensor's buffer, so tensors sharing a buffer (a
    weight version and the variable it was read from, until copy-on-write) count once."""
    import tensorflow as tf
    out = {}
    for t in tensors:
        if t is None:
            continue
        if isinstance(t, tf.IndexedSlices):
            t = t.values
        n = t.shape.num_elements() * t.dtype.size
        if n:
            out[_address(t)] = n
    return out


def _var_bytes(variables) -> int:
    import numpy as np
    import tensorflow as tf
    return sum(int(np.prod(v.shape, dtype=np.int64)) * tf.as_dtype(v.dtype).size
               for v in variables)


def _allocated() -> int:
    import tensorflow as tf
    return tf.config.experimental.get_memory_info("CPU:0")["current"]


def _lone_peak(fn):
    """(result, allocator peak during fn above its level at the start)."""
    import tensorflow as tf
    tf.config.experimental.reset_memory_stats("CPU:0")
    start = _allocated()
    out = fn()
    return out, tf.config.experimental.get_memory_info("CPU:0")["peak"] - start


class _Sampler:
    """Samples, per stage, the buffers it holds (module doc) while the pipeline runs."""

    def __init__(self, rt, interval_s: float):
        from hetpipe_tf import _shim as _keras_shim
        self._handle = _keras_shim.variable_handle
        self.rt = rt
        self.k = len(rt.stages)
        self.interval_s = interval_s
        self.live = weakref.WeakValueDictionary()   # minibatch id -> Minibatch in flight
        self.tape = [0] * self.k                    # set from _measure_lone_tasks
        self.peak = [0] * self.k
        self.at_peak = [(0, 0, 0, 0)] * self.k      # (versions, activations, grads, prediction)
        self.most_versions = [0] * self.k           # most bytes of each term seen alone
        self.most_prediction = [0] * self.k
        self.held = [0] * self.k
        self.grad_sets = [0] * self.k               # most weight-gradient sets waiting
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._loop, daemon=True)
        # Instrumentation of our own runtime (benchmark only): note each minibatch a stage
        # task starts on, so the sampler can reach minibatches no queue holds.
        run_task = rt._run_task

        def noted(j, stage, kind, mb, payload, t0):
            self.live[mb.id] = mb
            return run_task(j, stage, kind, mb, payload, t0)
        rt._run_task = noted
        self._restore = lambda: setattr(rt, "_run_task", run_task)

    def __enter__(self):
        self._thread.start()
        return self

    def __exit__(self, *exc):
        self._stop.set()
        self._thread.join()
        self._restore()

    def _sample_stage(self, j: int, mbs) -> tuple[int, int, int, int, int]:
        sw = self.rt.versions.stages[j]
        # Under the stage's own lock: read piecemeal, an apply between two reads showed a
        # d already replaced beside its successor (3 copies counted where 2 ever lived).
        with sw._lock:
            current = _buffers(self._handle(v).read_value() for v in sw.variables)
            versions = {}
            for _, t, n in sw._versions.values():
                versions.update(_buffers((*t, *n)))
            prediction = {}
            if sw.predictor is not None:   # d of each pending version, and the latest d
                for d in sw._d_of.values():
                    prediction.update(_buffers(d))
                prediction.update(_buffers(sw.predictor.d or ()))
        inputs, grads, held = {}, {}, 0
        for mb in mbs:
            saved = mb.saved.get(j)
            if saved is not None:
                held += 1
                versions.update(_buffers(saved.tvals))
                inputs.update(_buffers(saved.float_inputs))
                if j == 0:
                    inputs.update(_buffers(mb.inputs))
            g = mb.grads.get(j)
            if g is not None:
                grads.update(_buffers(g))
        v = sum(b for a, b in versions.items() if a not in current)
        # A backward materialises one set of the stage's weight gradients (exact size) even
        # when the apply follows at once (stage 0), so at least one set counts.
        one = _var_bytes(sw.trainable)
        g = sum(grads.values())
        self.grad_sets[j] = max(self.grad_sets[j], round(g / one) if one else 0)
        pr = sum(b for a, b in prediction.items() if a not in current and a not in versions)
        return v, held * self.tape[j] + sum(inputs.values()), max(g, one), pr, held

    def _loop(self) -> None:
        while not self._stop.wait(self.interval_s):
            try:
                mbs = list(self.live.values())
                for j in range(self.k):
                    v, a, g, pr, held = self._sample_stage(j, mbs)
                    if v + a + g + pr > self.peak[j]:
                        self.peak[j], self.at_peak[j] = v + a + g + pr, (v, a, g, pr)
                    self.held[j] = max(self.held[j], held)
                    self.most_versions[j] = max(self.most_versions[j], v)
                    self.most_prediction[j] = max(self.most_prediction[j], pr)
            except (RuntimeError, KeyError):
                continue   # a dict changed while it was read: skip this sample


def _measure_lone_tasks(rt, x, y, repeats: int = 3) -> tuple[list[int], list[int]]:
    """Per stage, each run alone, median of `repeats`: the bytes one forward leaves
    allocated (outputs + what its tape keeps; the last stage: the allocator's peak above
    the start during its forward+backward task) and the bytes of the stage's input."""
    import statistics
    k = len(rt.stages)
    tape, in_bytes = [0] * k, [0] * k
    inputs = [x]
    for j, stage in enumerate(rt.stages):
        tvals, nvals = rt.versions.stages[j].snapshot()
        in_bytes[j] = sum(_buffers(inputs).values())
        seen, outputs = [], None
        for _ in range(repeats):
            if j < k - 1:
                start = _allocated()
                outputs, _, _, saved = stage.forward(tvals, nvals, inputs)
                seen.append(_allocated() - start)
                del saved
            else:
                seen.append(_lone_peak(
                    lambda: stage.forward_backward(tvals, nvals, inputs, y, None))[1])
        tape[j] = int(statistics.median(seen))
        inputs = outputs
    return tape, in_bytes


def _setting(tf, np, keras, k: int, n_m: int, opt: str, profile, ds,
             compensation) -> tuple[list, str]:
    from hetpipe_tf.cluster.spec import Cluster
    from hetpipe_tf.partitioner.cost import CostModel, optimizer_slots
    from hetpipe_tf.partitioner.planner import plan_model
    from hetpipe_tf.strategy import HetPipeStrategy
    from hetpipe_tf.strategy.prediction_memory import prediction_memory

    cluster = Cluster.local(["LOCAL_CPU"] * k)
    prediction = prediction_memory(compensation)
    plan = plan_model(None, cluster, _BATCH_SIZE.value, n_m=n_m, optimizer=opt,
                      profile=profile, prediction=prediction).plan
    cm = CostModel(profile, cluster.devices, cluster, n_m=n_m,
                   optimizer_slots=optimizer_slots(opt), prediction=prediction)
    keras.utils.set_random_seed(0)
    # It reads the threaded runtime's buffers, also for one stage at N_m = 1. The
    # compensation is explicit: the strategy's default ("both") is not this flag's.
    strategy = HetPipeStrategy(cluster, plan=plan, in_graph=False,
                               compensation=compensation)
    with strategy.scope():
        model = _build(keras, "measured")
        model.compile(opt, "sparse_categorical_crossentropy")
    try:
        model.fit(ds, epochs=1, steps_per_epoch=max(2, n_m), verbose=0)
        rt = strategy.pipeline(model)
        x, y = next(iter(ds))
        tape, in_bytes = _measure_lone_tasks(rt, x, y)
        weights = [_var_bytes(sw.variables) + _var_bytes(sw.optimizer.variables)
                   for sw in rt.versions.stages]
        tf.config.experimental.reset_memory_stats("CPU:0")
        before = _allocated()
        sampler = _Sampler(rt, _SAMPLE_MS.value / 1e3)
        sampler.tape = tape
        with sampler:
            model.fit(ds, epochs=1, steps_per_epoch=_STEPS.value, verbose=0)
        process = tf.config.experimental.get_memory_info("CPU:0")["peak"] - before
    finally:
        strategy.close()
    rows = []
    bounds = [-1, *[s.last for s in plan.stages[:-1]], plan.num_layers - 1]
    for j, s in enumerate(plan.stages):
        v, a, g, pr = sampler.at_peak[j]
        if j == k - 1:   # its activations live inside its one task (the lone task's peak,
            # less the one set of weight gradients it makes: counted under grads)
            a += max(tape[j] - _var_bytes(rt.versions.stages[j].trainable), 0) + in_bytes[j]
        measured = weights[j] + v + a + g + pr
        lo, hi = bounds[j] + 1, bounds[j + 1] + 1
        trainable = sum(l.trainable_param_bytes for l in profile.layers[lo:hi])
        vers = (n_m - 1) * trainable
        copies = prediction.copies(n_m) if prediction is not None else 0
        pred = copies * trainable
        fixed = cm.fixed_memory[lo:hi].sum() - vers - pred
        acts = s.memory_bytes - fixed - vers - pred
        one = _var_bytes(rt.versions.stages[j].trainable) or 1
        per_mb = cm.activation[lo:hi].sum() + (cm.cut_bytes[lo - 1] if j else 0)
        rows.append((str(k), str(n_m), opt, str(j), f"{s.first}..{s.last}",
                     f"{sampler.held[j]}/{s.minibatches_held}", str(sampler.grad_sets[j]),
                     f"{tape[j] / MIB:.2f}/{per_mb / MIB:.2f}", f"{measured / MIB:.2f}",
                     f"{s.memory_bytes / MIB:.2f}", f"{measured / s.memory_bytes:.2f}",
                     f"{sampler.most_versions[j] / one:.2f} / "
                     f"{sampler.most_prediction[j] / one:.2f}",
                     f"{n_m - 1} / {copies}",
                     f"{weights[j] / MIB:.2f} / {v / MIB:.2f} / {pr / MIB:.2f} / "
                     f"{a / MIB:.2f} / {g / MIB:.2f}",
                     f"{fixed / MIB:.2f} / {vers / MIB:.2f} / {pred / MIB:.2f} / "
                     f"{acts / MIB:.2f}"))
    dynamic = sum(sum(sampler.at_peak[j]) for j in range(k)) + max(
        tape[-1] - _var_bytes(rt.versions.stages[-1].trainable), 0) + in_bytes[-1]
    note = (f"  {k} stages, N_m={n_m}, {opt}, {compensation.value}: process (TF CPU allocator, all stages and "
            f"Keras' step) peak above its pre-run level {process / MIB:.2f} MiB; sum of the "
            f"stages' accounted non-weight terms {dynamic / MIB:.2f} MiB")
    return rows, note


def _table(rows) -> None:
    print(markdown_table(rows))


def main(argv: list[str]) -> None:
    if len(argv) > 1:
        raise app.UsageError(f"Unexpected arguments: {argv[1:]}.")
    stages = sorted({int(s) for s in _STAGES.value})
    if max(stages) > _DEPTH.value + 1:
        raise app.UsageError(f"--stages must not exceed the model's layers (--depth + 1 = "
                             f"{_DEPTH.value + 1}). Received: --stages={_STAGES.value}.")
    from hetpipe_tf.cluster.local import configure_logical_devices
    configure_logical_devices(max(stages))
    import keras
    import numpy as np
    import tensorflow as tf
    op_threads(1, max(stages) + 2)
    from hetpipe_tf.partitioner.profiling import profile_model
    compensation = _cli.compensation(_COMPENSATION)
    if compensation is None:   # "": the memory model needs the compensation by name
        raise app.UsageError("--compensation must name a compensation here (its buffers "
                             "are modelled). Received: --compensation=''; e.g. both.")

    print(f"Model: {_DEPTH.value} x Dense({_WIDTH.value}, relu) + Dense(10), batch "
          f"{_BATCH_SIZE.value}, float32; {_STEPS.value} measured minibatches per setting; "
          f"one virtual worker of k logical CPU devices; compensation={compensation.value}.")
    print("measured = an ACCOUNTING of the buffers each stage holds (sampled every "
          f"{_SAMPLE_MS.value:g} ms; lone-task terms from TF's CPU allocator), not a per-device "
          "allocator figure: logical CPU devices share one allocator (module doc). "
          "predicted = the plan's memory_bytes (partitioner/cost.py).")
    ds = _dataset(tf, np)
    rows = [("stages", "N_m", "optimizer", "stage", "layers", "held seen/model", "grad sets",
             "tape/mb MiB seen/model", "measured MiB", "predicted MiB", "ratio",
             "most copies seen: versions / prediction", "copies model: versions / prediction",
             "measured: weights+slots / versions / prediction / activations+inputs / grads",
             "predicted: weights+grads+slots / versions / prediction / activations+inputs")]
    notes = []
    for opt in _OPTIMIZERS.value:
        profile = profile_model(_build(keras, "measured"), _BATCH_SIZE.value, ["LOCAL_CPU"])
        for k in stages:
            for n_m in sorted({int(v) for v in _NM.value}):
                r, note = _setting(tf, np, keras, k, n_m, opt, profile, ds, compensation)
                rows.extend(r)
                notes.append(note)
                print(note, flush=True)
    print()
    _table(rows)
    print("(MiB = 2^20 bytes; ratio = measured / predicted; copies = bytes / the stage's "
          "trainable bytes)")


if __name__ == "__main__":
    run(main)
