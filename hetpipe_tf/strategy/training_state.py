"""The training state of one or several virtual workers as ONE value: the model and its
optimizer.

Between runs (a run ends whenever the pipeline drains: every epoch end, before evaluate,
predict and a checkpoint, after an abort) the Keras model and `model.optimizer` hold the
whole state, exactly as for plain Keras, so `ModelCheckpoint`, `BackupAndRestore`,
`model.save`, `keras.models.load_model` and `tf.train.Checkpoint` keep all of it and a
checkpoint does not depend on the layout that wrote it. During a run the stages hold it:

- weights: with one virtual worker (VW) w_local IS the model's variables; with several,
  w_global is on the parameter servers and each VW has w_local copies (docs/wsp.md);
- optimizer: every stage of every VW applies its partition's updates with its own
  optimizer (a clone of the model's built on that stage's w_local, on the stage's device;
  as in HetPipe each GPU updates its own weights), so a VW's slots (momentum, Adam's
  moments) are its own, as each worker's are under parameter-server training. The learning
  rate is the model optimizer's variable itself, so callbacks (LearningRateScheduler,
  ReduceLROnPlateau) and `model.optimizer.learning_rate = x` reach every stage at its next
  update; a `LearningRateSchedule` is evaluated per stage at its own update count, which is
  the VW's minibatch count (one VW: exactly Keras). `model.optimizer.iterations` counts
  every minibatch applied by any VW, live.

The rule at run boundaries (`OptimizerStates.merge` at a run's end, `seed` at the next
run's start): several become one: each model optimizer slot := the mean over the VWs of
the stage slots standing for it; one becomes several: every stage slot := the model
optimizer's and its step count := model.optimizer.iterations // number of VWs (so Adam's
bias correction continues where one worker of the cluster would be). The model's
optimizer keeps its slots on the host (the strategy's variable creator places them there
whoever builds it: Keras at fit's symbolic build or `build_canonical`), so the stage devices
hold one copy of the slots, not two.

Both moves are compiled, whatever the model's size: `seed` is one call, `merge` two (the
stage optimizers' step counts, read as one small vector, then every mean and assignment);
on a cluster each is one request per task holding stage slots (docs/cluster_jobs.md, "The
run's boundaries in a few compiled calls").

A VW dropped under `on_fault="continue"` (its task lost, hetpipe_tf/ps/coordinator.py;
`drop`) is left out of both: its slots live on the lost task (reading them would fail or
hang) and hold no update the servers kept.
"""

from __future__ import annotations

import functools
from typing import Any, Sequence

import keras
import tensorflow as tf

from hetpipe_tf import _shim as _keras_shim
from hetpipe_tf.pipeline.compiled import compiled_method


def _slots(optimizer) -> list:
    """The optimizer's per-variable state, in build order (not iterations, not the lr)."""
    skip = {id(_keras_shim.variable_handle(optimizer.iterations))}
    lr = _keras_shim.optimizer_learning_rate(optimizer)
    own_lr = getattr(optimizer, "_hetpipe_own_lr", None)
    for v in (lr, own_lr):
        if isinstance(v, (keras.Variable, tf.Variable)):
            skip.add(id(_keras_shim.variable_handle(v)))
    return [v for v in optimizer.variables
            if id(_keras_shim.variable_handle(v)) not in skip]


def check_optimizer(optimizer, max_stages: int = 1) -> None:
    """Optimizers whose state the pipeline cannot carry are refused before training."""
    if isinstance(optimizer, keras.optimizers.LossScaleOptimizer):
        return  # refused with its own message by validation.check_model
    if getattr(optimizer, "gradient_accumulation_steps", None):
        raise ValueError(
            "HetPipeStrategy does not support gradient accumulation in the optimizer (each "
            "minibatch's update is applied when it completes; a pipeline accumulates nothing "
            "across minibatches). Received: gradient_accumulation_steps="
            f"{optimizer.gradient_accumulation_steps}; remove it, or raise the batch size.")
    if getattr(optimizer, "global_clipnorm", None) and max_stages > 1:
        raise ValueError(
            "global_clipnorm needs every gradient of a minibatch at once, but each pipeline "
            "stage applies its own partition's update on its own device. Received: "
            f"global_clipnorm={optimizer.global_clipnorm} with {max_stages} stages; use "
            "clipnorm (per variable) or clipvalue, or one stage per virtual worker.")


def build_canonical(model) -> None:
    """Build the model's optimizer on the model's trainable variables (in its strategy's
    scope), so its slots exist before training and checkpoints hold them."""
    optimizer = model.optimizer
    if not optimizer.built:
        with model.distribute_strategy.scope():
            optimizer.build(model.trainable_variables)


