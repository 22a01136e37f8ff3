"""What a simulation returns: throughput, utilisation, waiting/idle time, bytes, events.

Definitions (all seconds are simulated time):
* makespan: from 0 (every VW starts empty) to the last task's end.
* throughput: minibatches (samples) completed by all VWs / makespan, ramp-up included,
  like a benchmark epoch that starts and ends with an empty pipeline. `steady_*`: the sum
  over VWs of (minibatches after its first wave) / (time from its first wave's end to its
  last completion), ramp-up excluded.
* utilisation of a stage: its busy time / makespan.
* waiting time of a VW: the length of the union of intervals during which a minibatch
  could have entered stage 0 (minibatch p-N_m completed) but waited for global weights.
* idle time of a stage: the part of the VW's waiting intervals in which that stage runs no
  task; `stalled_s`: the part in which no stage of the VW runs a task.
* bytes: parameter pushes/pulls (from `links.Transfer`) and activations+gradients between
  consecutive stages (send_bytes each way per minibatch), split into across hosts and
  within hosts.
"""

from __future__ import annotations

import dataclasses
from typing import Sequence

from hetpipe_tf.cluster.spec import Cluster
from hetpipe_tf.sim.transfers import Transfer, TransferLog
from hetpipe_tf.sim.model import SimConfig, VirtualWorker
from hetpipe_tf.core.schedule import Event, Task, TaskKind


@dataclasses.dataclass(frozen=True)
class SimEvent:
    """A task of VW `vw` that ran from `start` to `end` (the runtime's TraceEvent shape)."""

    vw: int
    task: Task
    start: float
    end: float


@dataclasses.dataclass(frozen=True)
class VWStats:
    name: str
    minibatches: int
    utilisation: tuple[float, ...]     # per stage
    busy_s: tuple[float, ...]          # per stage
    waiting_s: float
    idle_s: tuple[float, ...]          # per stage, within waiting intervals
    stalled_s: float
    completions: tuple[float, ...]     # completion time of minibatch 1, 2, ...


@dataclasses.dataclass(frozen=True)
class SimResult:
    config: SimConfig
    makespan_s: float
    minibatches: int
    samples: int
    steady_minibatches_per_s: float
    steady_samples_per_s: float
    vws: tuple[VWStats, ...]
    bytes_inter_host: int              # parameters + activations across hosts
    bytes_intra_host: int
    param_bytes_inter_host: int
    param_bytes_intra_host: int
    events: tuple[SimEvent, ...]
    transfers: TransferLog             # a sequence of Transfer, in grant order

    @property
    def minibatches_per_s(self) -> float:
        return self.minibatches / self.makespan_s if self.makespan_s > 0 else float("inf")

    @property
    def samples_per_s(self) -> float:
        return self.samples / self.makespan_s if self.makespan_s > 0 else float("inf")

    def table(self) -> str:
        lines = [f"{len(self.vws)} VW(s), N_m={self.config.n_m}, D={self.config.clock_distance}, "
                 f"{self.config.num_waves} waves: {self.samples_per_s:.1f} samples/s "
                 f"({self.steady_samples_per_s:.1f} steady), makespan {self.makespan_s:.4g} s, "
                 f"bytes across hosts {self.bytes_inter_host / 1e6:.1f} MB, "
                 f"within hosts {self.bytes_intra_host / 1e6:.1f} MB"]
        for v in self.vws:
            util = " ".join(f"{u:.0%}" for u in v.utilisation)
            lines.append(f"  {v.name}: utilisation [{util}], waiting {v.waiting_s:.4g} s, "
                         f"idle [{' '.join(f'{x:.4g}' for x in v.idle_s)}] s, "
                         f"stalled {v.stalled_s:.4g} s")
        return "\n".join(lines)


