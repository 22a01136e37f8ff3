"""Staleness compensation on the strategy's side: which stage objects each option makes.

`Compensation.PREDICT` gives every stage a `WeightPredictor` (pipeline/compensation.py):
forwards read their weight version moved ahead by the local updates it misses.

`Compensation.MOMENTUM` (Mitliagkas et al. 2016, "Asynchrony begets momentum"): applying a
gradient s updates late behaves like an extra, implicit momentum of about 1 - 1/(s + 1),
which adds to the optimizer's own. Compounding the two as (1 - mu_total) = (1 - mu_e) *
(1 - mu_implicit), the stage optimizers run with the explicit momentum

    mu_e = max(0, 1 - (1 - mu) * (s + 1)),   s = N_m - 1 (local staleness),

for SGD's `momentum` and Adam-family `beta_1` (the user's value is mu; the model's
optimizer keeps it, so checkpoints and `model.optimizer` show the user's configuration;
only the stage clones change, after they are built, so their slots still pair with the
model optimizer's). An optimizer with neither attribute is left as it is.

docs/convergence.md compares the options and says what each changes in Section 6.
"""

from __future__ import annotations

from typing import Callable

from hetpipe_tf.pipeline.compensation import Compensation, WeightPredictor

__all__ = ["Compensation", "reduced_momentum", "optimizer_adjustment", "predictor_factory"]

# Momentum-like hyperparameters of Keras optimizers, by attribute name.
_MOMENTUM_ATTRIBUTES = ("momentum", "beta_1")


def reduced_momentum(mu: float, staleness: int) -> float:
    """The explicit momentum that, compounded with the implicit momentum of `staleness`
    late updates, gives `mu` (never below 0)."""
    if staleness <= 0:
        return float(mu)
    return max(0.0, 1.0 - (1.0 - float(mu)) * (staleness + 1))


def optimizer_adjustment(compensation: Compensation, n_m: int
                         ) -> Callable[[object], None] | None:
    """What to do to each built stage optimizer (None: nothing)."""
    if compensation is not Compensation.MOMENTUM or n_m <= 1:
        return None

    def adjust(optimizer) -> None:
        for name in _MOMENTUM_ATTRIBUTES:
            mu = getattr(optimizer, name, None)
            if isinstance(mu, (int, float)) and not isinstance(mu, bool) and mu > 0:
                # Plain attributes read when the update is traced (the first apply).
                setattr(optimizer, name, reduced_momentum(mu, n_m - 1))
    return adjust


def predictor_factory(compensation: Compensation, n_m: int
                      ) -> Callable[[str], WeightPredictor | None]:
    """device -> the stage's predictor (None without weight prediction or staleness)."""
    def make(device: str) -> WeightPredictor | None:
        if compensation is not Compensation.PREDICT or n_m <= 1:
            return None
        return WeightPredictor(device)
    return make
