"""Shared links: parameter-server transfers as flows that share capacity fairly.

A host's network interface (NIC) has a capacity per direction (full duplex); every GPU's
PCIe link has a capacity per direction; every parameter-server host applies updates at
a rate bounded by its memory bandwidth. A transfer is a flow over the resources it
crosses; all active flows share each resource max-min fairly (processor sharing, the
fluid model of TCP-like fair sharing), and a flow across hosts is also capped at one
transfer's rate: the cluster's `inter_bandwidth` (for the paper's setup one TF gRPC
stream, `TF_GRPC_STREAM_BANDWIDTH`), the rate the planner charges an activation. docs/cluster_model.md names every constant and its source.

Routes (one flow per PS shard of a stage):
  push, PS on the GPU's host:  GPU PCIe up, then the PS applies the update
  push, PS on another host:    GPU PCIe up + NIC out (GPU host) + NIC in (PS host),
                               capped at the stream rate; then the PS applies it
  pull, PS on the GPU's host:  GPU PCIe down
  pull, PS on another host:    NIC out (PS host) + NIC in (GPU host) + GPU PCIe down,
                               capped at the stream rate
A push is done when the update is applied (its `end`); the VW's clock, the global wave
and the pulls that wait for it follow from that time (`replay.Replay`).

`FluidNetwork` is the processor-sharing core (no WSP knowledge); `SharedPool` turns a
stage's request into flows and records the grants like `links.LinkPool` does.
"""

from __future__ import annotations

import dataclasses
import math
from typing import TYPE_CHECKING, Sequence

from hetpipe_tf.cluster.spec import Cluster
from hetpipe_tf.sim.transfers import Grant, TransferLog

if TYPE_CHECKING:
    from hetpipe_tf.sim.model import SimStage

# 56 Gb/s FDR InfiniBand (paper Section 8.1) from a PCIe 3.0 x8 adapter: "you should see
# 52~53Gbps on each port" (Mellanox community, FDR in a PCIe Gen3 x8 slot): 52.5 Gb/s.
IB_FDR_ACHIEVED_BANDWIDTH = 52.5e9 / 8
# One TF tensor transfer between two TF tasks over gRPC (RecvTensor), TF 1.12's path
# between tasks: 800 MB/s after the 2017 gRPC upgrade (tensorflow/tensorflow#6116,
# benchmark_grpc_recv.py, 2017-08-09: "fully utilizes a 10Gbps link").
TF_GRPC_STREAM_BANDWIDTH = 0.8e9
# Intel Xeon E5-2620 v4 (paper Section 8.1): "Max Memory Bandwidth 68.3 GB/s" per socket
# (Intel ARK, 4 channels DDR4-2133).
E5_2620_V4_MEMORY_BANDWIDTH = 68.3e9
# Bytes of memory traffic per byte of update the parameter server applies:
# w_global = w_global + u reads w and u and writes w (paper Section 5).
PS_APPLY_TRAFFIC = 3


@dataclasses.dataclass(frozen=True)
class NetworkConfig:
    """Capacities of the shared-links model (bytes/s).

    nic_bandwidth: each host's NIC, per direction.
    stream_bandwidth: cap of one flow across hosts (a TF gRPC stream); None = the
      cluster's `inter_bandwidth`, the rate the planner's comm model (partitioner/comm.py)
      charges one cross-host transfer, so plans and simulation use one link model.
    ps_apply_bandwidth: bytes of update per second a PS host applies (shared by its
      shards); None = applying takes no time.
    pcie_bandwidth: each GPU's PCIe link per direction; None = the host's
      `intra_bandwidth` x `SimConfig.intra_scale`.
    """

    nic_bandwidth: float = IB_FDR_ACHIEVED_BANDWIDTH
    stream_bandwidth: float | None = None
    ps_apply_bandwidth: float | None = E5_2620_V4_MEMORY_BANDWIDTH / PS_APPLY_TRAFFIC
    pcie_bandwidth: float | None = None

    def __post_init__(self) -> None:
        for f in ("nic_bandwidth", "stream_bandwidth", "ps_apply_bandwidth",
                  "pcie_bandwidth"):
            v = getattr(self, f)
            if v is None and f != "nic_bandwidth":
                continue
            if isinstance(v, bool) or not isinstance(v, (int, float)) or not (
                    v > 0 and math.isfinite(v)):
                raise ValueError(f"NetworkConfig {f} must be a finite number > 0 (bytes/s). "
                                 f"Received: {f}={v!r}; pass e.g. 6.5e9.")


