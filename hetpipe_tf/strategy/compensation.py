"""Staleness compensation on the strategy's side: what each option gives the stages.

The stages' predictors come from the compensation's row of `pipeline/compensation.TABLE`
(`predictor_factory`); the stage optimizers' adjustment (momentum reduction, averaging) is
`optimizer_adjustment` here.

`Compensation.PREDICT` gives every stage a `WeightPredictor` (pipeline/weight_prediction.py):
forwards read their weight version moved ahead by N x k_p steps of the stage's last update,
k_p = the local updates the version misses, N = the number of virtual workers (each VW's
update stands for every VW's: the other N - 1 VWs also move w_global while p is in flight),
per tensor only while its steps repeat (the gate: momentum SGD and Adam look ahead,
RMSprop without momentum does not; docs/convergence.md "The defaults").

`Compensation.MOMENTUM` (Mitliagkas et al. 2016, "Asynchrony begets momentum"): applying a
gradient s updates late behaves like an extra, implicit momentum of about 1 - 1/(s + 1),
which adds to the optimizer's own. Compounding the two as (1 - mu_total) = (1 - mu_e) *
(1 - mu_implicit), the stage optimizers run with the explicit momentum

    mu_e = max(0, 1 - (1 - mu) * (s + 1)),
    s = (N_m - 1) + (N - 1) * N_m   (N_m - 1 local; a wave of every other VW in flight),

and s = 0 for synchronous data parallelism (N_m = 1, D = 0: nothing is stale), for SGD's
`momentum` and Adam-family `beta_1` (the user's value is mu; the model's optimizer keeps
it, so checkpoints and `model.optimizer` show the user's configuration; only the stage
clones change, after they are built, so their slots still pair with the model optimizer's).
An optimizer with neither attribute is left as it is.

`Compensation.BOTH` applies the two. `Compensation.BOTH_DC` also corrects each stage
gradient for its delay (DC-ASGD-a, pipeline/delay_compensation.py: the stage's predictor
is a `DelayCompensatedPredictor`); `Compensation.BOTH_GA` divides it by its gap instead
(Gap-Aware, pipeline/gap_aware.py: a `GapAwarePredictor`).

`Compensation.AVERAGE` scales each of N virtual workers' learning rate by 1/N
(strategy/averaging.py: a wave of N VWs then moves w_global as one synchronous step with
averaged gradients, not summed ones); `Compensation.ALL` is BOTH and AVERAGE.

docs/convergence.md compares the options and says what each changes in Section 6.
"""

from __future__ import annotations

import logging
from typing import Callable

from hetpipe_tf.pipeline.compensation import Compensation
from hetpipe_tf.pipeline.weight_prediction import WeightPredictor
from hetpipe_tf.strategy.averaging import averaging_adjustment

__all__ = ["Compensation", "implied_staleness", "reduced_momentum", "optimizer_adjustment",
           "predicts", "predictor_factory", "log_choice"]

logger = logging.getLogger(__name__)

# Momentum-like hyperparameters of Keras optimizers, by attribute name.
_MOMENTUM_ATTRIBUTES = ("momentum", "beta_1")


def reduced_momentum(mu: float, staleness: int) -> float:
    """The explicit momentum that, compounded with the implicit momentum of `staleness`
    late updates, gives `mu` (never below 0)."""
    if staleness <= 0:
        return float(mu)
    return max(0.0, 1.0 - (1.0 - float(mu)) * (staleness + 1))


def implied_staleness(n_m: int | None, num_vws: int = 1, clock_distance: int = 0) -> int:
    """s of the momentum reduction (module docstring); n_m None (no pipeline, e.g. HetSeq
    mode) counts as 1."""
    n_m = n_m or 1
    if n_m <= 1 and (num_vws <= 1 or clock_distance == 0):
        return 0   # sequential training, or synchronous data parallelism
    return (n_m - 1) + (num_vws - 1) * n_m


def optimizer_adjustment(compensation: Compensation, n_m: int | None, num_vws: int = 1,
                         clock_distance: int = 0) -> Callable[[object], None] | None:
    """What to do to each built stage optimizer (None: nothing)."""
    s = implied_staleness(n_m, num_vws, clock_distance)
    average = averaging_adjustment(num_vws) if compensation.averages else None
    if not compensation.reduces_momentum or s == 0:
        return average

    def adjust(optimizer) -> None:
        for name in _MOMENTUM_ATTRIBUTES:
            mu = getattr(optimizer, name, None)
            if isinstance(mu, (int, float)) and not isinstance(mu, bool) and mu > 0:
                # Plain attributes read when the update is traced (the first apply).
                setattr(optimizer, name, reduced_momentum(mu, s))
        if average is not None:
            average(optimizer)
    return adjust


def predicts(compensation: Compensation, n_m: int | None) -> bool:
    """Whether stages get a predictor: a part that keeps stage state (weight prediction, a
    gradient correction) and local staleness (with N_m = 1 no version misses a local
    update)."""
    return compensation.has_predictor and (n_m or 1) > 1


def predictor_factory(compensation: Compensation, n_m: int | None, num_vws: int = 1
                      ) -> Callable[[str], WeightPredictor | None]:
    """device -> the stage's predictor (None where `predicts` is False)."""
    def make(device: str) -> WeightPredictor | None:
        if not predicts(compensation, n_m):
            return None
        return compensation.make_predictor(device, n_m, num_vws)
    return make


def log_choice(compensation: Compensation, by_default: bool, n_m: int | None,
               num_vws: int = 1, clock_distance: int = 0, adjusted: bool = False) -> None:
    """Name the compensation in the log where it changes training (`adjusted`: the stage
    optimizers get an `optimizer_adjustment`), so a user comparing against the paper's
    rules sees that it is on and how to turn it off."""
    if not (adjusted or predicts(compensation, n_m)):
        return   # e.g. PREDICT at N_m = 1: no predictor exists, training is unchanged
    s = implied_staleness(n_m, num_vws, clock_distance)
    logger.info(
        "Staleness compensation %s%s for %d virtual worker(s) at N_m=%s, D=%d (implied "
        "staleness %d; docs/convergence.md). Pass compensation=\"none\" to train by the "
        "paper's rules exactly%s.", compensation.name,
        " (the default)" if by_default else "", num_vws, n_m, clock_distance, s,
        ", or \"predict\" to keep the optimizer's momentum (closer to plain Keras where "
        "staleness does not destabilise training)" if compensation.reduces_momentum else
        ", or \"both\" to also lower momentum if momentum SGD diverges under staleness")
