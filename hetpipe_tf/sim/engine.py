"""Discrete-event simulation of HetPipe: Section 4 pipelines in every VW, WSP between them.

Each VW's pipeline is `hetpipe_tf.strategy.schedule.simulate` itself (the one model of the
Section 4 rules: per-stage forward/backward order, FIFO, the last stage's single task, N_m
in flight, continuous across waves). WSP enters it through `arrival`: minibatch p may not
enter stage 0 before the pull that brings the global wave it needs (`wsp.py`) completed.

Pushes and pulls (per stage, per PS shard, `links.LinkPool`):
* stage j pushes its part of wave c's aggregated update when it finishes its last task of
  the wave's last minibatch (its parameters are final for the wave then); the VW's push of
  wave c is complete when every stage's shards arrived; its local clock is then c+1;
* global wave c is complete when every VW's push of wave c arrived (global clock c+1);
* after pushing wave c the VW pulls the global weights including wave r = c-D (if r >= 0)
  once global wave r is complete: every stage fetches its shards; minibatches that need
  wave r wait for the whole pull (one consistent version for all stages). Pushes and
  compute overlap (transfers do not occupy a stage).

The dependency is causal, so the schedule is the fixed point of: simulate every VW with
the current gate times, replay the transfers in time order, recompute the gates; starting
from no gates, every round fixes at least one more wave, and the loop stops when nothing
changes.
"""

from __future__ import annotations

import heapq
from typing import Sequence

from hetpipe_tf.cluster.spec import Cluster
from hetpipe_tf.ps import wsp
from hetpipe_tf.sim.links import LinkPool, Transfer
from hetpipe_tf.sim.model import ScheduleMode, SimConfig, VirtualWorker
from hetpipe_tf.sim.result import SimResult, summarise
from hetpipe_tf.strategy.schedule import Event, TaskKind, simulate as simulate_pipeline


def _wave_end_per_stage(events: Sequence[Event], k: int, n_m: int, waves: int) -> list[list[float]]:
    """t[c][j]: when stage j finished its last task of wave c's last minibatch."""
    last = {}
    for e in events:
        if e.task.kind is not TaskKind.FORWARD:
            last[(e.task.stage, e.task.minibatch)] = e.end
    return [[last[(j, (c + 1) * n_m)] for j in range(k)] for c in range(waves)]


def _replay_transfers(vws: Sequence[VirtualWorker], wave_ends: list[list[list[float]]],
                      cfg: SimConfig, cluster: Cluster) -> tuple[list[dict[int, float]], LinkPool]:
    """Grant every push and pull in time order; returns pull completion per VW and wave."""
    pool = LinkPool(cluster, cfg.intra_scale)
    n_vw, waves, d = len(vws), cfg.num_waves, cfg.clock_distance
    heap: list[tuple[float, int, int, int, int, str]] = []  # (t, seq, vw, wave, stage, kind)
    seq = 0
    for v in range(n_vw):
        for c in range(waves):
            for j in range(vws[v].num_stages):
                heapq.heappush(heap, (wave_ends[v][c][j], seq, v, c, j, "push"))
                seq += 1
    stage_left = {(v, c): vws[v].num_stages for v in range(n_vw) for c in range(waves)}
    push_done: dict[tuple[int, int], float] = {}
    pull_stage_left: dict[tuple[int, int], int] = {}
    pull_done: list[dict[int, float]] = [{} for _ in range(n_vw)]
    vw_left = {c: n_vw for c in range(waves)}
    global_partial: dict[int, float] = {}
    global_done: dict[int, float] = {}
    end_of: dict[tuple[int, int, int, str], float] = {}

    def maybe_pull(v: int, c: int) -> None:
        nonlocal seq
        r = c - d
        if (r < 0 or c + 1 >= waves or (v, c) in pull_stage_left
                or stage_left[(v, c)] > 0 or r not in global_done):
            return  # (the last wave's pull would gate nothing)
        t = max(push_done[(v, c)], global_done[r])
        pull_stage_left[(v, c)] = vws[v].num_stages
        for j in range(vws[v].num_stages):
            heapq.heappush(heap, (t, seq, v, c, j, "pull"))
            seq += 1

    while heap:
        t, _, v, c, j, kind = heapq.heappop(heap)
        stage = vws[v].stages[j]
        end = t
        for sh in stage.shards:
            tr = pool.reserve(vw=v, stage=j, wave=c, kind=kind, device=stage.device,
                              device_host=stage.host, ps_host=sh.host, nbytes=sh.nbytes,
                              request=t)
            end = max(end, tr.end)
        if kind == "push":
            stage_left[(v, c)] -= 1
            push_done[(v, c)] = max(push_done.get((v, c), 0.0), end)
            if stage_left[(v, c)] == 0:
                vw_left[c] -= 1
                global_partial[c] = max(global_partial.get(c, 0.0), push_done[(v, c)])
                if vw_left[c] == 0:
                    global_done[c] = global_partial[c]
                    for u in range(n_vw):  # pulls waiting for this global wave
                        if c + d < waves:
                            maybe_pull(u, c + d)
                maybe_pull(v, c)
        else:
            pull_stage_left[(v, c)] -= 1
            pull_done[v][c] = max(pull_done[v].get(c, 0.0), end)
    return pull_done, pool


def _gates(pull_done: dict[int, float], cfg: SimConfig) -> list[float]:
    """arrival[p-1] for one VW: completion of the pull bringing p's required wave."""
    out = []
    for p in range(1, cfg.num_minibatches + 1):
        r = wsp.required_global_wave(p, cfg.n_m, cfg.clock_distance)
        out.append(0.0 if r is None else
                   pull_done.get(wsp.pull_after_wave(r, cfg.clock_distance), float("inf")))
    return out


def simulate(virtual_workers: Sequence[VirtualWorker], config: SimConfig,
             cluster: Cluster, *, max_rounds: int | None = None) -> SimResult:
    """Simulate `config.num_waves` waves of every VW; see the module doc for the rules."""
    vws = tuple(virtual_workers)
    if not vws:
        raise ValueError("simulate needs at least one virtual worker. Received: [].")
    if config.mode is ScheduleMode.GPIPE:
        from hetpipe_tf.sim.gpipe import simulate_gpipe
        return simulate_gpipe(vws, config, cluster)
    n = config.num_minibatches
    gates = [[0.0] * n for _ in vws]
    rounds = max_rounds or 2 * config.num_waves + 4
    for _ in range(rounds):
        runs = [simulate_pipeline(vw.num_stages, config.n_m, n, vw.forward_times,
                                  vw.backward_times, arrival=g) for vw, g in zip(vws, gates)]
        ends = [_wave_end_per_stage(ev, vw.num_stages, config.n_m, config.num_waves)
                for ev, vw in zip(runs, vws)]
        pull_done, pool = _replay_transfers(vws, ends, config, cluster)
        new = [_gates(pd, config) for pd in pull_done]
        if new == gates:
            return summarise(vws, config, cluster, runs, gates, pool.transfers)
        gates = new
    raise RuntimeError(f"The WSP schedule did not settle in {rounds} rounds. Received: "
                       f"{len(vws)} VWs, {config}; this is a bug, please report it.")


__all__ = ["simulate", "Transfer"]