def _clone(model, variables: Sequence, strategy):
    """The model optimizer's config, built on `variables` in `strategy`'s scope, sharing the
    model optimizer's learning rate (a Variable or a schedule)."""
    base = model.optimizer
    with strategy.scope():
        # The class's own from_config: also optimizers keras.optimizers.deserialize does
        # not know by name (it returned a string for Lamb) and users' own classes.
        clone = type(base).from_config(base.get_config())
        lr = _keras_shim.optimizer_learning_rate(base)
        if isinstance(lr, keras.Variable):
            # One learning-rate variable for every stage: hyperparameter changes reach all.
            own = _keras_shim.optimizer_learning_rate(clone)
            _keras_shim.set_optimizer_learning_rate(clone, lr)
            object.__setattr__(clone, "_hetpipe_own_lr", own)
        elif isinstance(lr, keras.optimizers.schedules.LearningRateSchedule):
            _keras_shim.set_optimizer_learning_rate(clone, lr)
        clone.build(list(variables))
    return clone


class OptimizerStates:
    """Every stage optimizer of every VW, and which slot of the model's optimizer each of
    their slots stands for (by the slot's name, which Keras derives from the model
    variable's path; a stage optimizer built on copies is matched through a reference
    built on the model's own variables)."""

    def __init__(self, model, strategy, num_virtual_workers: int, adjust=None):
        self.model = model
        # Staleness compensation's change to each built stage optimizer (None: none).
        self._adjust = adjust
        self.strategy = strategy
        self.num_virtual_workers = num_virtual_workers
        self.optimizers: list = []
        self.pairs: list[tuple] = []   # (stage optimizer's slot, model optimizer's slot)
        self._canonical: dict[str, list] = {}
        self._unnamed: list = []   # the optimizer's own state, named by a counter
        self._owner: dict[int, Any] = {}   # id(stage slot) -> the stage optimizer holding it
        self._start = 0                    # every stage optimizer's step count at the seed
        self._numbers = None               # 0, 1, 2, ...: the merge's divisors (_merge_impl)
        self._vw_of: dict[int, int] = {}   # id(stage slot or optimizer) -> its VW
        self.dropped: set[int] = set()     # VWs left out (their task was lost)
        for v in _slots(model.optimizer):
            if _keras_shim.is_auto_named(v):
                self._unnamed.append(v)
            else:
                self._canonical.setdefault(v.name, []).append(v)

    def for_virtual_worker(self, local: Sequence[Sequence], own: Sequence[Sequence]) -> list:
        """One optimizer per stage: built on the stage's w_local `local[j]`, which stands
        for the model's trainable variables `own[j]` (the same list with one VW)."""
        seen: dict[str, int] = {}
        out = []
        vw = len({*self._vw_of.values()})   # VWs are added in order, one call each
        for variables, model_vars in zip(local, own):
            clone = _clone(self.model, variables, self.strategy)
            same = len(variables) == len(model_vars) and all(
                a is b for a, b in zip(variables, model_vars))
            reference = clone if same else _clone(self.model, model_vars, self.strategy)
            mine = _slots(clone)
            names = [v.name for v in _slots(reference)]
            if len(names) != len(mine):
                raise ValueError(
                    "A stage's optimizer state does not line up with the model optimizer's. "
                    f"Received: {type(clone).__name__} with {len(mine)} slot variables for "
                    f"{len(model_vars)} variables; use an optimizer whose state is one set of "
                    "variables per model variable and a step counter.")
            unnamed = iter(self._unnamed)
            for slot, name in zip(mine, names):
                if _keras_shim.is_auto_named(slot):
                    # State of the optimizer itself (Nadam's momentum-schedule product),
                    # named by a counter: the model optimizer's own, in creation order.
                    target = next(unnamed, None)
                    if (target is None or tuple(target.shape) != tuple(slot.shape)
                            or target.dtype != slot.dtype):
                        raise ValueError(
                            "A stage optimizer's own state variable has no counterpart in "
                            f"the model's optimizer. Received: {slot.name!r} of shape "
                            f"{tuple(slot.shape)} in {type(clone).__name__}; use an "
                            "optimizer whose state is per-variable slots and scalars.")
                    self.pairs.append((slot, target))
                    self._owner[id(slot)] = clone
                    continue
                k = seen.get(name, 0)
                seen[name] = k + 1
                targets = self._canonical.get(name, [])
                if k >= len(targets):
                    raise ValueError(
                        "A stage optimizer's slot has no counterpart in the model's optimizer. "
                        f"Received: slot {name!r}; give the model's layers unique names.")
                self.pairs.append((slot, targets[k]))
                self._owner[id(slot)] = clone
            if self._adjust is not None:
                self._adjust(clone)
            for slot in mine:
                self._vw_of[id(slot)] = vw
            self._vw_of[id(clone)] = vw
            out.append(clone)
        self.optimizers.extend(out)
        return out

    def drop(self, vw: int) -> None:
        """Leave VW `vw`'s optimizers out of every later merge and seed (module docstring)."""
        self.dropped.add(vw)

    def _live(self, obj) -> bool:
        return self._vw_of.get(id(obj)) not in self.dropped

    def merge(self) -> None:
        """Several become one: each model optimizer slot := the mean of the stage slots that
        stand for it (one per VW), over the VWs that trained in the run: a VW that took no
        minibatch (a run of one `train_on_batch`) still holds the seed and would dilute it.

        Two compiled calls and one read of a small vector, whatever the model: the live
        stage optimizers' step counts, then every mean and assignment in one call (keyed by
        which stage optimizers trained)."""
        live = self._live_optimizers()
        if not live or not self.pairs:
            return
        counts = self._counts(live).numpy()
        trained = tuple(i for i, c in zip(live, counts) if int(c) > self._start)
        if trained:
            if self._numbers is None or self._numbers.shape[0] <= len(self.pairs):
                self._numbers = tf.range(len(self.pairs) + 1, dtype=tf.float64)
            self._merge_all(trained, self._numbers)

    def seed(self) -> None:
        """One becomes several: every stage slot := the model optimizer's, every stage step
        count := model.optimizer.iterations // number of VWs. One compiled call (keyed by
        which VWs are live) and one read of a local scalar."""
        self._start = int(self._seed_all(self._live_optimizers()).numpy())

    def _live_optimizers(self) -> tuple[int, ...]:
        """Indices in `optimizers` of the stage optimizers of VWs not dropped."""
        return tuple(i for i, o in enumerate(self.optimizers) if self._live(o))

    # --- compiled moves (module docstring) ---------------------------------------------
    # Each is hosted by this process: the partitioner runs every remote read or assignment
    # on the task holding its variable (one component call per task, concurrent), and each
    # value crosses the wire once (model slot -> stage slot, stage slot -> model slot).
    # A dropped VW's variables are outside the key, so no call touches its lost task.
    @functools.cached_property
    def _seed_all(self):
        return compiled_method(self._seed_impl)

    @functools.cached_property
    def _counts(self):
        return compiled_method(self._counts_impl)

    @functools.cached_property
    def _merge_all(self):
        return compiled_method(self._merge_impl)

    def _seed_impl(self, live: tuple[int, ...]):
        chosen = {id(self.optimizers[i]) for i in live}
        for slot, target in self.pairs:
            if id(self._owner[id(slot)]) in chosen:
                s = _keras_shim.variable_handle(slot)
                with tf.device(s.device):
                    s.assign(tf.identity(_keras_shim.variable_handle(target)))
        iterations = _keras_shim.variable_handle(self.model.optimizer.iterations)
        start = iterations.read_value() // self.num_virtual_workers
        for i in live:
            it = _keras_shim.variable_handle(self.optimizers[i].iterations)
            with tf.device(it.device):
                it.assign(tf.cast(start, it.dtype))
        return tf.cast(start, tf.int64)

    def _counts_impl(self, live: tuple[int, ...]):
        return tf.stack([tf.cast(_keras_shim.variable_handle(self.optimizers[i].iterations),
                                 tf.int64) for i in live])

    def _merge_impl(self, trained: tuple[int, ...], numbers):
        # Exactly the eager mean `add_n(slots) / n`, two rewrites of the graph optimizer
        # kept out: the divisor comes in as an argument (`numbers[k]` is k; a constant one
        # becomes a multiplication by its rounded reciprocal), and every partial sum is an
        # output of the call (kept as written; a chain of adds that only feeds an
        # assignment is collapsed into one AddN that adds in another order).
        chosen = {id(self.optimizers[i]) for i in trained}
        groups: dict[int, tuple] = {}
        for slot, target in self.pairs:
            groups.setdefault(id(target), (target, []))[1].append(slot)
        partial = []
        for target, every in groups.values():
            slots = [s for s in every if id(self._owner[id(s)]) in chosen]
            if not slots:
                continue
            t = _keras_shim.variable_handle(target)
            with tf.device(t.device):
                vals = [tf.identity(_keras_shim.variable_handle(s)) for s in slots]
                if t.dtype.is_floating:
                    total = vals[0]
                    for v in vals[1:]:   # left to right, as eager add_n adds
                        total = total + v
                        partial.append(total)
                    t.assign(total / tf.cast(numbers[len(vals)], t.dtype))
                else:
                    t.assign(vals[0])
        return partial
