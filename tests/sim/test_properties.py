"""Property tests: simulated pipelines obey Section 4 (check_trace) and WSP (Section 5)."""

from hypothesis import given, settings, strategies as st

from hetpipe_tf.cluster.spec import paper_cluster
from hetpipe_tf.core import wsp
from hetpipe_tf.sim.engine import simulate
from hetpipe_tf.core.schedule import TaskKind, check_trace, per_stage_order
from tests.sim.scenarios import scenarios as shared_scenarios

CLUSTER = paper_cluster()
times = st.floats(min_value=0.01, max_value=3.0, allow_nan=False)


def scenarios():
    return shared_scenarios(times=times, nbytes=st.integers(0, 3_000_000_000), max_vws=3,
                            max_shards=2, max_waves=5, same_stage_count=True)


@settings(max_examples=60, deadline=None)
@given(scenarios())
def test_every_vw_obeys_section4_and_wsp(scenario):
    vws, cfg = scenario
    r = simulate(vws, cfg, CLUSTER)
    done = {}  # (vw, minibatch) -> completion
    start0 = {}  # (vw, minibatch) -> start on stage 0
    for e in r.events:
        if e.task.stage == 0 and e.task.kind is not TaskKind.FORWARD:
            done[(e.vw, e.task.minibatch)] = e.end
        if e.task.stage == 0 and e.task.kind is not TaskKind.BACKWARD:
            start0[(e.vw, e.task.minibatch)] = e.start
    for v, vw in enumerate(vws):
        mine = [e for e in r.events if e.vw == v]
        completions = sorted((done[(v, p)], p) for p in range(1, cfg.num_minibatches + 1))
        check_trace(per_stage_order(mine), vw.num_stages, cfg.n_m,
                    completions=[p for _, p in completions])
        # A stage runs one task at a time.
        for j in range(vw.num_stages):
            spans = sorted((e.start, e.end) for e in mine if e.task.stage == j)
            assert all(a[1] <= b[0] + 1e-12 for a, b in zip(spans, spans[1:]))
        # WSP: p starts only after every VW completed the wave it needs.
        for p in range(1, cfg.num_minibatches + 1):
            w = wsp.required_global_wave(p, cfg.n_m, cfg.clock_distance)
            if w is None:
                continue
            last = (w + 1) * cfg.n_m
            assert start0[(v, p)] >= max(done[(u, last)] for u in range(len(vws))) - 1e-9
    assert r.minibatches == len(vws) * cfg.num_minibatches
    for t in r.transfers:
        assert t.start >= t.request and t.end >= t.start
