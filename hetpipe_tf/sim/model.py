"""What the simulator simulates: virtual workers, their stages, their parameter shards.

A `VirtualWorker` is the simulator's view of one planned virtual worker: per stage the
forward and backward task durations, the device and host, the bytes of activations it
sends downstream, and the parameter-server shards its parameters live in. Build it from a
`Plan` with `from_plan`; every value is frozen.

Forward/backward split of a stage's time (a decision; the Plan only has forward+backward):
    forward  = compute_s / 3       + recv_forward_s
    backward = 2 * compute_s / 3   + recv_backward_s
(the backward computes gradients w.r.t. inputs and weights: twice the forward's FLOPs, the
same 3x rule the profiler uses). The last stage runs both as one task (Section 4).

Update: each stage's per-minibatch update (optimizer step + the next weight-version
snapshot; `SimStage.update_s`) is charged where the runtime runs it (`core.schedule.simulate`'s
`update_time`): on stage 0 right after the minibatch's backward (the minibatch completes
after it), on every other stage as an APPLY task queued when stage 0 committed it. `from_plan`
takes it per stage (`update_s=`, e.g. `stage_update_times(plan, profile)`).

`compute_scale` is an explicit, labelled contention parameter: every stage's compute time
(and its update) is multiplied by it. On dedicated GPUs it is 1. On this 2-core machine two logical CPU
devices computing at once each run slower (docs/strategy.md "Measured": 2 concurrent
copies of a step take ~1.4x the time of one), which a per-device cost model cannot know.
"""

from __future__ import annotations

import dataclasses
import math
from typing import TYPE_CHECKING, Mapping, Sequence

from hetpipe_tf._args import check_int
from hetpipe_tf.cluster.spec import Cluster
from hetpipe_tf.core.sync_schedule import Schedule
from hetpipe_tf.partitioner.plan import Plan

if TYPE_CHECKING:
    from hetpipe_tf.sim.network import NetworkConfig

# stage index -> list of (parameter-server host, bytes of that stage's parameters it holds)
PSMap = Mapping[int, Sequence[tuple[str, int]]]


@dataclasses.dataclass(frozen=True)
class PSShard:
    """`nbytes` of a stage's parameters held by the parameter server on `host`."""

    host: str
    nbytes: int

    def __post_init__(self) -> None:
        if not isinstance(self.host, str) or not self.host:
            raise ValueError(f"PSShard host must be a host name. Received: host={self.host!r}; "
                             "pass the name of a Host of the cluster.")
        check_int("nbytes", self.nbytes, minimum=0, hint="pass a byte count")


@dataclasses.dataclass(frozen=True)
class SimStage:
    """One pipeline stage as the simulator sees it (seconds per minibatch)."""

    device: str
    host: str
    forward_s: float
    backward_s: float
    send_bytes: int = 0            # activations to the next stage (and gradients back)
    shards: tuple[PSShard, ...] = ()
    update_s: float = 0.0          # the stage's update per minibatch (module doc)

    def __post_init__(self) -> None:
        for f in ("forward_s", "backward_s", "update_s"):
            v = getattr(self, f)
            if not (isinstance(v, (int, float)) and math.isfinite(v) and v >= 0):
                raise ValueError(f"SimStage {f} must be a finite number >= 0. Received: "
                                 f"{f}={v!r}; pass seconds.")
        object.__setattr__(self, "shards", tuple(self.shards))

    @property
    def param_bytes(self) -> int:
        return sum(s.nbytes for s in self.shards)


@dataclasses.dataclass(frozen=True)
class VirtualWorker:
    """Stages of one virtual worker in pipeline order, and its minibatch size."""

    name: str
    stages: tuple[SimStage, ...]
    batch_size: int

    def __post_init__(self) -> None:
        object.__setattr__(self, "stages", tuple(self.stages))
        if not self.stages:
            raise ValueError(f"A virtual worker needs at least one stage. Received: "
                             f"{self.name} with stages=(); plan it first.")
        check_int("batch_size", self.batch_size, minimum=1)

    @property
    def num_stages(self) -> int:
        return len(self.stages)

    @property
    def forward_times(self) -> list[float]:
        return [s.forward_s for s in self.stages]

    @property
    def backward_times(self) -> list[float]:
        return [s.backward_s for s in self.stages]

    @property
    def update_times(self) -> list[float]:
        return [s.update_s for s in self.stages]


@dataclasses.dataclass(frozen=True)
class SimConfig:
    """How to run the simulation.

    n_m: minibatches in flight per VW (Section 4; equal for all VWs).
    clock_distance: D of WSP (Section 5); 0 is BSP-like.
    num_waves: waves each VW runs (num_waves x n_m minibatches per VW).
    intra_scale: fraction of the nominal PCIe bandwidth transfers reach (comm.py's constant).
    mode: the `Schedule` (or its name): HETPIPE (Section 4 pipelines, WSP across VWs), or
      a synchronous one (then n_m is the number of micro-batches M per minibatch).
    network: the shared-links model of PS transfers (`sim.network.NetworkConfig`: NICs,
      PCIe, PS apply shared fairly); None = one FIFO port per host (`links.LinkPool`).
    """

    n_m: int
    clock_distance: int = 0
    num_waves: int = 10
    intra_scale: float = 0.7
    mode: Schedule = Schedule.HETPIPE
    network: NetworkConfig | None = None

    def __post_init__(self) -> None:
        object.__setattr__(self, "mode", Schedule.parse(self.mode))
        check_int("n_m", self.n_m, minimum=1)
        check_int("num_waves", self.num_waves, minimum=1)
        check_int("clock_distance", self.clock_distance, minimum=0,
                  hint="use 0 for BSP-like WSP")
        if not 0 < self.intra_scale <= 1:
            raise ValueError(f"intra_scale must be in (0, 1]. Received: "
                             f"intra_scale={self.intra_scale!r}.")

    @property
    def num_minibatches(self) -> int:
        return self.num_waves * self.n_m


