"""N_m chosen for time to accuracy (strategy/defaults.py): the rule against a brute-force
reference written here, and the planner's default through the strategy."""

import itertools

import keras
import pytest

from hetpipe_tf.strategy.compensation import Compensation
from hetpipe_tf.strategy.defaults import (epoch_cost, n_m_for_time_to_accuracy, pace_s,
                                          STALENESS_EPOCH_COST)


def _reference(times_per_vw, n_max, cost):
    """Simulate each pipeline: n_m minibatches in flight, every stage one at a time; the
    steady-state seconds per minibatch is the larger of the busiest stage's time and one
    round trip through all stages shared by n_m minibatches; then the epoch cost."""
    best, best_score = None, None
    for n in range(1, n_max + 1):
        pace = 0.0
        for times in times_per_vw:
            pace = max(pace, max(max(times), sum(times) / n))
        score = pace * (1 + cost * (n - 1))
        if best_score is None or score < best_score - 1e-15:
            best, best_score = n, score
    return best


def test_pace_fills_the_pipeline():
    assert pace_s([1.0, 1.0], 1) == 2.0 and pace_s([1.0, 1.0], 2) == 1.0
    assert pace_s([1.0, 3.0], 4) == 3.0
    with pytest.raises(ValueError, match="n_m=0"):
        pace_s([1.0], 0)


def test_rule_equals_the_reference_on_a_grid():
    grid = [0.5, 1.0, 2.0]
    for times in itertools.product(grid, repeat=3):
        for other in ([1.0, 1.0, 1.0], [3.0, 0.5, 0.5]):
            for cost in (0.0, 0.25, 1.0, 2.5):
                for n_max in (1, 2, 3, 5):
                    vws = [list(times), other]
                    assert n_m_for_time_to_accuracy(vws, n_max, cost) == \
                        _reference(vws, n_max, cost), (vws, n_max, cost)


def test_cost_decides_between_throughput_and_staleness():
    balanced = [[1.0, 1.0]]
    assert n_m_for_time_to_accuracy(balanced, 2, 0.0) == 2      # throughput alone
    assert n_m_for_time_to_accuracy(balanced, 2, 0.25) == 2     # 2x pace > 1.25x epochs
    assert n_m_for_time_to_accuracy(balanced, 2, 2.5) == 1      # 2x pace < 3.5x epochs
    assert n_m_for_time_to_accuracy([[1.0, 0.2]], 2, 0.25) == 1  # unbalanced: 1.2x pace
    assert epoch_cost(Compensation.NONE) == STALENESS_EPOCH_COST["none"]
    assert epoch_cost("average") == STALENESS_EPOCH_COST["none"]   # no local compensation
    # PREDICT alone leaves momentum SGD's N_m = 2 collapse partly open, so with it the
    # default N_m is chosen as without compensation.
    assert epoch_cost(Compensation.PREDICT) == STALENESS_EPOCH_COST["none"]
    assert epoch_cost(Compensation.ALL) == epoch_cost("both") == \
        STALENESS_EPOCH_COST["compensated"]
    # A composition is costed by its parts: momentum reduction is the measured help.
    assert epoch_cost(None) == epoch_cost("predict+average") == STALENESS_EPOCH_COST["none"]
    assert epoch_cost("momentum+average") == STALENESS_EPOCH_COST["compensated"]
    with pytest.raises(ValueError, match="compensation='lookahead'"):
        epoch_cost("lookahead")