class FluidNetwork:
    """Flows over capacitated resources, rates max-min fair, advanced in time."""

    def __init__(self) -> None:
        self.capacity: list[float] = []
        self._ids: dict[tuple, int] = {}
        self.now = 0.0
        self._left: dict[int, float] = {}             # flow -> bytes left
        self._uses: dict[int, tuple[int, ...]] = {}   # flow -> resources
        self._cap: dict[int, float] = {}              # flow -> its own rate cap
        self._rate: dict[int, float] = {}
        self._next = 0

    def resource(self, key: tuple, capacity: float) -> int:
        if key not in self._ids:
            self._ids[key] = len(self.capacity)
            self.capacity.append(float(capacity))
        return self._ids[key]

    @property
    def active(self) -> int:
        return len(self._left)

    def start(self, nbytes: float, resources: Sequence[int], cap: float = math.inf) -> int:
        """A new flow of `nbytes` (> 0) at `now`; returns its id."""
        f = self._next
        self._next += 1
        self._left[f], self._uses[f], self._cap[f] = float(nbytes), tuple(resources), cap
        self._rates()
        return f

    def _rates(self) -> None:
        """Max-min fair rates by progressive filling."""
        left_cap = list(self.capacity)
        count = [0] * len(left_cap)
        unfrozen = set(self._left)
        for f in unfrozen:
            for r in self._uses[f]:
                count[r] += 1
        level = 0.0
        rate: dict[int, float] = {}
        while unfrozen:
            inc = min((left_cap[r] / count[r] for r in range(len(count)) if count[r]),
                      default=math.inf)
            inc = min(inc, min(self._cap[f] - level for f in unfrozen))
            level += inc
            for r in range(len(count)):
                if count[r]:
                    left_cap[r] -= inc * count[r]
            full = {r for r in range(len(count)) if count[r] and left_cap[r] <= 1e-9 *
                    self.capacity[r]}
            frozen = [f for f in unfrozen if self._cap[f] - level <= 1e-12 * max(level, 1)
                      or any(r in full for r in self._uses[f])]
            if not frozen:          # numerical corner: freeze everything at this level
                frozen = list(unfrozen)
            for f in frozen:
                rate[f] = level
                unfrozen.discard(f)
                for r in self._uses[f]:
                    count[r] -= 1
        self._rate = rate

    def next_completion(self) -> float:
        """Time the next flow ends (inf when none is active)."""
        return min((self.now + self._left[f] / self._rate[f] for f in self._left
                    if self._rate[f] > 0), default=math.inf)

    def advance(self, t: float) -> list[int]:
        """Move to time t (>= now); returns the flows that ended by then, in id order."""
        dt = t - self.now
        if dt < 0:
            raise ValueError(f"Time cannot go back. Received: t={t}, now={self.now}.")
        done = []
        tol = 1e-12 * max(1.0, abs(t))     # a flow this close to its end is done
        for f in self._left:
            self._left[f] -= self._rate[f] * dt
            rate = self._rate[f]
            if self._left[f] <= 0 or (rate > 0 and self._left[f] / rate <= tol):
                done.append(f)
        self.now = t
        for f in done:
            del self._left[f], self._uses[f], self._cap[f]
        if done:
            self._rates()
        return done


@dataclasses.dataclass(frozen=True)
class ShardRoute:
    ps_host: str
    nbytes: int
    inter_host: bool
    push: tuple[int, ...]      # resources of the push transfer
    pull: tuple[int, ...]
    cap: float                 # rate cap of the transfer
    apply: int | None          # the PS host's apply resource (None: applying is free)


@dataclasses.dataclass(frozen=True)
class SharedRoutes:
    device: str
    shards: tuple[ShardRoute, ...]

    @property
    def records(self) -> tuple[tuple[str, int, bool], ...]:
        return tuple((s.ps_host, s.nbytes, s.inter_host) for s in self.shards)


class SharedPool:
    """The shared-links pool `replay.Replay` uses when `SimConfig.network` is set."""

    def __init__(self, cluster: Cluster, config: NetworkConfig, intra_scale: float) -> None:
        self.cluster, self.config, self.intra_scale = cluster, config, intra_scale
        self.net = FluidNetwork()
        self._grants: list[Grant] = []

    @property
    def transfers(self) -> TransferLog:
        return TransferLog(self._grants)

    def _pcie(self, device: str, host: str, direction: str) -> int:
        bw = self.config.pcie_bandwidth or (self.cluster.host(host).intra_bandwidth
                                            * self.intra_scale)
        return self.net.resource(("pcie", direction, device), bw)

    def _nic(self, host: str, direction: str) -> int:
        return self.net.resource(("nic", direction, host), self.config.nic_bandwidth)

    def stage_routes(self, stage: SimStage) -> SharedRoutes:
        out = []
        cfg = self.config
        for s in stage.shards:
            inter = s.host != stage.host
            up, down = self._pcie(stage.device, stage.host, "up"), \
                self._pcie(stage.device, stage.host, "down")
            apply = (self.net.resource(("apply", s.host), cfg.ps_apply_bandwidth)
                     if cfg.ps_apply_bandwidth else None)
            if inter:
                push = (up, self._nic(stage.host, "out"), self._nic(s.host, "in"))
                pull = (self._nic(s.host, "out"), self._nic(stage.host, "in"), down)
                cap = cfg.stream_bandwidth or self.cluster.inter_bandwidth
            else:
                push, pull, cap = (up,), (down,), math.inf
            out.append(ShardRoute(s.host, s.nbytes, inter, push, pull, cap, apply))
        return SharedRoutes(stage.device, tuple(out))

    def record(self, routes: SharedRoutes, request: float, ends: Sequence[float], *,
               vw: int, stage: int, wave: int, kind: str) -> None:
        self._grants.append(Grant(vw, stage, wave, kind, request, routes.device,
                                  routes.records, (request,) * len(ends), tuple(ends)))


__all__ = ["E5_2620_V4_MEMORY_BANDWIDTH", "FluidNetwork", "IB_FDR_ACHIEVED_BANDWIDTH",
           "NetworkConfig", "PS_APPLY_TRAFFIC", "SharedPool", "TF_GRPC_STREAM_BANDWIDTH"]
