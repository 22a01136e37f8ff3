"""The straightforward form of the engine: a fixed point over whole runs.

Simulate every VW with the current gates, replay every push and pull in time order (all
pushes queued before the first grant), recompute the gates; start from no gates, stop
when nothing changes. Gates depend on earlier waves only, so every round fixes at least
one more wave; a bound of 2 x waves + 4 rounds raises if not.

It costs rounds x (VWs x tasks + transfers): ~12 s at 1024 GPUs. `engine.simulate`
computes the same fixed point in one pass; this form is its reference in the tests and
its fallback when that pass cannot keep the grants in time order (zero-time tasks).
"""

from __future__ import annotations

from typing import Sequence

from hetpipe_tf.cluster.spec import Cluster
from hetpipe_tf.sim.model import SimConfig, VirtualWorker
from hetpipe_tf.sim.pipelines import PipelineCache, gates
from hetpipe_tf.sim.replay import Replay
from hetpipe_tf.sim.result import SimResult, summarise


def simulate_fixed_point(vws: Sequence[VirtualWorker], cfg: SimConfig, cluster: Cluster,
                         *, max_rounds: int | None = None) -> SimResult:
    """HETPIPE-mode simulation by fixed-point iteration (same result as `engine.simulate`)."""
    n = cfg.num_minibatches
    cache = PipelineCache(cfg)
    current = [[0.0] * n for _ in vws]
    rounds = max_rounds or 2 * cfg.num_waves + 4
    for _ in range(rounds):
        runs = [cache.run(vw, g) for vw, g in zip(vws, current)]
        replay = Replay(vws, cfg, cluster)
        for v, (vw, g) in enumerate(zip(vws, current)):
            for c, ends in enumerate(cache.final_wave_ends(vw, g)):
                for j, t in enumerate(ends):
                    replay.add_push(v, c, j, t)
        replay.run()
        new = [gates(pd, cfg) for pd in replay.pull_done]
        if new == current:
            return summarise(vws, cfg, cluster, runs, current, replay.pool.transfers)
        current = new
    raise RuntimeError(f"The WSP schedule did not settle in {rounds} rounds. Received: "
                       f"{len(vws)} VWs, {cfg}; this is a bug, please report it.")
