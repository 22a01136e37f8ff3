"""The training state of several virtual workers as ONE value: the model and its optimizer.

Between runs (a run ends whenever the pipeline drains: every epoch end, before evaluate,
predict and a checkpoint, after an abort) the Keras model and `model.optimizer` hold the
whole state, exactly as for plain Keras, so `ModelCheckpoint`, `BackupAndRestore`,
`model.save`, `keras.models.load_model` and `tf.train.Checkpoint` keep all of it and a
checkpoint does not depend on the layout that wrote it. During a run each virtual worker
(VW) trains its own copy:

- weights: w_global on the parameter servers, w_local per VW (docs/wsp.md);
- optimizer: each VW applies its updates with its own optimizer (a clone of the model's,
  built on its w_local), so its slots (momentum, Adam's moments) are its own, as each
  worker's are under parameter-server training. The learning rate is the model
  optimizer's variable itself, so callbacks (LearningRateScheduler, ReduceLROnPlateau) and
  `model.optimizer.learning_rate = x` reach every VW at its next update; a
  `LearningRateSchedule` is evaluated per VW at the VW's own update count (one VW: exactly
  Keras). `model.optimizer.iterations` counts every update applied by any VW (one per
  minibatch), live.

The rule at run boundaries (`merge` at a run's end, `seed` at the next run's start):
several become one: the model optimizer's slots := the mean of the VWs' slots; one
becomes several: every VW's slots := the model optimizer's slots and its iteration count
:= model.optimizer.iterations // number of VWs (so Adam's bias correction continues
where one worker of the cluster would be). With one VW no state is copied: its optimizer IS
the model's and w_local IS the model's variables.
"""

from __future__ import annotations

from typing import Sequence

import keras
import tensorflow as tf

from hetpipe_tf import _keras_shim


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


def check_optimizer(optimizer) -> None:
    """Optimizers whose state the pipeline cannot carry are refused before training."""
    if isinstance(optimizer, keras.optimizers.LossScaleOptimizer):
        return  # refused with its own message by validation.check_model
    if getattr(optimizer, "gradient_accumulation_steps", None):
        raise ValueError(
            "HetPipeStrategy does not support gradient accumulation in the optimizer (each "
            "minibatch's update is applied when it completes; a pipeline accumulates nothing "
            "across minibatches). Received: gradient_accumulation_steps="
            f"{optimizer.gradient_accumulation_steps}; remove it, or raise the batch size.")


def build_canonical(model) -> None:
    """Build the model's optimizer on the model's trainable variables (in its strategy's
    scope), so its slots exist before training and checkpoints hold them."""
    optimizer = model.optimizer
    if not optimizer.built:
        with model.distribute_strategy.scope():
            optimizer.build(model.trainable_variables)


def clone_optimizer(model, variables: Sequence, strategy) -> keras.optimizers.Optimizer:
    """A VW's optimizer: the model optimizer's config, built on `variables` (the VW's w_local
    copies of `model.trainable_variables`, same order) in `strategy`'s scope, sharing the
    model optimizer's learning rate."""
    base = model.optimizer
    with strategy.scope():
        clone = keras.optimizers.deserialize(keras.optimizers.serialize(base))
        lr = _keras_shim.optimizer_learning_rate(base)
        if isinstance(lr, keras.Variable):
            # One learning-rate variable for every VW: hyperparameter changes reach them all.
            own = _keras_shim.optimizer_learning_rate(clone)
            _keras_shim.set_optimizer_learning_rate(clone, lr)
            object.__setattr__(clone, "_hetpipe_own_lr", own)
        elif isinstance(lr, keras.optimizers.schedules.LearningRateSchedule):
            _keras_shim.set_optimizer_learning_rate(clone, lr)
        clone.build(list(variables))
    mine, theirs = _slots(clone), _slots(base)
    if len(mine) != len(theirs) or any(tuple(a.shape) != tuple(b.shape)
                                       for a, b in zip(mine, theirs)):
        raise ValueError(
            "The optimizer's state of a virtual worker does not line up with the model "
            f"optimizer's. Received: optimizer {type(base).__name__} with {len(theirs)} slot "
            f"variables on the model and {len(mine)} on a virtual worker; use an optimizer "
            "whose state is one variable per model variable and a step counter.")
    return clone


def merge(model, clones: Sequence) -> None:
    """Several become one: the model optimizer's slots := the mean of the VWs' slots."""
    if not clones:
        return
    per_vw = [_slots(c) for c in clones]
    for k, target in enumerate(_slots(model.optimizer)):
        t = _keras_shim.variable_handle(target)
        with tf.device(t.device):
            vals = [tf.identity(_keras_shim.variable_handle(s[k])) for s in per_vw]
            # Run boundaries only (not per minibatch): eager ops are fine here.
            t.assign(tf.add_n(vals) / len(vals) if t.dtype.is_floating else vals[0])


def seed(model, clones: Sequence) -> None:
    """One becomes several: every VW's slots := the model optimizer's, its iteration count :=
    model.optimizer.iterations // number of VWs."""
    if not clones:
        return
    base = model.optimizer
    sources = [tf.identity(_keras_shim.variable_handle(v)) for v in _slots(base)]
    start = int(base.iterations.numpy()) // len(clones)
    for c in clones:
        for target, value in zip(_slots(c), sources):
            t = _keras_shim.variable_handle(target)
            with tf.device(t.device):
                t.assign(value)
        _keras_shim.variable_handle(c.iterations).assign(start)
