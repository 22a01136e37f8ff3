"""One call from a profile and a cluster to a simulated HetPipe run and its baseline.

    allocation (NP/ED/HD) -> plan_virtual_workers -> parameter placement -> simulate
                                                  + Horovod on the same devices

    from hetpipe_tf.sim.scenario import simulate_scenario
    r = simulate_scenario(profile, paper_cluster(), "ED", "ed_local")
    print(r.table()); r.samples_per_s; r.horovod.samples_per_s

Virtual workers with the same composition (per device, in VW order: type, emulated speed
factor, memory, and which of the VW's devices share a host) get the same plan, so the
partitioner runs once per distinct composition and the plan is mapped onto the others'
devices. N_m = `n_m`, or the largest every VW fits (min over VWs of Max_m, as the paper's
Figure 5 and Table 4 choose it; `limit` caps Max_m's search).
"""

from __future__ import annotations

import dataclasses
import time
from typing import Any, Sequence

from hetpipe_tf.cluster.allocation import AllocationPolicy, allocate, type_string
from hetpipe_tf.cluster.spec import Cluster, Device, Host
from hetpipe_tf.partitioner.milp import plan_virtual_workers
from hetpipe_tf.partitioner.plan import Plan
from hetpipe_tf.ps.placement import PlacementPolicy, place_parameters, traffic
from hetpipe_tf.sim.allreduce import AllReduceResult, HorovodConfig, horovod
from hetpipe_tf.sim.calibration import plain_update_s, without_update_costs
from hetpipe_tf.sim.engine import simulate
from hetpipe_tf.sim.model import SimConfig, from_plan, stage_update_times
from hetpipe_tf.sim.network import NetworkConfig
from hetpipe_tf.sim.result import SimResult


@dataclasses.dataclass(frozen=True)
class ScenarioResult:
    """A simulated HetPipe scenario. Times are simulated seconds except `*_wall_s`."""

    policy: AllocationPolicy
    placement: PlacementPolicy
    compositions: tuple[str, ...]        # per VW, e.g. "VRGQ" (type_string)
    plans: tuple[Plan, ...]              # per VW
    n_m: int
    sim: SimResult
    horovod: AllReduceResult             # data-parallel baseline on the same devices
    distinct_plans: int                  # partitioner runs (one per distinct composition)
    planning_wall_s: float               # plan_virtual_workers wall time
    simulation_wall_s: float             # simulate wall time
    compute_scale: float = 1.0

    @property
    def samples_per_s(self) -> float:
        return self.sim.samples_per_s

    @property
    def utilisation(self) -> tuple[tuple[float, ...], ...]:
        """Per VW, per stage: busy / makespan."""
        return tuple(v.utilisation for v in self.sim.vws)

    @property
    def waiting_s(self) -> tuple[float, ...]:
        """Per VW: time minibatches waited for global weights (WSP)."""
        return tuple(v.waiting_s for v in self.sim.vws)

    @property
    def idle_s(self) -> tuple[tuple[float, ...], ...]:
        """Per VW, per stage: idle part of the waiting time."""
        return tuple(v.idle_s for v in self.sim.vws)

    @property
    def bytes_across_hosts_per_minibatch(self) -> float:
        """Parameter pushes/pulls + activations/gradients crossing hosts, per minibatch."""
        return self.sim.bytes_inter_host / max(self.sim.minibatches, 1)

    @property
    def param_bytes_across_hosts_per_minibatch(self) -> float:
        return self.sim.param_bytes_inter_host / max(self.sim.minibatches, 1)

    def table(self) -> str:
        hv = self.horovod
        lines = [
            f"{len(self.plans)} VW(s) by {self.policy.value} ({', '.join(self.compositions)}), "
            f"placement {self.placement.value}, N_m={self.n_m}, "
            f"D={self.sim.config.clock_distance}, compute_scale={self.compute_scale:g}",
            f"HetPipe: {self.samples_per_s:.1f} samples/s; bytes across hosts per minibatch "
            f"{self.bytes_across_hosts_per_minibatch / 1e6:.1f} MB (parameters "
            f"{self.param_bytes_across_hosts_per_minibatch / 1e6:.1f} MB)",
            f"Horovod (ring all-reduce, {len(hv.devices)} GPUs"
            + (f", {len(hv.excluded)} without memory for the model" if hv.excluded else "")
            + f"): {hv.samples_per_s:.1f} samples/s; bytes across hosts per step "
            f"{hv.bytes_inter_host / 1e6:.1f} MB",
            f"planning {self.planning_wall_s:.2f} s ({self.distinct_plans} distinct plan(s)), "
            f"simulation {self.simulation_wall_s:.2f} s (wall)",
            "vw  stage  device                     layers    utilisation  idle s  waiting s",
        ]
        for v, (plan, st) in enumerate(zip(self.plans, self.sim.vws)):
            for s, u, idle in zip(plan.stages, st.utilisation, st.idle_s):
                lines.append(f"{v:2}  {s.index:5}  {s.device:25}  {s.first:3}-{s.last:<4}  "
                             f"{u:11.2f}  {idle:6.3f}  {st.waiting_s:9.3f}")
        return "\n".join(lines)


