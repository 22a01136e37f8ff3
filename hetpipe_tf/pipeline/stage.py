"""One pipeline stage: a node range of the model, compiled, placed on one device.

The stage's forward is a `tf.function` that takes the weight version as TENSORS (a snapshot
of w_local, see `weights.py`) and the stage's input tensors, and calls the stage's Keras
layers inside a `keras.StatelessScope` mapping each stage variable to its version. Non-last
stages call it under an eager `tf.GradientTape` that is kept until the backward task; the
backward is the tape's gradient with the next stage's output gradients (no recomputation:
the tape holds the compiled function's intermediates; watched and differentiated through
`tf_eager.watch_flat` / `gradient_flat`, the tape's own C++ path without
`GradientTape`'s per-tensor Python). The last stage runs forward, loss and
backward as one compiled task. Every call happens on the stage's own thread under
`tf.device(stage device)` so forward and backward ops run on that device.

State of a stage's layers:
* trainable variables: versioned; gradients go to the optimizer when the minibatch completes;
* float non-trainable variables (BatchNorm moving statistics): versioned; the change the
  forward made (new - version) is added to w_local when the minibatch completes;
* other non-trainable variables (random seed generator state): sequential; read live and
  written back by each forward, in minibatch order, as in plain Keras.

Emulation: a stage on a device with emulated_speed_factor f < 1 sleeps after each task for
(1/f - 1) times the task's measured time, so it takes 1/f as long. This is emulation only.
"""

from __future__ import annotations

import dataclasses
import time
from typing import Any, Sequence

import keras
import tensorflow as tf

from hetpipe_tf._shim import keras_optimizer, keras_trainer, tf_eager
from hetpipe_tf.partitioner.layer_graph import TensorRef
from hetpipe_tf.pipeline.compiled import compiled_method
from hetpipe_tf.pipeline.emulation import emulate_slowdown
from hetpipe_tf.pipeline.program import Program


def compiled_loss(model, y, y_pred, sample_weight):
    """The model's compiled loss of one (micro-)batch, WITHOUT updating the per-output loss
    trackers Keras keeps for a model of several outputs ("reg_loss", ...): the strategy's
    metrics function updates those, under the metrics lock (build.py). Several VWs' last
    stages and HetSeq's shares compute losses at once, and Keras' Mean updates are
    read-modify-write, so updating them here lost updates between threads."""
    closs = keras_trainer.compile_loss(model)
    if closs is None:
        return None
    if closs.built and closs.metrics:
        with keras.StatelessScope():   # the trackers' assigns go to the scope, unapplied
            return closs(y, y_pred, sample_weight)
    return closs(y, y_pred, sample_weight)


@dataclasses.dataclass
class Saved:
    """What a non-last stage keeps from a forward until the backward of the same minibatch."""

    tape: Any
    tvals: list
    float_inputs: list
    outputs: list
    extra: Any
    mask: list


@dataclasses.dataclass
class RematSaved:
    """What a non-last stage keeps under re-materialization: enough to recompute."""

    tvals: list
    vvals: list
    svals: list
    inputs: list


# Op types that draw from a stateful generator (TF's legacy random ops, tf.random.Generator).
_STATEFUL_RANDOM = frozenset({
    "RandomUniform", "RandomUniformInt", "RandomStandardNormal", "TruncatedNormal",
    "RandomShuffle", "Multinomial", "RandomGamma", "RandomPoisson", "RandomPoissonV2",
    "RandomCrop", "StatefulUniform", "StatefulUniformInt", "StatefulUniformFullInt",
    "StatefulStandardNormal", "StatefulStandardNormalV2", "StatefulTruncatedNormal",
    "StatefulRandomBinomial", "RngSkip", "RngReadAndSkip"})


