"""N_m when the user gives none: chosen for time to accuracy, not for throughput alone.

Time to accuracy = (seconds per minibatch) x (minibatches to the target). More minibatches
in flight fill the pipeline (seconds per minibatch fall from the sum of the stage times
towards the slowest stage's), but each one more is one more update of local staleness
(paper Section 4), which costs epochs to a target accuracy. The rule weighs both:

    N_m* = argmin over n in 1..N_max of  pace(n) x (1 + c x (n - 1)),
    pace(n) = max(slowest stage, sum of stage times / n)   (per virtual worker; the
              slowest VW's pace counts, as WSP holds the others to it over time),

with N_max = min(Max_m, k) (what the planner chose before: more only adds staleness), c the
measured relative epoch cost of one minibatch of local staleness (docs/convergence.md,
"Defaults"), larger without compensation than with it. Ties go to the smaller N_m (less
staleness for the same predicted time). With c = 0 the rule is the throughput default.

The stage times are the plan's predicted ones (`StagePlan.time_s`), at the N_max plan's
partition; the chosen N_m is then planned again (memory only shrinks with fewer minibatches
in flight). D keeps its default, 0 (docs/convergence.md: D = 0, 4, 32 measured alike).

This rule is the planner's when the strategy has no cluster model (this machine's time).
With one (`clock=VirtualClock(cluster)`), N_m is picked in that model instead, jointly
with D and the allocation where the user gave none: its simulated seconds per minibatch
and the epoch model measured under the virtual clock (strategy/planning.py
`plan_for_time_to_accuracy`, strategy/pick.py, docs/time_to_accuracy.md "The defaults").
"""

from __future__ import annotations

from typing import Sequence

from hetpipe_tf.pipeline.compensation import EPOCH_COST_UNCOMPENSATED, Compensation

__all__ = ["STALENESS_EPOCH_COST", "epoch_cost", "pace_s", "n_m_for_time_to_accuracy"]

# Relative epochs to the target per minibatch of local staleness, measured on the
# time-to-accuracy benchmark (docs/convergence.md, "Defaults"): without compensation and
# with BOTH. Each compensation's cost is its row of pipeline/compensation.TABLE.
STALENESS_EPOCH_COST = {"none": EPOCH_COST_UNCOMPENSATED,
                        "compensated": Compensation.BOTH.epoch_cost}


def epoch_cost(compensation) -> float:
    """c of the rule for a Compensation, its name, or None (no compensation)."""
    if compensation is None:
        return EPOCH_COST_UNCOMPENSATED
    return Compensation.parse(compensation).epoch_cost


def pace_s(stage_times: Sequence[float], n_m: int) -> float:
    """Predicted seconds per minibatch of one pipeline with `n_m` minibatches in flight."""
    if not stage_times or n_m < 1:
        raise ValueError(f"A pipeline needs stages and n_m >= 1. Received: "
                         f"stage_times={list(stage_times)!r}, n_m={n_m!r}.")
    return max(max(stage_times), sum(stage_times) / n_m)


def n_m_for_time_to_accuracy(stage_times_per_vw: Sequence[Sequence[float]], n_max: int,
                             cost: float) -> int:
    """The rule of the module docstring over every VW's predicted stage times."""
    if n_max < 1 or cost < 0:
        raise ValueError(f"n_max must be >= 1 and cost >= 0. Received: n_max={n_max!r}, "
                         f"cost={cost!r}.")

    def score(n: int) -> float:
        return max(pace_s(t, n) for t in stage_times_per_vw) * (1.0 + cost * (n - 1))
    return min(range(1, n_max + 1), key=lambda n: (score(n), n))