def _union(intervals: list[tuple[float, float]]) -> list[tuple[float, float]]:
    out: list[tuple[float, float]] = []
    for a, b in sorted(i for i in intervals if i[1] > i[0]):
        if out and a <= out[-1][1]:
            out[-1] = (out[-1][0], max(out[-1][1], b))
        else:
            out.append((a, b))
    return out


def _overlap(spans: list[tuple[float, float]], windows: list[tuple[float, float]]) -> float:
    total = 0.0
    for a, b in spans:
        for c, d in windows:
            total += max(0.0, min(b, d) - max(a, c))
    return total


def _vw_stats(vw: VirtualWorker, cfg: SimConfig, events: Sequence[Event],
              gates: Sequence[float], makespan: float) -> VWStats:
    k, n_m = vw.num_stages, cfg.n_m
    done: dict[int, float] = {}
    spans: list[list[tuple[float, float]]] = [[] for _ in range(k)]
    for e in events:
        spans[e.task.stage].append((e.start, e.end))
        if e.task.stage == 0 and e.task.kind is not TaskKind.FORWARD:
            # p completes after stage 0's backward, or its update when it has one
            done[e.task.minibatch] = max(e.end, done.get(e.task.minibatch, e.end))
    waits = []
    for p, g in enumerate(gates, start=1):
        free = done.get(p - n_m, 0.0)
        waits.append((free, g))
    windows = _union(waits)
    waiting = sum(b - a for a, b in windows)
    busy = tuple(sum(b - a for a, b in s) for s in spans)
    idle = tuple(waiting - _overlap(s, windows) for s in spans)
    any_busy = _union([x for s in spans for x in s])
    stalled = waiting - _overlap(any_busy, windows)
    return VWStats(name=vw.name, minibatches=len(done),
                   utilisation=tuple(b / makespan if makespan > 0 else 0.0 for b in busy),
                   busy_s=busy, waiting_s=waiting, idle_s=idle, stalled_s=stalled,
                   completions=tuple(done[p] for p in sorted(done)))


def _steady_rate(completions: Sequence[float], n_m: int) -> float:
    if len(completions) <= n_m:
        return 0.0
    span = completions[-1] - completions[n_m - 1]
    return (len(completions) - n_m) / span if span > 0 else float("inf")


def summarise(vws: Sequence[VirtualWorker], cfg: SimConfig, cluster: Cluster,
              runs: Sequence[Sequence[Event]], gates: Sequence[Sequence[float]],
              transfers: Sequence[Transfer]) -> SimResult:
    makespan = max((e.end for ev in runs for e in ev), default=0.0)
    stats = tuple(_vw_stats(vw, cfg, ev, g, makespan) for vw, ev, g in zip(vws, runs, gates))
    events = tuple(sorted((SimEvent(v, e.task, e.start, e.end)
                           for v, ev in enumerate(runs) for e in ev),
                          key=lambda e: (e.start, e.vw, e.task.stage)))
    log = TransferLog.of(transfers)
    p_inter, p_intra = log.param_bytes()
    a_inter = a_intra = 0
    for vw, st in zip(vws, stats):
        for j in range(vw.num_stages - 1):
            moved = 2 * vw.stages[j].send_bytes * st.minibatches  # activations + gradients
            if vw.stages[j].host != vw.stages[j + 1].host:
                a_inter += moved
            else:
                a_intra += moved
    steady = [_steady_rate(s.completions, cfg.n_m) for s in stats]
    return SimResult(
        config=cfg, makespan_s=makespan,
        minibatches=sum(s.minibatches for s in stats),
        samples=sum(s.minibatches * vw.batch_size for s, vw in zip(stats, vws)),
        steady_minibatches_per_s=sum(steady),
        steady_samples_per_s=sum(r * vw.batch_size for r, vw in zip(steady, vws)),
        vws=stats, bytes_inter_host=p_inter + a_inter, bytes_intra_host=p_intra + a_intra,
        param_bytes_inter_host=p_inter, param_bytes_intra_host=p_intra,
        events=events, transfers=log)