class Stage:
    def __init__(self, index: int, num_stages: int, program: Program, first: int, last: int,
                 device: str, emulated_speed_factor: float = 1.0, model=None):
        self.index = index
        self.is_last = index == num_stages - 1
        self.program = program
        self.first, self.last = first, last
        self.device = device
        self.emulated_speed_factor = float(emulated_speed_factor)
        self.layers = program.stage_layers(first, last)
        self.trainable, nts = program.stage_variables(first, last)
        # Tied weights (a layer called in two stages): an earlier stage owns the variable
        # (its StageWeights version it, its optimizer applies it); this stage BORROWS it:
        # the owner's version of the minibatch is appended to `tvals` (`tied.py`) and its
        # gradient is summed into the owner's. `lent`: own variables later stages borrow.
        self.borrowed: list = []
        self.lent: list = []
        self.versioned_nt = [v for v in nts if tf.as_dtype(v.dtype).is_floating]
        self.sequential_nt = [v for v in nts if not tf.as_dtype(v.dtype).is_floating]
        self.in_refs: tuple[TensorRef, ...] = program.cut(first - 1)
        self.out_refs: tuple[TensorRef, ...] = program.cut(last)
        # Which inputs need gradients: float tensors produced by an earlier stage.
        self._in_grad = [not r.is_model_input for r in self.in_refs]
        self._model = model
        # XLA (compile(jit_compile=True)): the forward, the backward TensorFlow derives for
        # it, and forward-loss-backward are compiled by XLA; the metrics' updates are not
        # (their variables live on another device, which an XLA cluster cannot read).
        self.jit_compile = program.jit_compile
        xla = True if self.jit_compile else None
        self._forward_fn = compiled_method(self._forward_impl, reduce_retracing=True,
                                           jit_compile=xla)
        self._fwd_bwd_fn = compiled_method(self._fwd_bwd_impl, reduce_retracing=True,
                                           jit_compile=xla)
        self._fwd_bwd_metrics_fn = None   # built for the first metrics function given
        self._metrics = None
        self._micro_fn = None      # forward_backward_scaled's, built for its metrics function
        self._micro_metrics = None
        self.emulated_sleep_s = 0.0  # total time slept for emulation (labelled as such)
        self._one = None   # the extra loss's output gradient (a float32 scalar 1)

    @classmethod
    def for_plan(cls, plan, program: Program, model) -> list["Stage"]:
        """The stages of `plan` (a partitioner Plan) over `program`, in pipeline order; a
        trainable variable used by several stages is owned by the first (tied weights)."""
        stages = [cls(s.index, plan.num_stages, program, s.first, s.last, s.tf_device,
                      s.emulated_speed_factor, model) for s in plan.stages]
        owner: dict[int, Stage] = {}
        for stage in stages:
            own = []
            for v in stage.trainable:
                first = owner.setdefault(id(v), stage)
                if first is stage:
                    own.append(v)
                else:
                    stage.borrowed.append(v)
                    if not any(v is x for x in first.lent):
                        first.lent.append(v)
            stage.trainable = own
        states: dict[int, int] = {}
        for stage in stages:
            for v in [*stage.versioned_nt, *stage.sequential_nt]:
                if states.setdefault(id(v), stage.index) != stage.index:
                    raise ValueError(
                        "A layer called in two stages may share trainable weights only: its "
                        "other state (BatchNorm statistics, a dropout seed) exists once and "
                        "is updated by each call in order. Received: "
                        f"{getattr(v, 'path', v.name)!r} used by stages {states[id(v)]} "
                        f"and {stage.index}; cut the model "
                        "elsewhere or give each call its own layer.")
        return stages

    # --- the compiled bodies -----------------------------------------------------------
    def _forward_impl(self, tvals, vvals, svals, inputs):
        # Cut what takes no gradient: the backward TensorFlow derives for this function
        # (the tape of a non-last stage) otherwise computes one for every input, e.g. a
        # whole MatMul for the model's features into stage 0 (about 1/13 of the large
        # benchmark model's backward; docs/performance.md).
        inputs = [x if need else tf.stop_gradient(x)
                  for x, need in zip(inputs, self._grad_mask(inputs))]
        vvals = [tf.stop_gradient(v) for v in vvals]
        mapping = (list(zip([*self.trainable, *self.borrowed], tvals))
                   + list(zip(self.versioned_nt, vvals))
                   + list(zip(self.sequential_nt, svals)))
        with keras.StatelessScope(state_mapping=mapping, collect_losses=True) as scope:
            env = dict(zip(self.in_refs, inputs))
            self.program.run(self.first, self.last, env, training=True)
            outputs = [env[r] for r in self.out_refs]
            extra = [tf.cast(l, tf.float32) for l in scope.losses]
        for v, val in zip(self.trainable, tvals):
            if getattr(v, "regularizer", None) is not None:
                extra.append(tf.cast(v.regularizer(val), tf.float32))
        extra = tf.add_n(extra) if extra else tf.zeros((), tf.float32)
        deltas = []
        for v, old in zip(self.versioned_nt, vvals):
            new = scope.get_current_value(v)
            deltas.append(tf.zeros_like(old) if new is None else new - old)
        new_s = []
        for v, old in zip(self.sequential_nt, svals):
            new = scope.get_current_value(v)
            new_s.append(old if new is None else tf.cast(new, old.dtype))
        return outputs, extra, deltas, new_s

    def _fwd_bwd_impl(self, tvals, vvals, svals, inputs, y, sample_weight, scale=None):
        fin = [x for x, m in zip(inputs, self._grad_mask(inputs)) if m]
        with tf.GradientTape(watch_accessed_variables=False) as tape:
            tape.watch(tvals)
            tape.watch(fin)
            outputs, extra, deltas, new_s = self._forward_impl(tvals, vvals, svals, inputs)
            y_pred = self.program.pack_outputs(outputs)
            c = compiled_loss(self._model, y, y_pred, sample_weight)
            loss = extra if c is None else extra + tf.cast(c, tf.float32)
        if scale is None:
            grads = tape.gradient(loss, [tvals, fin])
        else:   # a micro-batch's share of the minibatch's loss (sync_runtime.py)
            grads = tape.gradient(loss, [tvals, fin], output_gradients=scale)
        return grads[0], grads[1], loss, outputs, deltas, new_s

    def _fwd_bwd(self, *args):
        """`_fwd_bwd_impl` inside another compiled body: under XLA, a call of its own
        XLA-compiled function."""
        if self.jit_compile:
            return self._fwd_bwd_fn.function(*args)
        return self._fwd_bwd_impl(*args)

    def _fwd_bwd_metrics_impl(self, tvals, vvals, svals, inputs, y, sample_weight, extra):
        return self._fwd_bwd_logs(self._metrics, tvals, vvals, svals, inputs, y,
                                  sample_weight, extra)

    def _fwd_bwd_logs(self, metrics, tvals, vvals, svals, inputs, y, sample_weight, extra):
        """The last stage's task with the metrics updated on its total loss (+ `extra`)."""
        wg, ig, loss, outputs, deltas, new_s = self._fwd_bwd(tvals, vvals, svals, inputs, y,
                                                             sample_weight)
        total = loss if extra is None else loss + extra
        logs = metrics(total, y, self.program.pack_outputs(outputs), sample_weight)
        return wg, ig, total, outputs, deltas, new_s, logs

    # --- tasks (call on the stage's thread) ---------------------------------------------
    def _emulate(self, t0: float) -> None:
        self.emulated_sleep_s += emulate_slowdown(t0, self.emulated_speed_factor)

    def _read_sequential(self):
        if not self.sequential_nt:   # most models: nothing to read per task
            return []
        return [tf.identity(keras_optimizer.variable_handle(v)) for v in self.sequential_nt]

    def _write_sequential(self, new_s) -> None:
        for v, val in zip(self.sequential_nt, new_s):
            keras_optimizer.variable_handle(v).assign(val)

    def forward(self, tvals: Sequence, vvals: Sequence, inputs: Sequence):
        """Forward task of a non-last stage. Returns (outputs, extra_loss, nt_deltas, saved)."""
        t0 = time.perf_counter()
        with tf.device(self.device):
            inputs = list(inputs)
            tvals = list(tvals)
            mask = self._grad_mask(inputs)
            fin = [x for x, m in zip(inputs, mask) if m]
            tape = tf.GradientTape(watch_accessed_variables=False)
            with tape:
                tf_eager.watch_flat(tape, tvals)
                tf_eager.watch_flat(tape, fin)
                outputs, extra, deltas, new_s = self._forward_fn(
                    tvals, list(vvals), self._read_sequential(), inputs)
            self._write_sequential(new_s)
        self._emulate(t0)
        return outputs, extra, deltas, Saved(tape, tvals, fin, outputs, extra, mask)

    def backward(self, saved: Saved, output_grads: Sequence, extra_grad=None):
        """Backward task of a non-last stage. Returns (weight grads, grads of all inputs).
        `extra_grad`: the output gradient of the stage's added losses (default 1; a
        micro-batch's loss scale under a synchronous schedule)."""
        t0 = time.perf_counter()
        with tf.device(self.device):
            targets, ograds = [], []
            for o, g in zip(saved.outputs, output_grads):
                if o.dtype.is_floating:
                    targets.append(o)
                    ograds.append(tf.zeros_like(o) if g is None else tf.cast(g, o.dtype))
            targets.append(saved.extra)
            if self._one is None:   # made once: an eager op per backward showed in profiles
                self._one = tf.ones((), saved.extra.dtype)
            ograds.append(self._one if extra_grad is None else extra_grad)
            k = len(saved.tvals)
            grads = tf_eager.gradient_flat(saved.tape, targets,
                                              [*saved.tvals, *saved.float_inputs], ograds)
            wg, in_grads = grads[:k], self._spread(saved.mask, grads[k:])
        self._emulate(t0)
        return wg, in_grads

    def forward_backward(self, tvals, vvals, inputs, y, sample_weight, extra_loss=None,
                         metrics=None):
        """The last stage's single task. Returns (weight grads, input grads, loss, outputs,
        nt_deltas, logs). With `metrics` (update_metrics(total loss, y, y_pred,
        sample_weight) -> logs, a tf.function) the metrics are updated inside the same
        compiled call; `loss` is then the total loss (with `extra_loss`, the earlier
        stages' added losses) and `logs` their result; else logs is None."""
        t0 = time.perf_counter()
        with tf.device(self.device):
            inputs = list(inputs)
            if metrics is None:
                wg, ig, loss, outputs, deltas, new_s = self._fwd_bwd_fn(
                    list(tvals), list(vvals), self._read_sequential(), inputs, y,
                    sample_weight)
                logs = None
            else:
                if self._metrics is not metrics:   # traced with this metrics function
                    self._metrics = metrics
                    self._fwd_bwd_metrics_fn = compiled_method(
                        self._fwd_bwd_metrics_impl, reduce_retracing=True)
                wg, ig, loss, outputs, deltas, new_s, logs = self._fwd_bwd_metrics_fn(
                    list(tvals), list(vvals), self._read_sequential(), inputs, y,
                    sample_weight, extra_loss)
            self._write_sequential(new_s)
            in_grads = self._spread(self._grad_mask(inputs), ig)
        self._emulate(t0)
        return wg, in_grads, loss, outputs, deltas, logs

    def train_ops(self, tvals, vvals, inputs, y, sample_weight, metrics):
        """A one-stage model's whole minibatch as ops for the caller's graph (the in-graph
        runtime, inside Keras' train step): forward, loss, backward and the metrics
        (`metrics` as in `forward_backward`). Returns (weight grads, nt deltas, logs)."""
        if self.index != 0 or not self.is_last:
            raise ValueError(f"train_ops needs the only stage of a model. Received: stage "
                             f"{self.index} of a pipeline with more.")
        wg, _, _, _, deltas, new_s, logs = self._fwd_bwd_logs(
            metrics, list(tvals), list(vvals), self._read_sequential(), list(inputs), y,
            sample_weight, None)
        self._write_sequential(new_s)
        return wg, deltas, logs

    # --- micro-batches of a synchronous schedule (pipeline/sync_runtime.py) -------------
    def _micro_impl(self, tvals, vvals, svals, inputs, y, sample_weight, scale, extra):
        wg, ig, loss, outputs, deltas, new_s = self._fwd_bwd(
            tvals, vvals, svals, inputs, y, sample_weight, scale)
        total = loss if extra is None else loss + extra
        logs = ({} if self._micro_metrics is None else
                self._micro_metrics(total, y, self.program.pack_outputs(outputs), sample_weight))
        return wg, ig, total, outputs, deltas, new_s, logs

    def forward_backward_scaled(self, tvals, vvals, inputs, y, sample_weight, scale,
                                extra_loss=None, metrics=None):
        """The last stage's task for one micro-batch: as `forward_backward`, but the
        gradients are those of `scale` x the loss (the micro-batch's share of the
        minibatch's mean loss); `loss` and the metrics see the unscaled total."""
        t0 = time.perf_counter()
        with tf.device(self.device):
            inputs = list(inputs)
            if self._micro_fn is None or self._micro_metrics is not metrics:
                self._micro_metrics = metrics   # traced with this metrics function
                self._micro_fn = compiled_method(self._micro_impl, reduce_retracing=True)
            wg, ig, total, outputs, deltas, new_s, logs = self._micro_fn(
                list(tvals), list(vvals), self._read_sequential(), inputs, y, sample_weight,
                scale, extra_loss)
            self._write_sequential(new_s)
            in_grads = self._spread(self._grad_mask(inputs), ig)
        self._emulate(t0)
        return wg, in_grads, total, outputs, deltas, (None if metrics is None else logs)

    def forward_remat(self, tvals: Sequence, vvals: Sequence, inputs: Sequence):
        """Forward of a non-last stage that keeps only what recomputing it needs (its
        inputs, weight version and random-seed state), not the intermediates: GPipe's
        re-materialization. Returns (outputs, extra_loss, nt_deltas, RematSaved)."""
        t0 = time.perf_counter()
        with tf.device(self.device):
            inputs, tvals, vvals = list(inputs), list(tvals), list(vvals)
            svals = self._read_sequential()
            outputs, extra, deltas, new_s = self._forward_fn(tvals, vvals, svals, inputs)
            self._write_sequential(new_s)
        self._emulate(t0)
        return outputs, extra, deltas, RematSaved(tvals, vvals, svals, inputs)

    def backward_remat(self, saved: "RematSaved", output_grads: Sequence, extra_grad=None):
        """Backward after `forward_remat`: the forward is recomputed under a tape with the
        same inputs, weights and seed state (Keras' seeded dropout draws the same mask;
        `stateful_random_ops` finds ops that would not), then differentiated."""
        t0 = time.perf_counter()
        with tf.device(self.device):
            mask = self._grad_mask(saved.inputs)
            fin = [x for x, m in zip(saved.inputs, mask) if m]
            tape = tf.GradientTape(watch_accessed_variables=False)
            with tape:
                tf_eager.watch_flat(tape, saved.tvals)
                tf_eager.watch_flat(tape, fin)
                outputs, extra, _, _ = self._forward_fn(saved.tvals, saved.vvals,
                                                        saved.svals, saved.inputs)
        self._emulate(t0)
        return self.backward(Saved(tape, saved.tvals, fin, outputs, extra, mask),
                             output_grads, extra_grad)

    def stateful_random_ops(self, tvals, vvals, inputs) -> list[str]:
        """Names of the ops in this stage's compiled forward that draw from a stateful
        random generator (a recomputation would draw other numbers): refused under
        re-materialization. Keras' own random layers use stateless ops with a seed state
        and are not listed."""
        svals = self._read_sequential()
        with tf.device(self.device):
            graph = self._forward_fn.get_concrete_function(
                list(tvals), list(vvals), svals, list(inputs)).graph
        found = []
        for g in [graph, *[f.graph for f in getattr(graph, "_functions", {}).values()
                           if hasattr(f, "graph")]]:
            found += [f"{op.name} ({op.type})" for op in g.get_operations()
                      if op.type in _STATEFUL_RANDOM]
        return found

    def _grad_mask(self, inputs) -> list[bool]:
        return [g and x.dtype.is_floating for x, g in zip(inputs, self._in_grad)]

    @staticmethod
    def _spread(mask, float_grads) -> list:
        """Gradients for every stage input (None where an input takes none)."""
        it = iter(float_grads)
        return [next(it) if m else None for m in mask]