def composition_key(cluster: Cluster, vw: Sequence[Device]) -> tuple:
    """What the partitioner sees of a VW: per device (type, speed factor, memory, host label)."""
    labels: dict[str, int] = {}
    return tuple((d.type_name, d.emulated_speed_factor, cluster.memory_of(d),
                  labels.setdefault(d.host, len(labels))) for d in vw)


def _map_plan(plan: Plan, rep: Sequence[Device], vw: Sequence[Device]) -> Plan:
    """`plan` (made for devices `rep`) moved onto the same-position devices of `vw`."""
    if tuple(d.name for d in rep) == tuple(d.name for d in vw):
        return plan
    to = {a.name: b for a, b in zip(rep, vw)}
    stages = tuple(dataclasses.replace(s, device=to[s.device].name,
                                       tf_device=to[s.device].tf_device) for s in plan.stages)
    return dataclasses.replace(plan, stages=stages)


def plan_distinct(profile: Any, vws: Sequence[Sequence[Device]], cluster: Cluster,
                  n_m: int | None = None, limit: int = 32) -> tuple[tuple[Plan, ...], int, float]:
    """(plan per VW, number of distinct compositions planned, planning wall seconds)."""
    keys = [composition_key(cluster, vw) for vw in vws]
    reps: dict[tuple, int] = {}
    for i, k in enumerate(keys):
        reps.setdefault(k, i)
    order = list(reps.values())
    start = time.perf_counter()
    rep_plans = plan_virtual_workers(profile, [vws[i] for i in order], cluster=cluster,
                                     n_m=n_m, limit=limit)
    wall = time.perf_counter() - start
    by_key = {keys[i]: (vws[i], p) for i, p in zip(order, rep_plans)}
    plans = tuple(_map_plan(by_key[k][1], by_key[k][0], vw) for k, vw in zip(keys, vws))
    return plans, len(order), wall


