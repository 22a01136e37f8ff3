"""Per-stage figures with exact hand-computed values."""

import pytest

from hetpipe_tf.observe import stage_stats, staleness, throughput
from hetpipe_tf.pipeline.runtime import TraceEvent
from hetpipe_tf.core.schedule import Task, TaskKind, simulate

F, B, FB = TaskKind.FORWARD, TaskKind.BACKWARD, TaskKind.FORWARD_BACKWARD


def test_busy_idle_waiting_utilisation_exact():
    rows = [(0, 1, F, 0, 1), (1, 1, FB, 1, 4), (0, 2, F, 1, 2), (0, 1, B, 4, 6),
            (1, 2, FB, 4, 7), (0, 2, B, 7, 9)]
    events = [TraceEvent(Task(j, p, k), s, e) for j, p, k, s, e in rows]
    st = stage_stats(events)
    s0, s1 = st[(0, 0)], st[(0, 1)]
    assert (s0.busy_s, s0.idle_s, s0.waiting_s, s0.span_s) == (6, 3, 0, 9)  # gaps 2..4 and 6..7
    assert (s1.busy_s, s1.idle_s, s1.waiting_s) == (6, 0, 3)  # 1 s fill, 2 s drain
    assert s0.utilisation == pytest.approx(6 / 9) and s0.time_per_minibatch_s == 3
    assert s1.minibatches == 2 and s1.tasks == 2
    assert throughput(events, batch_size=4) == pytest.approx(2 / 9 * 4)


def test_simulated_two_stage_pipeline_steady_state():
    # 2 stages, N_m = 2, forward 1 and backward 2 everywhere: stage 1 (3 per minibatch)
    # and stage 0 (3 per minibatch) are balanced.
    st = stage_stats(simulate(2, 2, 10))
    for j in (0, 1):
        assert st[(0, j)].time_per_minibatch_s == 3
        s = st[(0, j)]
        assert s.busy_s + s.idle_s + s.waiting_s == pytest.approx(s.span_s)


def test_staleness_from_record():
    record = {1: (), 2: (), 3: (1,), 4: (1, 2), 5: (1, 2, 3), 6: (1, 2, 3, 4, 5)}
    assert staleness(record) == {1: 1, 2: 2, 3: 2, 4: 2, 5: 2, 6: 1}
    assert staleness(record, [4, 5, 9]) == {4: 2, 5: 2}
    assert staleness({3: 1}) == {3: 2}