def stage_times(compute_s: float, recv_forward_s: float, recv_backward_s: float,
                compute_scale: float = 1.0) -> tuple[float, float]:
    """(forward, backward) seconds of a stage: the 1/3 : 2/3 split of the module doc."""
    c = compute_s * compute_scale
    return c / 3 + recv_forward_s, 2 * c / 3 + recv_backward_s


def default_ps_map(plan: Plan, param_bytes: Sequence[int], ps_host: str) -> dict[int, list[tuple[str, int]]]:
    """Every stage's parameters on one parameter-server host."""
    return {j: [(ps_host, int(param_bytes[j]))] for j in range(plan.num_stages)}


def stage_param_bytes(plan: Plan, layer_param_bytes: Sequence[int]) -> list[int]:
    """Trainable parameter bytes of each stage, from per-layer bytes (profile order)."""
    if len(layer_param_bytes) != plan.num_layers:
        raise ValueError(f"Need one byte count per layer. Received: {len(layer_param_bytes)} "
                         f"for a plan of {plan.num_layers} layers.")
    return [int(sum(layer_param_bytes[s.first:s.last + 1])) for s in plan.stages]


def stage_update_times(plan: Plan, profile) -> list[float]:
    """Seconds of each stage's update per minibatch: the sum of its layers'
    `LayerCost.update_s` on the stage's device type, / its emulated speed factor (the
    runtime's emulation slows a stage's updates as it slows its tasks). Zeros for a profile
    that costs no update."""
    if len(profile.layers) != plan.num_layers:
        raise ValueError(f"The profile does not match the plan. Received: "
                         f"{len(profile.layers)} profiled layers for a plan of "
                         f"{plan.num_layers}; pass the profile the plan was made from.")
    out = []
    for s in plan.stages:
        total = sum(l.update_s.get(s.device_type, 0.0)
                    for l in profile.layers[s.first:s.last + 1])
        out.append(total / s.emulated_speed_factor)
    return out


def from_plan(plan: Plan, cluster: Cluster, *, name: str = "vw0",
              param_bytes: Sequence[int] | None = None, ps: PSMap | None = None,
              cut_bytes: Sequence[int] | None = None, compute_scale: float = 1.0,
              ps_host: str | None = None,
              update_s: Sequence[float] | None = None) -> VirtualWorker:
    """A `VirtualWorker` from a planner `Plan` on `cluster`.

    param_bytes: trainable bytes per STAGE (see `stage_param_bytes`); ignored when `ps` is
      given, which maps stage -> [(ps_host, bytes), ...] (the placement module's output).
      Without either, stages push/pull nothing.
    ps_host: the host of the single default parameter server (default: the first host).
    cut_bytes: per LAYER cut (profile.cut_bytes), to count activation bytes moved.
    compute_scale: the labelled contention factor of the module doc.
    update_s: each stage's update seconds per minibatch (`stage_update_times`); None =
      the plan's own `StagePlan.update_s` (0 in hand-made plans).
    """
    if compute_scale <= 0:
        raise ValueError(f"compute_scale must be > 0. Received: compute_scale={compute_scale}.")
    if update_s is None:
        update_s = [float(s.update_s) for s in plan.stages]
    if len(update_s) != plan.num_stages:
        raise ValueError(f"update_s needs one value per stage. Received: {len(update_s)} for "
                         f"{plan.num_stages} stages; pass stage_update_times(plan, profile).")
    if ps is None and param_bytes is not None:
        ps = default_ps_map(plan, param_bytes, ps_host or cluster.hosts[0].name)
    host_names = {h.name for h in cluster.hosts}
    stages = []
    for s in plan.stages:
        shards = tuple(PSShard(h, int(b)) for h, b in (ps or {}).get(s.index, ()))
        for sh in shards:
            if sh.host not in host_names:
                raise ValueError(f"Unknown parameter-server host for stage {s.index}. "
                                 f"Received: host={sh.host!r}; use one of {sorted(host_names)}.")
        fwd, bwd = stage_times(s.compute_s, s.recv_forward_s, s.recv_backward_s, compute_scale)
        send = 0
        if cut_bytes is not None and s.index < plan.num_stages - 1:
            send = int(cut_bytes[s.last])
        stages.append(SimStage(device=s.device, host=cluster.device(s.device).host,
                               forward_s=fwd, backward_s=bwd, send_bytes=send, shards=shards,
                               update_s=float(update_s[s.index]) * compute_scale))
    return VirtualWorker(name=name, stages=tuple(stages), batch_size=plan.batch_size)