def simulate_scenario(profile: Any, cluster: Cluster, policy: AllocationPolicy | str,
                      placement: PlacementPolicy | str = PlacementPolicy.DEFAULT,
                      n_m: int | None = None, clock_distance: int = 0, num_waves: int = 10,
                      batch_size: int | None = None, compute_scale: float = 1.0,
                      ranking: Sequence[str] | None = None, *,
                      num_virtual_workers: int | None = None,
                      virtual_workers: Sequence[Sequence[Device]] | None = None,
                      limit: int = 32,
                      horovod_config: HorovodConfig | None = HorovodConfig(),
                      horovod_profile: Any = None,
                      network: NetworkConfig | None = NetworkConfig()) -> ScenarioResult:
    """Allocate, plan, place parameters and simulate HetPipe on `cluster`; Horovod beside.

    profile: a `ModelProfile` with times for every device type of the cluster; rescaled to
      `batch_size` when given and different.
    policy: NP, ED or HD (or AUTO with the allocation module's heuristic); ignored when
      `virtual_workers` (device tuples) are given.
    ranking: device types fastest first for HD (default: the profile's times).
    n_m: minibatches in flight per VW; None = the largest every VW fits.
    horovod_config: how the Horovod baseline is modelled (`sim.allreduce`); None = the
      no-overlap bound.
    horovod_profile: the profile the baseline uses (same layers and times; e.g. another
      memory rule); None = `profile`.
    network: the shared-links model of PS transfers (`sim.network`, the cluster model of
      docs/cluster_model.md); None = one FIFO port per host.
    """
    horovod_profile = horovod_profile or profile
    if batch_size is not None and batch_size != profile.batch_size:
        profile = profile.scaled(batch_size)
    if batch_size is not None and batch_size != horovod_profile.batch_size:
        horovod_profile = horovod_profile.scaled(batch_size)
    policy = AllocationPolicy.parse(policy)
    placement = PlacementPolicy.parse(placement)
    if virtual_workers is None:
        virtual_workers = allocate(cluster, policy, num_virtual_workers, profile=profile,
                                   ranking=ranking)
    vws = tuple(tuple(cluster.device(d) for d in vw) for vw in virtual_workers)
    plans, distinct, planning = plan_distinct(profile, vws, cluster, n_m=n_m, limit=limit)
    chosen_n_m = plans[0].n_m
    placed = place_parameters(profile, plans, cluster, policy=placement)
    per_vw = traffic(placed, plans, profile, cluster)
    sim_vws = [from_plan(plan, cluster, name=f"vw{v}",
                         ps={j: [(t.ps_host, t.bytes) for t in stage]
                             for j, stage in enumerate(per_vw[v])},
                         cut_bytes=profile.cut_bytes, compute_scale=compute_scale,
                         update_s=stage_update_times(plan, profile))
               for v, plan in enumerate(plans)]
    start = time.perf_counter()
    result = simulate(sim_vws, SimConfig(n_m=chosen_n_m, clock_distance=clock_distance,
                                         num_waves=num_waves, network=network), cluster)
    sim_wall = time.perf_counter() - start
    baseline = horovod(horovod_profile, [d for vw in vws for d in vw], cluster,
                       config=horovod_config)
    return ScenarioResult(policy=policy, placement=placement,
                          compositions=tuple(type_string(vw) for vw in vws), plans=plans,
                          n_m=chosen_n_m, sim=result, horovod=baseline,
                          distinct_plans=distinct, planning_wall_s=planning,
                          simulation_wall_s=sim_wall, compute_scale=compute_scale)


def single_device_samples_per_s(profile: Any, device_type: str, num_waves: int = 4) -> float:
    """Simulated samples/s of one `device_type` alone (one VW of one device, N_m = 1, no
    parameter server): the reference the paper's "Single GPU" column is compared with.
    A profile that costs updates (`update_optimizer`) is charged one plain SGD step per
    minibatch (`calibration.plain_update_s`: no weight-version copy on a single GPU)."""
    update = plain_update_s(profile, device_type) if profile.update_optimizer else 0.0
    profile = without_update_costs(profile)
    host = Host(name="h0", devices=(Device(name="h0/gpu0", type_name=device_type, host="h0",
                                           tf_device="/device:GPU:0"),),
                intra_bandwidth=15.75e9)
    cluster = Cluster(hosts=(host,), inter_bandwidth=7e9)
    (plan,) = plan_virtual_workers(profile, [cluster.devices], cluster=cluster, n_m=1)
    vw = from_plan(plan, cluster, name="single", update_s=[update])
    return simulate([vw], SimConfig(n_m=1, num_waves=num_waves), cluster).samples_per_s
