"""The pure Section 4 rules: exact values and properties (no TensorFlow)."""

import pytest
from hypothesis import given, settings, strategies as st

from hetpipe_tf.core import schedule as sch
from hetpipe_tf.core.schedule import Task, TaskKind

F, B, FB = TaskKind.FORWARD, TaskKind.BACKWARD, TaskKind.FORWARD_BACKWARD


def test_reflected_updates_exact_values():
    # N_m = 3: minibatches 1..3 use w_0; 4 uses u_1; 7 uses u_1..u_4.
    assert [sch.last_reflected_update(p, 3) for p in range(1, 9)] == [0, 0, 0, 1, 2, 3, 4, 5]
    assert sch.reflected_updates(7, 3) == (1, 2, 3, 4)
    assert sch.reflected_updates(1, 1) == ()
    assert sch.reflected_updates(5, 1) == (1, 2, 3, 4)  # N_m = 1: no staleness
    # A run that starts at minibatch 9 (after a drain): 9..11 use everything before it.
    assert [sch.last_reflected_update(p, 3, run_start=9) for p in range(9, 14)] == [8, 8, 8, 9, 10]


def test_reflected_updates_rejects_bad_input():
    with pytest.raises(ValueError, match="Received: n_m=0"):
        sch.last_reflected_update(1, 0)
    with pytest.raises(ValueError, match="run_start"):
        sch.last_reflected_update(3, 2, run_start=5)


def test_wave_and_may_start():
    assert [sch.wave_of(p, 4) for p in (1, 4, 5, 8, 9)] == [0, 0, 1, 1, 2]
    assert sch.may_start(4, completed=1, n_m=3) and not sch.may_start(5, completed=1, n_m=3)


def test_held_minibatches_rule():
    assert [sch.held_minibatches(j, 4, 5) for j in range(4)] == [5, 5, 5, 1]
    assert sch.held_minibatches(0, 1, 3) == 1


@settings(max_examples=40, deadline=None)
@given(k=st.integers(1, 5), n_m=st.integers(1, 5))
def test_held_minibatches_is_reached_when_the_last_stage_is_the_bottleneck(k, n_m):
    # Peak of forwards started and not yet backwarded per stage, read off the trace.
    fwd = [1.0] * (k - 1) + [20.0]
    order = sch.per_stage_order(sch.simulate(k, n_m, 3 * n_m, forward_time=fwd))
    peaks = []
    for j in range(k):
        alive = peak = 0
        for t in order[j]:
            alive += t.kind is not B
            peak = max(peak, alive)
            alive -= t.kind is not F
        peaks.append(peak)
    assert peaks == [sch.held_minibatches(j, k, n_m) for j in range(k)]


def test_check_trace_refuses_more_than_n_m_in_flight():
    order = {0: [Task(0, 1, F), Task(0, 2, F), Task(0, 3, F), Task(0, 1, B), Task(0, 2, B),
                 Task(0, 3, B)], 1: [Task(1, p, FB) for p in (1, 2, 3)]}
    sch.check_trace(order, 2, 3)
    with pytest.raises(sch.ScheduleViolation, match="more than N_m=2 minibatches"):
        sch.check_trace(order, 2, 2)


def test_simulate_two_stages_exact_order():
    # k = 2, N_m = 2, fwd 1, bwd 2 (last stage fwd+bwd = 3).
    ev = sch.simulate(2, 2, 4)
    order = sch.per_stage_order(ev)
    assert order[0] == [Task(0, 1, F), Task(0, 2, F), Task(0, 1, B), Task(0, 3, F),
                        Task(0, 2, B), Task(0, 4, F), Task(0, 3, B), Task(0, 4, B)]
    assert order[1] == [Task(1, p, FB) for p in (1, 2, 3, 4)]
    times = {(e.task.stage, e.task.minibatch, e.task.kind): (e.start, e.end) for e in ev}
    assert times[(0, 1, B)] == (4.0, 6.0)
    # Continuity: minibatch 3 = 1 + N_m starts the moment 1 completes.
    assert times[(0, 3, F)][0] == times[(0, 1, B)][1]


