"""The finality rule the one-pass engine relies on, checked on `schedule.simulate` itself."""

from hypothesis import given, settings, strategies as st

from hetpipe_tf.sim.model import SimConfig
from hetpipe_tf.sim.pipelines import final_waves, gates, pull_waves
from hetpipe_tf.core.schedule import simulate

times = st.one_of(st.sampled_from([0.0, 0.5, 1.0]),
                  st.floats(min_value=0.0, max_value=3.0, allow_nan=False))


@settings(max_examples=100, deadline=None)
@given(k=st.integers(1, 4), n_m=st.integers(1, 4), total=st.integers(1, 16), data=st.data())
def test_prefix_run_is_final_for_its_first_m_minus_nm_plus_1_minibatches(k, n_m, total, data):
    # A run of the first m minibatches has the events of minibatches 1..m-N_m+1 of every
    # longer run with the same gates, whatever the later gates are, as long as gates never
    # decrease with p (the engine's: a later wave's pull completes no earlier). With
    # decreasing arrivals minibatches overtake each other and the rule does not hold.
    fwd = data.draw(st.lists(times, min_size=k, max_size=k))
    bwd = data.draw(st.lists(times, min_size=k, max_size=k))
    m = data.draw(st.integers(0, total))
    arrival = sorted(data.draw(st.lists(times, min_size=m, max_size=m)))
    floor = arrival[-1] if arrival else 0.0
    later = sorted(floor + x for x in data.draw(st.lists(
        st.one_of(times, st.just(float("inf"))), min_size=total - m, max_size=total - m)))

    def final(events, upto):
        return sorted(((e.task, e.start, e.end) for e in events if e.task.minibatch <= upto),
                      key=lambda x: (x[0].stage, x[0].minibatch, x[0].kind.value))
    prefix = simulate(k, n_m, m, fwd, bwd, arrival=arrival)
    full = simulate(k, n_m, total, fwd, bwd, arrival=arrival + later)
    upto = total if m == total else m - n_m + 1
    assert final(prefix, upto) == final(full, upto)


def test_final_waves_and_pull_waves_figure3():
    # Figure 3 (D = 0, N_m = 4): minibatches 1-7 are ungated, 8-11 need wave 0 (pulled
    # after pushing wave 0), 12-15 need wave 1, 16 needs wave 2.
    cfg = SimConfig(n_m=4, clock_distance=0, num_waves=4)
    assert pull_waves(cfg) == [None] * 7 + [0] * 4 + [1] * 4 + [2]
    assert gates({0: 5.0}, cfg) == [0.0] * 7 + [5.0] * 4 + [float("inf")] * 5
    # 7 ungated minibatches fix wave 0 only (minibatches 5-7 may still delay 4's tasks).
    assert [final_waves(m, cfg) for m in (0, 6, 7, 11, 15, 16)] == [0, 0, 1, 2, 3, 4]
