"""Pure WSP clock rules (paper Section 5, Figure 3)."""

import hypothesis
import hypothesis.strategies as st
import pytest

from hetpipe_tf.core import wsp


def test_wsp_rules_figure3():
    # Section 5, Figure 3: D = 0, N_m = 4 (s_local = 3): s_global = 6; minibatches 5-7 start
    # on local weights, 8-11 need global wave 0 (minibatches 1-4), 12 needs wave 1.
    assert wsp.s_global(4, 0) == 6
    need = {p: wsp.required_global_wave(p, 4, 0) for p in range(1, 13)}
    assert [p for p, r in need.items() if r is None] == list(range(1, 8))
    assert [need[p] for p in range(8, 13)] == [0, 0, 0, 0, 1]
    assert wsp.first_gated_minibatch(4, 0) == 8
    # The clock rule: last minibatch of wave w needs wave w - D - 1.
    for d in range(4):
        for n_m in range(1, 5):
            for w in range(d + 1, 8):
                assert wsp.required_global_wave((w + 1) * n_m, n_m, d) == w - d - 1
    assert wsp.pull_after_wave(3, 2) == 5


def test_wave_completed_by_marks_the_last_minibatch_of_each_wave():
    assert [wsp.wave_completed_by(i, 3) for i in range(1, 8)] == [None, None, 0, None, None,
                                                                  1, None]
    assert [wsp.wave_completed_by(i, 1) for i in range(1, 4)] == [0, 1, 2]


def test_the_pull_after_each_push_brings_what_the_next_versions_need():
    # After pushing wave c (its last minibatch is (c+1)N_m), the versions taken from then on
    # serve minibatches (c+2)N_m .. (c+3)N_m - 1: each needs at most wave c - D, and the
    # first of them needs exactly that wave.
    for d in range(4):
        for n_m in range(1, 5):
            for c in range(10):
                pulled = wsp.wave_pulled_after_push(c, d)
                needs = [wsp.required_global_wave(p, n_m, d)
                         for p in range((c + 2) * n_m, (c + 3) * n_m)]
                if pulled is None:
                    assert all(r is None for r in needs)
                else:
                    assert needs[0] == pulled
                    assert all(r is not None and r <= pulled for r in needs)
                    assert wsp.pull_after_wave(pulled, d) == c


def test_waves_needed_is_the_clock_form_of_the_paper_bound():
    # In a run from clock 0, the version taken after the q-th update serves minibatch
    # q + N_m while the VW's clock is q // N_m (the run-start versions at clock 0): the
    # clock form must demand exactly the waves required_global_wave demands, no more.
    for d in range(5):
        for n_m in range(1, 6):
            for p in range(1, n_m + 1):
                assert wsp.required_global_wave(p, n_m, d) is None
                assert wsp.waves_needed(0, d) == 0
            for q in range(1, 40):
                r = wsp.required_global_wave(q + n_m, n_m, d)
                assert wsp.waves_needed(q // n_m, d) == (0 if r is None else r + 1), (d, n_m, q)
    assert wsp.bound_holds((3, 5), 5, 2) and not wsp.bound_holds((2, 5), 5, 2)


def test_a_fresh_pull_is_due_only_for_another_workers_newer_wave():
    assert wsp.fresh_pull_due(0, (1, 2), (1, 3))
    assert not wsp.fresh_pull_due(0, (1, 2), (1, 2))
    assert not wsp.fresh_pull_due(0, (1, 2), (4, 2))     # only its own wave is newer
    assert wsp.fresh_pull_due(1, (0, 0, 0), (0, 0, 1))
    with pytest.raises(ValueError, match="one clock per VW.*worker=2"):
        wsp.fresh_pull_due(2, (0, 0), (0, 0))


@hypothesis.given(st.lists(st.integers(0, 50), min_size=1, max_size=6), st.integers(0, 8))
def test_a_run_starts_with_every_clock_at_the_largest_and_the_bound_met(clocks, d):
    start = wsp.clocks_at_run_start(clocks)
    assert len(start) == len(clocks) and set(start) == {max(clocks)}
    assert all(s >= c for s, c in zip(start, clocks))   # clocks never go back
    # The run-start w_global holds every wave pushed: it meets the bound of every VW.
    assert all(wsp.bound_holds(start, c, d) for c in start)


def test_global_clock_leaves_out_a_retired_worker():
    assert wsp.global_clock((3, 1, 4)) == 1
    assert wsp.global_clock((3, 1, 4), retired=(1,)) == 3   # nobody waits for the lost VW
    assert wsp.global_clock((3, 1, 4), retired=(0, 1)) == 4
    # A retired VW ahead of the others does not lift the clock either.
    assert wsp.global_clock((2, 9), retired=(1,)) == 2
    with pytest.raises(ValueError, match="At least one VW"):
        wsp.global_clock((1, 2), retired=(0, 1))
    with pytest.raises(ValueError, match="retired must index"):
        wsp.global_clock((1, 2), retired=(2,))
