"""Staleness compensation by averaging: each of N virtual workers' updates scaled by 1/N.

Under WSP every VW applies its own optimizer's update for each minibatch it trains and
pushes the sum of a wave's updates; w_global receives the SUM of the N VWs' updates
(paper Section 5). With N_m = 1 and D = 0 that is synchronous SGD over N minibatches with
the updates summed: the learning rate of `tf.distribute.MirroredStrategy` or Horovod
(which average the gradients) times N, the "linear scaling rule" applied silently. With
momentum SGD at a step that is already large for one worker (lr 0.05, momentum 0.9 on the
digits MLP: lr / (1 - mu) = 0.5 gradients a step), N times that step costs accuracy even
without staleness, and more with it (docs/convergence.md, measurements).

`Compensation.AVERAGE` (and `ALL`) scales every stage optimizer's learning rate by 1/N, so
that one wave of the N VWs moves w_global as far as one synchronous step with the
gradients averaged (exactly so for SGD with or without momentum, each VW keeping its own
momentum; for Adam each VW's update is its moment-normalised step / N). The stage
optimizers read the model optimizer's learning rate through a callable, so a schedule, a
`LearningRateScheduler` callback or `model.optimizer.learning_rate = x` still reach every
stage (scaled); `model.optimizer` keeps the user's value, and so checkpoints do.

With one VW nothing changes (N = 1). HetSeq mode refuses compensation (its one update per
batch is already an average by the shares' sizes, docs/hetseq.md).
"""

from __future__ import annotations

from typing import Callable

import keras

from hetpipe_tf import _shim as _keras_shim
from hetpipe_tf._args import check_int

__all__ = ["averaging_scale", "scale_learning_rate", "averaging_adjustment"]


def averaging_scale(num_vws: int) -> float:
    """The factor of each VW's learning rate: 1 / N."""
    return 1.0 / check_int("num_vws", num_vws, minimum=1,
                           hint="the number of virtual workers is at least 1")


def scale_learning_rate(optimizer, scale: float) -> None:
    """Make `optimizer` read `scale` times the learning rate it reads now (a Variable it
    shares with the model's optimizer, a schedule of its own step counter, or a callable),
    evaluated at each update, so later changes of the shared rate reach it."""
    lr = _keras_shim.optimizer_learning_rate(optimizer)
    if isinstance(lr, keras.optimizers.schedules.LearningRateSchedule):
        def rate():
            return lr(optimizer.iterations) * scale
    elif callable(lr) and not isinstance(lr, keras.Variable):
        def rate():
            return lr() * scale
    else:   # a Variable (the model optimizer's, shared by every stage)
        def rate():
            return lr * scale
    _keras_shim.set_optimizer_learning_rate(optimizer, rate)


def averaging_adjustment(num_vws: int) -> Callable[[object], None] | None:
    """What to do to each built stage optimizer for AVERAGE (None with one VW)."""
    scale = averaging_scale(num_vws)
    if scale == 1.0:
        return None
    return lambda optimizer: scale_learning_rate(optimizer, scale)
