"""The cluster model as a virtual clock: a simulation turned into the ordered actions a
virtual-clock executor runs (`hetpipe_tf.core.virtual_time`).

`VirtualClock(cluster)` is the value a user passes as `HetPipeStrategy(clock=...)`: for the
VWs' plans on `cluster` it simulates HetPipe's WSP schedule (`engine.simulate`, the shared-
links network model by default) and returns `timeline(result)`: every stage task at its
start, every push when its last shard landed, every pull when it is granted (read) and
when it arrived (done). The updates (APPLY events) are no actions: a stage applies a
committed minibatch before its next task of a later one.
"""

from __future__ import annotations

import dataclasses
from typing import Sequence

from hetpipe_tf._args import check_int
from hetpipe_tf.cluster.spec import Cluster
from hetpipe_tf.core.schedule import TaskKind
from hetpipe_tf.core.virtual_time import Action, ActionKind, ordered
from hetpipe_tf.partitioner.plan import Plan
from hetpipe_tf.sim.engine import simulate
from hetpipe_tf.sim.model import SimConfig, VirtualWorker, from_plan
from hetpipe_tf.sim.network import NetworkConfig
from hetpipe_tf.sim.result import SimResult


def timeline(result: SimResult) -> tuple[Action, ...]:
    """Every action of `result` (a HetPipe WSP simulation), in the virtual clock's order."""
    if result.config.mode.synchronous:
        raise ValueError("timeline reads HetPipe's WSP schedule. Received: a simulation of "
                         f"{result.config.mode.value!r}; simulate with mode='hetpipe'.")
    actions = [Action(e.start, ActionKind.TASK, e.vw, stage=e.task.stage,
                      minibatch=e.task.minibatch, task=e.task.kind, end=e.end)
               for e in result.events if e.task.kind is not TaskKind.APPLY]
    pushed: dict[tuple[int, int], float] = {}
    granted: dict[tuple[int, int], float] = {}
    arrived: dict[tuple[int, int], float] = {}
    for t in result.transfers:
        key = (t.vw, t.wave)
        if t.kind == "push":
            pushed[key] = max(pushed.get(key, t.end), t.end)
        else:
            granted[key] = min(granted.get(key, t.start), t.start)
            arrived[key] = max(arrived.get(key, t.end), t.end)
    actions += [Action(t, ActionKind.PUSH, v, wave=c, end=t) for (v, c), t in pushed.items()]
    for (v, c), t in granted.items():
        done = arrived[(v, c)]
        actions.append(Action(t, ActionKind.PULL_READ, v, wave=c, end=t))
        actions.append(Action(done, ActionKind.PULL_DONE, v, wave=c, end=done))
    return ordered(actions)


@dataclasses.dataclass(frozen=True)
class VirtualClock:
    """Train in the order and at the virtual time of `cluster` (docs/virtual_clock.md).

    cluster: the described cluster the plans' stage devices are named in (the catalog's
      GPUs: `paper_cluster()`, `Cluster.local(...)`, any `Cluster`).
    network: the shared-links model (`NetworkConfig`), or None for one FIFO port per host.
    ps_host: the host of the parameter servers (None: the cluster's first host).
    intra_scale: as `SimConfig.intra_scale`.
    placement: where each stage's parameters live, when not all on `ps_host`:
      placement[v][j] = ((PS host, fraction of stage j's bytes), ...) for VW v (e.g.
      ED-local's stage k on stage k's host, from `ps.placement.traffic`); () = `ps_host`.
    """

    cluster: Cluster
    network: NetworkConfig | None = NetworkConfig()
    ps_host: str | None = None
    intra_scale: float = 0.7
    placement: tuple = ()

    def __post_init__(self) -> None:
        if not isinstance(self.cluster, Cluster):
            raise ValueError("VirtualClock needs the described cluster. Received: "
                             f"cluster={self.cluster!r}; pass a hetpipe_tf Cluster, e.g. "
                             "paper_cluster() or Cluster.local([...]).")
        if self.ps_host is not None:
            self.cluster.host(self.ps_host)   # raises for an unknown host
        for vw in self.placement:
            for shares in vw:
                for host, fraction in shares:
                    self.cluster.host(host)
                    if not 0 <= fraction <= 1:
                        raise ValueError(f"A placement's fraction of a stage's bytes lies in "
                                         f"[0, 1]. Received: {fraction!r} on host {host!r}.")

    def virtual_workers(self, plans: Sequence[Plan], param_bytes: Sequence[Sequence[int]]
                        ) -> list[VirtualWorker]:
        """The simulator's VWs of `plans`; `param_bytes[v][j]`: bytes stage j of VW v
        pushes and pulls."""
        for v, p in enumerate(plans):
            if all(s.compute_s <= 0 for s in p.stages):
                raise ValueError(
                    "The virtual clock needs the stages' times, and this plan has none. "
                    f"Received: plan of VW {v} with compute_s=0 on every stage (a hand-made "
                    "plan); plan over the cluster (HetPipeStrategy(cluster, ...) or "
                    "plan_model) so that the plan carries the cluster model's times.")
        if self.placement:
            if [len(vw) for vw in self.placement] != [p.num_stages for p in plans]:
                raise ValueError(
                    "The placement needs one entry per stage of every VW. Received: "
                    f"{[len(vw) for vw in self.placement]} entries for plans of "
                    f"{[p.num_stages for p in plans]} stages.")
            return [from_plan(p, self.cluster, name=f"vw{v}",
                              ps={j: [(h, int(round(b * f))) for h, f in self.placement[v][j]]
                                  for j, b in enumerate(bytes_)})
                    for v, (p, bytes_) in enumerate(zip(plans, param_bytes))]
        host = self.ps_host or self.cluster.hosts[0].name
        return [from_plan(p, self.cluster, name=f"vw{v}", param_bytes=list(b), ps_host=host)
                for v, (p, b) in enumerate(zip(plans, param_bytes))]

    def simulate(self, plans: Sequence[Plan], n_m: int, clock_distance: int,
                 param_bytes: Sequence[Sequence[int]], num_waves: int) -> SimResult:
        """The cluster model's run of `num_waves` waves of every VW."""
        check_int("num_waves", num_waves, minimum=1)
        cfg = SimConfig(n_m=n_m, clock_distance=clock_distance, num_waves=num_waves,
                        intra_scale=self.intra_scale, network=self.network)
        return simulate(self.virtual_workers(plans, param_bytes), cfg, self.cluster)

    def schedule(self, plans: Sequence[Plan], n_m: int, clock_distance: int,
                 param_bytes: Sequence[Sequence[int]], num_waves: int
                 ) -> tuple[Action, ...]:
        """The ordered actions of that run (`timeline`)."""
        return timeline(self.simulate(plans, n_m, clock_distance, param_bytes, num_waves))