def test_simulate_one_stage_is_sequential():
    ev = sch.simulate(1, 3, 3, forward_time=[1.0], backward_time=[1.0])
    assert [(e.task.minibatch, e.start, e.end) for e in ev] == [(1, 0, 2), (2, 2, 4), (3, 4, 6)]


def test_pipelining_speeds_up_balanced_stages():
    # 4 balanced stages: N_m = 4 approaches k-fold throughput of N_m = 1.
    def makespan(n_m):
        return max(e.end for e in sch.simulate(4, n_m, 64, [1.0] * 4, [1.0] * 4))
    assert makespan(1) == 64 * 8
    assert makespan(1) / makespan(4) > 3.0


@settings(max_examples=60, deadline=None)
@given(k=st.integers(1, 5), n_m=st.integers(1, 6), n=st.integers(0, 25),
       fwd=st.lists(st.floats(0.1, 3.0), min_size=5, max_size=5),
       bwd=st.lists(st.floats(0.1, 3.0), min_size=5, max_size=5))
def test_simulation_obeys_section4_rules(k, n_m, n, fwd, bwd):
    ev = sch.simulate(k, n_m, n, fwd[:k], bwd[:k])
    order = sch.per_stage_order(ev)
    sch.check_trace(order, k, n_m)
    # Every minibatch runs every task exactly once.
    assert len(ev) == n * (2 * k - 1)
    # No stage runs two tasks at once, and no task starts before it is ready.
    for j, tasks in order.items():
        spans = sorted((e.start, e.end) for e in ev if e.task.stage == j)
        assert all(a[1] <= b[0] + 1e-9 for a, b in zip(spans, spans[1:]))
    assert all(e.start >= e.ready - 1e-9 for e in ev)
    # Continuity: p + N_m enters stage 0 exactly when p completes, unless stage 0 is busy.
    done = {e.task.minibatch: e.end for e in ev
            if e.task.stage == 0 and e.task.kind in (B, FB)}
    starts = {e.task.minibatch: e for e in ev
              if e.task.stage == 0 and e.task.kind in (F, FB)}
    for p in range(1, n - n_m + 1):
        assert starts[p + n_m].ready == pytest.approx(done[p])


@settings(max_examples=40, deadline=None)
@given(n_m=st.integers(1, 8), p=st.integers(1, 200), offset=st.integers(0, 50))
def test_reflected_updates_properties(n_m, p, offset):
    run_start = max(1, p - offset)
    got = sch.reflected_updates(p, n_m, run_start)
    assert got == tuple(range(1, len(got) + 1))          # a prefix of the update ids
    assert len(got) <= p - 1                             # never its own or later updates
    assert p - 1 - len(got) <= n_m - 1                   # at most s_local = N_m-1 missing
    if p >= run_start + n_m:
        assert len(got) == p - n_m                       # exactly 1..p-N_m
    else:
        assert len(got) == run_start - 1                 # the run's starting weights


def test_check_trace_catches_violations():
    with pytest.raises(sch.ScheduleViolation, match="out of order"):
        sch.check_trace({0: [Task(0, 2, F), Task(0, 1, F)], 1: []}, 2, 2)
    with pytest.raises(sch.ScheduleViolation, match="in flight"):
        sch.check_trace({0: [Task(0, 1, F), Task(0, 2, F), Task(0, 3, F)]}, 2, 2)
    with pytest.raises(sch.ScheduleViolation, match="one task"):
        sch.check_trace({0: [], 1: [Task(1, 1, F)]}, 2, 2)


# --- each stage's update, where the runtime runs it --------------------------------------
def _spans(events):
    return {(e.task.stage, e.task.minibatch, e.task.kind): (e.start, e.end) for e in events}


def test_two_stages_by_hand():
    # N_m = 1. p=1: F0 0-1, FB1 1-4, B0 4-6; commit at 6: stage 1's apply is queued (ready
    # 6), stage 0 applies 6-6.5 and p=1 completes; p=2: F0 6.5-7.5; stage 1 runs its apply
    # 6-9 first (FIFO), then FB1(2) 9-12; B0(2) 12-14; applies 14-14.5 and 14-17.
    ev = sch.simulate(2, 1, 2, [1, 1], [2, 2], update_time=[0.5, 3])
    assert _spans(ev) == {
        (0, 1, TaskKind.FORWARD): (0, 1), (1, 1, TaskKind.FORWARD_BACKWARD): (1, 4),
        (0, 1, TaskKind.BACKWARD): (4, 6), (0, 1, TaskKind.APPLY): (6, 6.5), (1, 1, TaskKind.APPLY): (6, 9),
        (0, 2, TaskKind.FORWARD): (6.5, 7.5), (1, 2, TaskKind.FORWARD_BACKWARD): (9, 12),
        (0, 2, TaskKind.BACKWARD): (12, 14), (0, 2, TaskKind.APPLY): (14, 14.5),
        (1, 2, TaskKind.APPLY): (14, 17)}


