"""Discrete-event simulation of HetPipe: Section 4 pipelines in every VW, WSP between them.

Each VW's pipeline is `hetpipe_tf.core.schedule.simulate` itself (the one model of the
Section 4 rules: per-stage forward/backward order, FIFO, the last stage's single task, N_m
in flight, continuous across waves). WSP enters it through `arrival`: minibatch p may not
enter stage 0 before the pull that brings the global wave it needs (`wsp.py`) completed.

Pushes and pulls (per stage, per PS shard, `replay.Replay` over `links.LinkPool`):
* stage j pushes its part of wave c's aggregated update when it finishes its last task of
  the wave's last minibatch (its parameters are final for the wave then); the VW's push of
  wave c is complete when every stage's shards arrived; its local clock is then c+1;
* global wave c is complete when every VW's push of wave c arrived (global clock c+1);
* after pushing wave c the VW pulls the global weights including wave r = c-D (if r >= 0)
  once global wave r is complete: every stage fetches its shards; minibatches that need
  wave r wait for the whole pull (one consistent version for all stages). Pushes and
  compute overlap (transfers do not occupy a stage).

The schedule is the fixed point of: simulate every VW with the current gates, replay the
transfers in time order, recompute the gates (`fixed_point.py`, the reference). Because
the dependency is causal, one pass reaches it: grant transfers in time order, and when a
VW's pull completes, re-run that VW's pipeline over the minibatches whose gates are now
known and queue the pushes of the waves that became final (`pipelines.final_waves`).
A wave's push comes after the pull that gated it, so it is queued before anything later
is granted and the grants are those of the reference. If a VW's last stage takes no time
that ordering may not hold, and the reference runs instead.
"""

from __future__ import annotations

from typing import Sequence

from hetpipe_tf.cluster.spec import Cluster
from hetpipe_tf.sim.fixed_point import simulate_fixed_point
from hetpipe_tf.sim.links import Transfer
from hetpipe_tf.sim.model import SimConfig, VirtualWorker
from hetpipe_tf.sim.pipelines import PipelineCache, final_waves, pull_waves
from hetpipe_tf.sim.replay import OutOfOrder, Replay
from hetpipe_tf.sim.result import SimResult, summarise
from hetpipe_tf.core.schedule import Event


class _OnePass:
    """The fixed point in one pass: per VW, the pulls completed and the waves queued."""

    def __init__(self, vws: Sequence[VirtualWorker], cfg: SimConfig, cluster: Cluster) -> None:
        self.vws, self.cfg, self.cluster = vws, cfg, cluster
        self.pull_waves = pull_waves(cfg)
        self.cache = PipelineCache(cfg)
        self.replay = Replay(vws, cfg, cluster, on_pull_done=self._pulled)
        self.complete: list[set[int]] = [set() for _ in vws]   # pulls every stage finished
        self.queued = [0] * len(vws)                            # waves whose pushes are queued
        self.runs: list[list[Event] | None] = [None] * len(vws)
        self.gates: list[list[float]] = [[] for _ in vws]

    def _known_gates(self, v: int) -> list[float]:
        """Gates of the leading minibatches whose pull has completed (0 when ungated)."""
        done, out = self.replay.pull_done[v], []
        for w in self.pull_waves:
            if w is None:
                out.append(0.0)
            elif w in self.complete[v]:
                out.append(done[w])
            else:
                break
        return out

    def advance(self, v: int) -> None:
        """Run VW v over its known gates; queue the pushes of waves that became final."""
        arrival = self._known_gates(v)
        final = final_waves(len(arrival), self.cfg)
        if final <= self.queued[v]:
            return
        vw = self.vws[v]
        ends = self.cache.final_wave_ends(vw, arrival)
        for c in range(self.queued[v], final):
            for j, t in enumerate(ends[c]):
                self.replay.add_push(v, c, j, t)
        self.queued[v] = final
        if len(arrival) == self.cfg.num_minibatches:
            self.runs[v], self.gates[v] = self.cache.run(vw, arrival), arrival

    def _pulled(self, v: int, c: int) -> None:
        self.complete[v].add(c)
        self.advance(v)

    def result(self) -> SimResult:
        for v in range(len(self.vws)):
            self.advance(v)
        self.replay.run()
        if any(r is None for r in self.runs):
            raise RuntimeError(f"The WSP schedule left a VW unfinished. Received: "
                               f"{len(self.vws)} VWs, {self.cfg}; this is a bug, please "
                               f"report it.")
        return summarise(self.vws, self.cfg, self.cluster, self.runs, self.gates,
                         self.replay.pool.transfers)


def simulate(virtual_workers: Sequence[VirtualWorker], config: SimConfig,
             cluster: Cluster, *, max_rounds: int | None = None) -> SimResult:
    """Simulate `config.num_waves` waves of every VW; see the module doc for the rules.

    max_rounds: bound of the fixed-point reference, when it runs (see the module doc).
    """
    vws = tuple(virtual_workers)
    if not vws:
        raise ValueError("simulate needs at least one virtual worker. Received: [].")
    if config.mode.synchronous:
        from hetpipe_tf.sim.gpipe import simulate_gpipe
        return simulate_gpipe(vws, config, cluster)
    if all(vw.stages[-1].forward_s + vw.stages[-1].backward_s > 0 for vw in vws):
        try:
            return _OnePass(vws, config, cluster).result()
        except OutOfOrder:
            pass  # a push vanished next to its gate (durations ~1e-16 of the clock)
    return simulate_fixed_point(vws, config, cluster, max_rounds=max_rounds)


__all__ = ["simulate", "Transfer"]
