"""What a staleness compensation holds in memory, for the planner (partitioner/cost.py).

Weight prediction (pipeline/weight_prediction.py) keeps, per stage, d as of each pending
weight version (`StageWeights._d_of`, one d per version in flight, each shaped like the
stage's trainable weights) and the latest d, and a forward reads predicted weights w_v + k d,
a buffer of its own where without prediction the newest version shares w_local's. Delay
compensation and Gap-Aware (pipeline/delay_compensation.py, gap_aware.py) carry in d the
stage's last N_m updates and one more term (ms, C*C): consecutive versions' windows share
N_m - 1 updates, so each version adds one update and one such term.

Measured (benchmarks/memory_benchmark.py --compensation, docs/memory.md "Staleness
compensation"), in copies of the stage's trainable weights at N_m > 1, beside w_local and
the N_m - 1 stashed versions:
  PREDICT, BOTH, ALL:   N_m = (N_m - 1) + 1        (up to N_m pending d's; or, once the
                        stage took the newest version, its predicted weights and the
                        latest d: 2 <= N_m)
  BOTH_DC, BOTH_GA:     3 N_m - 1 = 3 (N_m - 1) + 2  (N_m pending versions' windows:
                        2 N_m - 1 distinct updates and N_m ms or C*C terms)
  NONE, MOMENTUM, AVERAGE: nothing (no predictor exists).
The counts are the `memory` column of `pipeline/compensation.TABLE`; the partitioner takes
them as plain counts (`PredictionMemory`) and imports nothing of the pipeline.
"""

from __future__ import annotations

from hetpipe_tf.partitioner.cost import PredictionMemory
from hetpipe_tf.pipeline.compensation import Compensation

__all__ = ["prediction_memory"]


def prediction_memory(compensation) -> PredictionMemory | None:
    """The extra trainable-sized copies `compensation` keeps (None: none). Accepts a
    Compensation, its name, or None (no compensation)."""
    if compensation is None:
        return None
    return Compensation.parse(compensation).memory
