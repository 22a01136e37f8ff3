"""The pick of N_m, D and allocation by predicted time to accuracy on a described cluster.

Time to accuracy = epochs to the target x seconds per epoch. For each candidate
configuration the caller gives the cluster model's seconds per minibatch (the simulator
on that cluster: every VW's pipeline, the network, the WSP waits at that D; not the
stages' max or sum alone), and an `EpochModel` gives its epochs to the target:

    epochs(N_m, D) = base_epochs x (1 + local x (N_m - 1)) x (1 + global_ x log2(1 + D))

local: relative epochs per minibatch of local staleness (N_m - 1, Section 4);
global_: relative epochs per doubling of 1 + D (Section 5's global staleness: the
measured cost of D = 4 is most of that of D = 32, which a linear term cannot fit). Both
are measured under the virtual clock by experiments/paper_time_to_accuracy.py, with and
without staleness compensation (`EPOCH_MODELS`; docs/time_to_accuracy.md "The defaults"
names each figure and the command that prints it). Then

    seconds to target = epochs(N_m, D) x minibatches per epoch x seconds per minibatch,

and the pick is the candidate with the fewest; ties go to the smaller N_m, then the
smaller D (less staleness for the same predicted time), then the first given. Pure: no
TensorFlow, no simulator; the callers build the candidates: strategy/planning.py
(`plan_for_time_to_accuracy`: allocation x N_m x D under the strategy's cluster model,
each not given) and the paper TTA binary (experiments/_paper_tta.py `pick`).
"""

from __future__ import annotations

import dataclasses
import math
import sys
from typing import Sequence

from hetpipe_tf._args import check_int, check_number

__all__ = ["Candidate", "EpochModel", "EPOCH_MODELS", "Prediction", "Pick", "epoch_model",
           "pick_for_time_to_accuracy"]


@dataclasses.dataclass(frozen=True)
class EpochModel:
    """Epochs to a target as a function of local (N_m) and global (D) staleness."""

    local: float
    global_: float
    base_epochs: float = 1.0   # at N_m = 1, D = 0 (1.0: relative epochs)

    def __post_init__(self) -> None:
        for name in ("local", "global_"):
            check_number(name, getattr(self, name), minimum=0.0)
        check_number("base_epochs", self.base_epochs, minimum=0.0)

    def epochs(self, n_m: int, clock_distance: int) -> float:
        return (self.base_epochs * (1.0 + self.local * (n_m - 1))
                * (1.0 + self.global_ * math.log2(1 + clock_distance)))

    def with_base(self, base_epochs: float) -> EpochModel:
        return dataclasses.replace(self, base_epochs=base_epochs)


# Measured under the virtual clock on the paper's cluster (cnn task, ED-local, Adam 1e-3,
# target 0.95; docs/time_to_accuracy.md "The defaults"): without compensation, and with a
# compensation that reduces momentum (BOTH, the strategy's default). Least squares of
# log(epochs) through 5 rows each: N_m = 1, 2, 4 at D = 0 and D = 4, 32 at N_m = 4; "none"
# at D = 32 did not reach the target in 8 epochs, counted as 8.
EPOCH_MODELS = {"none": EpochModel(local=0.66, global_=0.08),
                "compensated": EpochModel(local=0.56, global_=0.0)}


def epoch_model(compensation) -> EpochModel:
    """The `EPOCH_MODELS` entry of a Compensation, its name, or None (no compensation): a
    composition counts as compensated when its parts measured an epoch cost (momentum
    reduction), as pipeline/compensation.py's `epoch_cost` reads them."""
    from hetpipe_tf.pipeline.compensation import EPOCH_COST_UNCOMPENSATED, Compensation

    if compensation is None:
        return EPOCH_MODELS["none"]
    measured = Compensation.parse(compensation).epoch_cost
    return EPOCH_MODELS["none" if measured >= EPOCH_COST_UNCOMPENSATED else "compensated"]


@dataclasses.dataclass(frozen=True)
class Candidate:
    """One configuration the caller can build, and the cluster model's time for it."""

    n_m: int
    clock_distance: int
    seconds_per_minibatch: float   # simulated: makespan / minibatches of every VW
    label: str = ""                # e.g. the allocation policy

    def __post_init__(self) -> None:
        check_int("n_m", self.n_m, minimum=1)
        check_int("clock_distance", self.clock_distance, minimum=0)
        check_number("seconds_per_minibatch", self.seconds_per_minibatch, minimum=0.0,
                     maximum=sys.float_info.max, exclusive_minimum=True,
                     hint="pass the cluster model's (simulated) time")


@dataclasses.dataclass(frozen=True)
class Prediction:
    candidate: Candidate
    epochs: float
    seconds: float   # to the target


@dataclasses.dataclass(frozen=True)
class Pick:
    """The chosen candidate and every candidate's prediction, in the order given."""

    best: Prediction
    predictions: tuple[Prediction, ...]

    def rows(self) -> list[tuple[str, ...]]:
        """A table: configuration, N_m, D, s per minibatch, epochs, seconds, picked."""
        out = [("candidate", "N_m", "D", "virtual us / minibatch", "predicted epochs",
                "predicted virtual ms to target", "")]
        for p in self.predictions:
            c = p.candidate
            out.append((c.label or "-", str(c.n_m), str(c.clock_distance),
                        f"{c.seconds_per_minibatch * 1e6:.2f}", f"{p.epochs:.2f}",
                        f"{p.seconds * 1e3:.2f}", "picked" if p is self.best else ""))
        return out


def pick_for_time_to_accuracy(candidates: Sequence[Candidate], model: EpochModel,
                              minibatches_per_epoch: float = 1.0) -> Pick:
    """The candidate with the least predicted time to the target (module docstring).
    `minibatches_per_epoch`: minibatches of all VWs in an epoch (examples / batch); 1.0
    gives seconds per epoch of work relative to it."""
    if not candidates:
        raise ValueError("The pick needs at least one candidate. Received: candidates=[]; "
                         "pass one Candidate per configuration the caller can build.")
    check_number("minibatches_per_epoch", minibatches_per_epoch, minimum=0.0)
    preds = []
    for c in candidates:
        e = model.epochs(c.n_m, c.clock_distance)
        preds.append(Prediction(c, e, e * minibatches_per_epoch * c.seconds_per_minibatch))
    best = min(enumerate(preds), key=lambda ip: (ip[1].seconds, ip[1].candidate.n_m,
                                                 ip[1].candidate.clock_distance, ip[0]))[1]
    return Pick(best, tuple(preds))