def test_one_stage_update_follows_its_task():
    ev = sch.simulate(1, 2, 3, [1], [2], update_time=[0.5])
    # p=1, 2 enter at 0: 0-3, apply 3-3.5 (p=1 done -> p=3 ready 3.5), p=2 3.5-6.5, ...
    assert [(e.task.minibatch, e.task.kind, e.start, e.end) for e in ev] == [
        (1, TaskKind.FORWARD_BACKWARD, 0, 3), (1, TaskKind.APPLY, 3, 3.5),
        (2, TaskKind.FORWARD_BACKWARD, 3.5, 6.5), (2, TaskKind.APPLY, 6.5, 7),
        (3, TaskKind.FORWARD_BACKWARD, 7, 10), (3, TaskKind.APPLY, 10, 10.5)]


_times = st.lists(st.sampled_from([0.0, 0.5, 1.0, 2.0, 3.0]), min_size=4, max_size=4)


@settings(max_examples=150, deadline=None)
@given(k=st.integers(1, 4), n_m=st.integers(1, 4), m=st.integers(0, 12), f=_times, b=_times,
       arrivals=st.lists(st.sampled_from([0.0, 1.0, 5.0]), min_size=12, max_size=12))
def test_zero_updates_change_nothing(k, n_m, m, f, b, arrivals):
    arr = sorted(arrivals[:m])
    assert sch.simulate(k, n_m, m, f[:k], b[:k], arrival=arr, update_time=[0.0] * k) == \
        sch.simulate(k, n_m, m, f[:k], b[:k], arrival=arr)


@settings(max_examples=150, deadline=None)
@given(k=st.integers(1, 4), n_m=st.integers(1, 4), m=st.integers(1, 10), f=_times, b=_times,
       u=_times)
def test_updates_where_the_runtime_runs_them(k, n_m, m, f, b, u):
    ev = sch.simulate(k, n_m, m, f[:k], b[:k], update_time=u[:k])
    spans = _spans(ev)
    last = TaskKind.FORWARD_BACKWARD if k == 1 else TaskKind.BACKWARD
    for j in range(k):   # a stage runs one task at a time, and every update once
        mine = sorted((e.start, e.end) for e in ev if e.task.stage == j)
        assert all(a[1] <= c[0] + 1e-12 for a, c in zip(mine, mine[1:]))
        assert sum(e.task.kind is TaskKind.APPLY for e in ev if e.task.stage == j) == (m if u[j] else 0)
    for p in range(1, m + 1):
        commit = spans[(0, p, last)][1]
        done = spans[(0, p, TaskKind.APPLY)][1] if u[0] else commit
        if u[0]:
            assert spans[(0, p, TaskKind.APPLY)] == (commit, commit + u[0])
        if p + n_m <= m:
            assert spans[(0, p + n_m, TaskKind.FORWARD if k > 1 else last)][0] >= done
        for j in range(1, k):
            if not u[j]:
                continue
            start, end = spans[(j, p, TaskKind.APPLY)]
            assert start >= commit and end == pytest.approx(start + u[j])
            if p + n_m <= m:   # the version of p + N_m exists before its forward there
                first = TaskKind.FORWARD_BACKWARD if j == k - 1 else TaskKind.FORWARD
                assert spans[(j, p + n_m, first)][0] >= end


def test_bad_update_times():
    with pytest.raises(ValueError, match="one value per stage"):
        sch.simulate(2, 1, 2, [1, 1], [1, 1], update_time=[1.0])
    with pytest.raises(ValueError, match="update_time must be >= 0"):
        sch.simulate(2, 1, 2, [1, 1], [1, 1], update_time=[1.0, -1.0])
