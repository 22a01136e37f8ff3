"""Synchronous schedules as action lists: exact values, checks and properties."""

import pytest
from hypothesis import given, settings, strategies as st

from hetpipe_tf.core import sync_schedule as ss
from hetpipe_tf.core.sync_schedule import Action, ActionKind, Schedule, ScheduleError


def _short(lists):
    return [" ".join(f"{a.kind.value}{'' if a.micro_batch < 0 else a.micro_batch}"
                     for a in acts) for acts in lists]


def test_gpipe_exact():
    assert _short(ss.gpipe(2, 3)) == ["F0 F1 F2 B0 B1 B2 U", "F0 F1 F2 B0 B1 B2 U"]


def test_one_f_one_b_exact():
    # K = 4, M = 6 (PipeDream-flush): stage j warms up with K - 1 - j forwards.
    assert _short(ss.one_f_one_b(4, 6)) == [
        "F0 F1 F2 F3 B0 F4 B1 F5 B2 B3 B4 B5 U",
        "F0 F1 F2 B0 F3 B1 F4 B2 F5 B3 B4 B5 U",
        "F0 F1 B0 F2 B1 F3 B2 F4 B3 F5 B4 B5 U",
        "F0 B0 F1 B1 F2 B2 F3 B3 F4 B4 F5 B5 U"]
    # M < K: the warm-up is cut to M.
    assert _short(ss.one_f_one_b(4, 2))[0] == "F0 F1 B0 B1 U"
    assert _short(ss.one_f_one_b(1, 2)) == ["F0 B0 F1 B1 U"]


def test_schedule_enum():
    assert Schedule.parse("gpipe") is Schedule.GPIPE
    assert Schedule.parse("ONE_F_ONE_B") is Schedule.ONE_F_ONE_B
    assert not Schedule.HETPIPE.synchronous and Schedule.GPIPE.synchronous
    with pytest.raises(ValueError, match="Received: schedule='pipedream'"):
        Schedule.parse("pipedream")
    with pytest.raises(ValueError, match="asynchronous"):
        ss.actions(Schedule.HETPIPE, 2, 2)
    with pytest.raises(ValueError, match="micro_batches=0"):
        ss.gpipe(2, 0)
    assert Schedule.parse("1F1B") is Schedule.ONE_F_ONE_B
    assert Schedule.parse("one-f-one-b") is Schedule.ONE_F_ONE_B


def test_held_is_each_schedules_own_rule():
    # Read off the schedule's own lists: GPipe M everywhere, 1F1B min(K - j, M).
    assert Schedule.GPIPE.held(3, 4) == (4, 4, 4)
    assert Schedule.ONE_F_ONE_B.held(3, 4) == (3, 2, 1)
    assert Schedule.ONE_F_ONE_B.held(4, 2) == (2, 2, 2, 1)
    # HETPIPE: minibatches, N_m on every stage but the last.
    assert Schedule.HETPIPE.held(3, 4) == (4, 4, 1)
    for s in Schedule:
        if s.synchronous:
            assert s.held(3, 5) == tuple(ss.peak_alive(a) for a in ss.actions(s, 3, 5))


def test_check_refuses_bad_lists():
    good = ss.gpipe(2, 2)
    with pytest.raises(ScheduleError, match="deadlocks"):
        # Stage 0 runs B0 before F1 while stage 1 waits for F1 before its B0: fine; but
        # stage 1 doing B0 before F0 of its own is impossible.
        ss.check_actions((good[0], (Action(ActionKind.BACKWARD, 1, 0),
                                    *[a for a in good[1] if a.kind is not ActionKind.BACKWARD
                                      or a.micro_batch != 0][:-1],
                                    Action(ActionKind.APPLY, 1))), 2, 2)
    with pytest.raises(ScheduleError, match="APPLY last"):
        ss.check_actions((good[0], (good[1][-1], *good[1][:-1])), 2, 2)
    with pytest.raises(ScheduleError, match="once each"):
        ss.check_actions((good[0], good[1][1:]), 2, 2)
    with pytest.raises(ScheduleError, match="holds 2 micro-batches"):
        ss.check_actions(good, 2, 2, max_alive=[2, 1])
    with pytest.raises(ScheduleError, match="One action list per stage"):
        ss.check_actions(good, 3, 2)


def test_replay_bubble_equals_formula():
    # Equal times f = 1, b = 2: makespan (M + K - 1)(f + b); busy M(f + b) per stage.
    for k, m in [(2, 4), (4, 4), (4, 8), (3, 1)]:
        for build in (ss.gpipe, ss.one_f_one_b):
            timed = ss.replay(build(k, m), lambda a: {ActionKind.FORWARD: 1.0,
                                                      ActionKind.BACKWARD: 2.0}.get(a.kind, 0))
            span = max(t.end for t in timed)
            assert span == pytest.approx((m + k - 1) * 3.0)
            assert 1 - m * 3.0 / span == pytest.approx(ss.bubble_fraction(k, m))


def test_replay_transfer_delays_consumers():
    timed = ss.replay(ss.gpipe(2, 1), lambda a: 1.0 if a.kind is not ActionKind.APPLY else 0,
                      transfer=lambda a: 0.5)
    at = {t.action: t for t in timed}
    assert at[Action(ActionKind.FORWARD, 1, 0)].start == 1.5
    assert at[Action(ActionKind.BACKWARD, 0, 0)].start == 4.0   # 1.5 + 1 + 1 + 0.5


@settings(max_examples=60, deadline=None)
@given(k=st.integers(1, 8), m=st.integers(1, 12))
def test_properties(k, m):
    g, o = ss.gpipe(k, m), ss.one_f_one_b(k, m)
    ss.check_actions(g, k, m, max_alive=[m] * k)
    ss.check_actions(o, k, m, max_alive=[min(k - j, m) for j in range(k)])
    assert [ss.peak_alive(a) for a in g] == [m] * k
    assert [ss.peak_alive(a) for a in o] == [min(k - j, m) for j in range(k)]
    # Same backward order on every stage (gradients summed in micro-batch order).
    for acts in (*g, *o):
        assert [a.micro_batch for a in acts if a.kind is ActionKind.BACKWARD] == list(range(m))
    # 1F1B never takes longer than GPipe with equal times.
    dur = lambda a: {ActionKind.FORWARD: 1.0, ActionKind.BACKWARD: 2.0}.get(a.kind, 0.0)
    assert (max(t.end for t in ss.replay(o, dur))
            <= max(t.end for t in ss.replay(g, dur)) + 1e-9)
