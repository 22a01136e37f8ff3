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
"""

from __future__ import annotations

import dataclasses

from hetpipe_tf.cluster.spec import Cluster


@dataclasses.dataclass(frozen=True)
class Transfer:
    """One granted transfer (for the timeline and the byte counts)."""

    vw: int
    stage: int
    wave: int
    kind: str          # "push" or "pull"
    device: str
    ps_host: str
    nbytes: int
    inter_host: bool
    request: float
    start: float
    end: float


class LinkPool:
    """Reserves link time for transfers; `reserve` must be called in request-time order."""

    def __init__(self, cluster: Cluster, intra_scale: float = 0.7) -> None:
        self.cluster = cluster
        self.intra_scale = intra_scale
        self._free: dict[tuple[str, str], float] = {}
        self.transfers: list[Transfer] = []

    def seconds(self, nbytes: int, device_host: str, ps_host: str) -> float:
        """Transfer time of `nbytes` between a device on `device_host` and `ps_host`."""
        if nbytes <= 0:
            return 0.0
        if device_host == ps_host:
            return nbytes / (self.cluster.host(ps_host).intra_bandwidth * self.intra_scale)
        return nbytes / self.cluster.inter_bandwidth

    def reserve(self, *, vw: int, stage: int, wave: int, kind: str, device: str,
                device_host: str, ps_host: str, nbytes: int, request: float) -> Transfer:
        inter = device_host != ps_host
        keys = ([("net", device_host), ("net", ps_host)] if inter else [("pcie", device)])
        start = max([request] + [self._free.get(k, 0.0) for k in keys])
        end = start + self.seconds(nbytes, device_host, ps_host)
        for k in keys:
            self._free[k] = end
        t = Transfer(vw, stage, wave, kind, device, ps_host, nbytes, inter, request, start, end)
        self.transfers.append(t)
        return t
