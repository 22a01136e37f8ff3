"""Parameter-server transfers over the cluster's links, serialised per link.

Bandwidths come from the `Cluster`: a transfer between a device and a parameter server on
the same host uses that host's intra-host link (PCIe) at `intra_bandwidth x intra_scale`
(the partitioner's Paleo constant, comm.py); between hosts it uses the network at
`inter_bandwidth`. A transfer is one (device, PS host, bytes) move.

Serialisation (a decision): every host has ONE network port; an inter-host transfer holds
the port of the device's host and the port of the PS host for its whole duration, so the
transfers through one port run one after another (a PS host serves its VWs' pushes and
pulls in turn). An intra-host transfer holds the device's own PCIe link only (each GPU has
its own lanes). Transfers are granted in request order (FIFO), which the engine
guarantees by requesting them in time order. Activations between stages are not routed
through these ports: their time is already inside the stage times of the plan.

Speed: at 1024 GPUs one simulation grants ~560k transfers, so ports are list indices,
every stage's routes are computed once (`StageRoutes`), and granted transfers are kept per
grant (`transfers.TransferLog`); a `Transfer` object is only built when someone reads it.
"""

from __future__ import annotations

import dataclasses
from typing import Sequence

from hetpipe_tf.cluster.spec import Cluster
from hetpipe_tf.sim.model import SimStage
from hetpipe_tf.sim.transfers import Grant, Transfer, TransferLog


@dataclasses.dataclass(frozen=True)
class StageRoutes:
    """How one stage's PS shards move, in shard order: the ports each holds (a == b for
    PCIe) and its seconds, and what `Transfer` records of it (columns: the hot loop of
    the simulator zips them instead of reading attributes per transfer)."""

    device: str
    port_a: tuple[int, ...]
    port_b: tuple[int, ...]
    seconds: tuple[float, ...]
    shards: tuple[tuple[str, int, bool], ...]   # (ps_host, nbytes, inter_host) per shard


class LinkPool:
    """Reserves link time for transfers; requests must come in request-time order."""

    def __init__(self, cluster: Cluster, intra_scale: float = 0.7) -> None:
        self.cluster = cluster
        self.intra_scale = intra_scale
        self._port_ids: dict[tuple[str, str], int] = {}
        self._free: list[float] = []
        self._grants: list[Grant] = []

    @property
    def transfers(self) -> TransferLog:
        return TransferLog(self._grants)

    def seconds(self, nbytes: int, device_host: str, ps_host: str) -> float:
        """Transfer time of `nbytes` between a device on `device_host` and `ps_host`."""
        if nbytes <= 0:
            return 0.0
        if device_host == ps_host:
            return nbytes / (self.cluster.host(ps_host).intra_bandwidth * self.intra_scale)
        return nbytes / self.cluster.inter_bandwidth

    def _port(self, key: tuple[str, str]) -> int:
        if key not in self._port_ids:
            self._port_ids[key] = len(self._free)
            self._free.append(0.0)
        return self._port_ids[key]

    def routes(self, device: str, device_host: str,
               shards: Sequence[tuple[str, int]]) -> StageRoutes:
        """Routes of a stage on `device` whose parameters are `shards` (PS host, bytes)."""
        a, b, sec, out = [], [], [], []
        net, pcie = self._port(("net", device_host)), self._port(("pcie", device))
        for ps_host, nbytes in shards:
            inter = device_host != ps_host
            a.append(net if inter else pcie)
            b.append(self._port(("net", ps_host)) if inter else pcie)
            sec.append(self.seconds(nbytes, device_host, ps_host))
            out.append((ps_host, nbytes, inter))
        return StageRoutes(device, tuple(a), tuple(b), tuple(sec), tuple(out))

    def stage_routes(self, stage: SimStage) -> StageRoutes:
        return self.routes(stage.device, stage.host, [(s.host, s.nbytes) for s in stage.shards])

    def send(self, routes: StageRoutes, request: float, *, vw: int, stage: int, wave: int,
             kind: str) -> float:
        """Grant every shard in turn at `request`; when the last one arrived (or `request`).

        The hot loop of the simulator: plain locals, no object per transfer.
        """
        free = self._free
        starts, ends = [], []
        for a, b, seconds in zip(routes.port_a, routes.port_b, routes.seconds):
            start = request
            if free[a] > start:
                start = free[a]
            if free[b] > start:
                start = free[b]
            end = start + seconds
            free[a] = free[b] = end
            starts.append(start)
            ends.append(end)
        self._grants.append(Grant(vw, stage, wave, kind, request, routes.device,
                                   routes.shards, tuple(starts), tuple(ends)))
        return max(request, *ends) if ends else request

    def reserve(self, *, vw: int, stage: int, wave: int, kind: str, device: str,
                device_host: str, ps_host: str, nbytes: int, request: float) -> Transfer:
        """Grant one transfer (the one-shard form of `send`)."""
        self.send(self.routes(device, device_host, [(ps_host, nbytes)]), request, vw=vw,
                  stage=stage, wave=wave, kind=kind)
        g = self._grants[-1]
        return Transfer(vw, stage, wave, kind, device, ps_host, nbytes, g.shards[0][2],
                        request, g.starts[0], g.ends[0])


__all__ = ["LinkPool", "StageRoutes", "Transfer", "TransferLog"]
