"""The runtime's per-stage updates in the simulated pipeline (sim/updates.py)."""

import pytest
from hypothesis import given, settings, strategies as st

from hetpipe_tf.cluster.spec import Cluster
from hetpipe_tf.core import schedule
from hetpipe_tf.core.schedule import TaskKind
from hetpipe_tf.sim import SimConfig, SimStage, VirtualWorker, simulate
from hetpipe_tf.sim.gpipe import gpipe_events
from hetpipe_tf.sim.updates import APPLY, _simulate, simulate_pipeline


def _spans(events):
    return {(e.task.stage, e.task.minibatch, e.task.kind): (e.start, e.end) for e in events}


def test_two_stages_by_hand():
    # N_m = 1. p=1: F0 0-1, FB1 1-4, B0 4-6; commit at 6: stage 1's apply is queued (ready
    # 6), stage 0 applies 6-6.5 and p=1 completes; p=2: F0 6.5-7.5; stage 1 runs its apply
    # 6-9 first (FIFO), then FB1(2) 9-12; B0(2) 12-14; applies 14-14.5 and 14-17.
    ev = simulate_pipeline(2, 1, 2, [1, 1], [2, 2], [0.5, 3])
    assert _spans(ev) == {
        (0, 1, TaskKind.FORWARD): (0, 1), (1, 1, TaskKind.FORWARD_BACKWARD): (1, 4),
        (0, 1, TaskKind.BACKWARD): (4, 6), (0, 1, APPLY): (6, 6.5), (1, 1, APPLY): (6, 9),
        (0, 2, TaskKind.FORWARD): (6.5, 7.5), (1, 2, TaskKind.FORWARD_BACKWARD): (9, 12),
        (0, 2, TaskKind.BACKWARD): (12, 14), (0, 2, APPLY): (14, 14.5),
        (1, 2, APPLY): (14, 17)}


def test_one_stage_update_follows_its_task():
    ev = simulate_pipeline(1, 2, 3, [1], [2], [0.5])
    # p=1, 2 enter at 0: 0-3, apply 3-3.5 (p=1 done -> p=3 ready 3.5), p=2 3.5-6.5, ...
    assert [(e.task.minibatch, e.task.kind, e.start, e.end) for e in ev] == [
        (1, TaskKind.FORWARD_BACKWARD, 0, 3), (1, APPLY, 3, 3.5),
        (2, TaskKind.FORWARD_BACKWARD, 3.5, 6.5), (2, APPLY, 6.5, 7),
        (3, TaskKind.FORWARD_BACKWARD, 7, 10), (3, APPLY, 10, 10.5)]


_times = st.lists(st.sampled_from([0.0, 0.5, 1.0, 2.0, 3.0]), min_size=4, max_size=4)


@settings(max_examples=150, deadline=None)
@given(k=st.integers(1, 4), n_m=st.integers(1, 4), m=st.integers(0, 12), f=_times, b=_times,
       arrivals=st.lists(st.sampled_from([0.0, 1.0, 5.0]), min_size=12, max_size=12))
def test_loop_equals_core_schedule_without_updates(k, n_m, m, f, b, arrivals):
    arr = sorted(arrivals[:m])
    assert _simulate(k, n_m, m, f[:k], b[:k], [0.0] * k, arr) == schedule.simulate(
        k, n_m, m, f[:k], b[:k], arrival=arr)


@settings(max_examples=150, deadline=None)
@given(k=st.integers(1, 4), n_m=st.integers(1, 4), m=st.integers(1, 10), f=_times, b=_times,
       u=_times)
def test_updates_where_the_runtime_runs_them(k, n_m, m, f, b, u):
    ev = simulate_pipeline(k, n_m, m, f[:k], b[:k], u[:k])
    spans = _spans(ev)
    last = TaskKind.FORWARD_BACKWARD if k == 1 else TaskKind.BACKWARD
    for j in range(k):   # a stage runs one task at a time, and every update once
        mine = sorted((e.start, e.end) for e in ev if e.task.stage == j)
        assert all(a[1] <= c[0] + 1e-12 for a, c in zip(mine, mine[1:]))
        assert sum(e.task.kind is APPLY for e in ev if e.task.stage == j) == (m if u[j] else 0)
    for p in range(1, m + 1):
        commit = spans[(0, p, last)][1]
        done = spans[(0, p, APPLY)][1] if u[0] else commit
        if u[0]:
            assert spans[(0, p, APPLY)] == (commit, commit + u[0])
        if p + n_m <= m:
            assert spans[(0, p + n_m, TaskKind.FORWARD if k > 1 else last)][0] >= done
        for j in range(1, k):
            if not u[j]:
                continue
            start, end = spans[(j, p, APPLY)]
            assert start >= commit and end == pytest.approx(start + u[j])
            if p + n_m <= m:   # the version of p + N_m exists before its forward there
                first = TaskKind.FORWARD_BACKWARD if j == k - 1 else TaskKind.FORWARD
                assert spans[(j, p + n_m, first)][0] >= end


def test_engine_charges_updates_and_counts_them_busy():
    cluster = Cluster.local(["LOCAL_CPU", "LOCAL_CPU"])
    d = [x.name for x in cluster.devices]
    host = cluster.devices[0].host

    def vw(updates):
        return VirtualWorker("v", (SimStage(d[0], host, 1.0, 2.0, update_s=updates[0]),
                                   SimStage(d[1], host, 1.0, 2.0, update_s=updates[1])), 4)

    cfg = SimConfig(n_m=1, num_waves=2)
    plain, charged = simulate([vw((0, 0))], cfg, cluster), simulate([vw((0.5, 3))], cfg, cluster)
    # As in test_two_stages_by_hand: p=2 completes at 14.5 (12 without updates), the
    # makespan ends with stage 1's last update (17).
    assert plain.vws[0].completions == (6.0, 12.0)
    assert charged.vws[0].completions == (6.5, 14.5)
    assert charged.makespan_s == 17.0
    assert charged.vws[0].busy_s == (2 * (1 + 2 + 0.5), 2 * (3 + 3))


def test_gpipe_updates_after_the_flush():
    ev = gpipe_events([2, 2], [4, 4], 2, 2, update_s=[1, 3])
    applies = [(e.task.stage, e.task.minibatch, e.start, e.end) for e in ev
               if e.task.kind is APPLY]
    # Minibatch 1: F 0-1,1-2 | 1-2,2-3 ; B stage 1: 3-5,5-7 ; stage 0: 5-7,7-9.
    assert applies[:2] == [(1, 2, 7, 10), (0, 2, 9, 10)]
    second = [e for e in ev if e.task.minibatch == 3 and e.task.stage == 0]
    assert second[0].start == 10   # next minibatch after every stage updated


def test_bad_update_times():
    with pytest.raises(ValueError, match="one value per stage"):
        simulate_pipeline(2, 1, 2, [1, 1], [1, 1], [1.0])
    with pytest.raises(ValueError, match="update_s must be a finite number >= 0"):
        SimStage("d", "h", 1.0, 1.0, update_s=-1.0)
