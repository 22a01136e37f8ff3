"""Hypothesis scenarios for the simulator tests: random virtual workers and a SimConfig."""

from hypothesis import strategies as st

from hetpipe_tf.sim.model import PSShard, SimConfig, SimStage, VirtualWorker


@st.composite
def scenarios(draw, *, times, nbytes, max_vws: int, max_shards: int, max_waves: int,
              same_stage_count: bool):
    """(virtual workers, SimConfig): 1..max_vws VWs of 1..4 stages on host0..host3, each
    stage with 0..max_shards parameter shards; `same_stage_count`: every VW has as many."""
    n_vw = draw(st.integers(1, max_vws))
    k = draw(st.integers(1, 4)) if same_stage_count else None
    vws = []
    for v in range(n_vw):
        stages = []
        for j in range(k if same_stage_count else draw(st.integers(1, 4))):
            host = f"host{draw(st.integers(0, 3))}"
            shards = tuple(PSShard(f"host{draw(st.integers(0, 3))}", draw(nbytes))
                           for _ in range(draw(st.integers(0, max_shards))))
            stages.append(SimStage(f"{host}/gpu{j}", host, draw(times), draw(times),
                                   shards=shards))
        vws.append(VirtualWorker(f"vw{v}", tuple(stages), 8))
    cfg = SimConfig(n_m=draw(st.integers(1, 4)), clock_distance=draw(st.integers(0, 3)),
                    num_waves=draw(st.integers(1, max_waves)))
    return vws, cfg
