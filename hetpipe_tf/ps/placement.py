"""Parameter placement: which parameter server (PS) holds each layer's weights (Section 8.1).

The paper runs one PS per node, each holding a share of the model.

- DEFAULT: the layers that have trainable parameters go round-robin over the PS hosts in
  graph order (layer i with parameters -> ps_hosts[i mod n]), as TensorFlow's
  `replica_device_setter` does. Usable with every allocation policy. (TF's setter
  round-robins variables, i.e. a layer's kernel and bias separately; the paper and this
  module place whole layers.)
- ED_LOCAL: the layers of partition (stage) k go to the PS on the node that runs stage k in
  every virtual worker. Possible only when all plans have the same stage boundaries and
  stage k sits on the same node in every VW (ED allocation with identical plans); then
  no parameter byte crosses a node boundary.

"Node" = physical machine: two hosts of the `Cluster` are the same node when they have the
same name, or both have an `address` with the same hostname (a "ps" task next to a
"worker" task on one machine). `ps_hosts=None` means the cluster's "ps" job hosts when it
has any, else every host with devices (the paper's one PS per node).

Traffic (`traffic`, `bytes_across_hosts_per_wave`): after each wave of N_m minibatches a
virtual worker pushes the update of every trainable weight of each stage to the weight's
PS and pulls the fresh weight back (Section 5), so a wave moves each layer's
`trainable_param_bytes` once each way between the stage's node and the layer's PS node.
"""

from __future__ import annotations

import dataclasses
import enum
import types
from typing import Any, Mapping, NamedTuple, Sequence

from hetpipe_tf._args import parse_enum
from hetpipe_tf.cluster.spec import Cluster
from hetpipe_tf.partitioner.plan import Plan


class PlacementError(ValueError):
    """The requested parameter placement is impossible for these plans and hosts."""


class PlacementPolicy(enum.Enum):
    """Where layers' parameters live (Section 8.1)."""

    DEFAULT = "default"
    ED_LOCAL = "ed_local"

    @classmethod
    def parse(cls, value: "str | PlacementPolicy") -> "PlacementPolicy":
        """The policy for a flag value: "default", "ed_local" or "ed-local" (any case)."""
        return parse_enum(cls, value, arg="placement", what="placement policy",
                          error=PlacementError)


@dataclasses.dataclass(frozen=True)
class Placement:
    """Layer -> PS host for every layer with trainable parameters.

    Attributes:
      policy: the policy that made it.
      ps_hosts: the PS hosts, in round-robin order.
      layer_hosts: node index -> PS host name (layers without trainable params are absent).
      layer_names: node index -> layer name, for the same layers.
    """

    policy: PlacementPolicy
    ps_hosts: tuple[str, ...]
    layer_hosts: Mapping[int, str]
    layer_names: Mapping[int, str]

    def __post_init__(self) -> None:
        object.__setattr__(self, "ps_hosts", tuple(self.ps_hosts))
        object.__setattr__(self, "layer_hosts", types.MappingProxyType(dict(self.layer_hosts)))
        object.__setattr__(self, "layer_names", types.MappingProxyType(dict(self.layer_names)))

    def host_of(self, layer: int | str) -> str:
        """The PS host of a layer, by node index or name."""
        if isinstance(layer, str):
            index = next((i for i, n in self.layer_names.items() if n == layer), None)
        else:
            index = layer
        if index not in self.layer_hosts:
            raise PlacementError(
                f"Layer has no placed parameters. Received: layer={layer!r}; use one of "
                f"{sorted(self.layer_names.values())} (layers without trainable parameters "
                "have no PS).")
        return self.layer_hosts[index]

    def layers_on(self, ps_host: str) -> tuple[int, ...]:
        """Node indices of the layers a PS host holds, in graph order."""
        return tuple(sorted(i for i, h in self.layer_hosts.items() if h == ps_host))

    def bytes_per_host(self, profile: Any) -> dict[str, int]:
        """Trainable parameter bytes held by each PS host."""
        out = {h: 0 for h in self.ps_hosts}
        for i, h in self.layer_hosts.items():
            out[h] += profile.layers[i].trainable_param_bytes
        return out


class StageTraffic(NamedTuple):
    """Parameter traffic of one stage with one PS per wave.

    `bytes` moves each way (pushed as the update, pulled as the new weights);
    `crosses_host` says whether the stage's node differs from the PS node.
    """

    ps_host: str
    bytes: int
    crosses_host: bool


def _bad(what: str, received: str, fix: str) -> PlacementError:
    return PlacementError(f"{what}. Received: {received}; {fix}.")


def node_of(cluster: Cluster, host_name: str) -> str:
    """The physical node of a host: its address's hostname if known, else its name."""
    host = cluster.host(host_name)
    if host.address:
        return "addr:" + host.address.rsplit(":", 1)[0]
    return "host:" + host.name


def default_ps_hosts(cluster: Cluster) -> tuple[str, ...]:
    """The cluster's "ps" job hosts if any, else every host with devices."""
    ps = tuple(h.name for h in cluster.hosts if h.task is not None and h.task[0] == "ps")
    return ps or tuple(h.name for h in cluster.hosts if h.devices)


def _span(bounds: list[tuple[int, int]], k: int) -> str:
    return f"layers {bounds[k][0]}..{bounds[k][1]}" if k < len(bounds) else "no such stage"


def _check_plans(profile: Any, plans: Sequence[Plan]) -> tuple[Plan, ...]:
    plans = tuple(plans)
    if not plans:
        raise _bad("At least one plan (virtual worker) is needed", "plans=()",
                   "pass the plans of the virtual workers")
    names = [layer.name for layer in profile.layers]
    for v, plan in enumerate(plans):
        if not isinstance(plan, Plan):
            raise _bad("plans must be Plan values", f"plans[{v}]={plan!r}",
                       "build them with hetpipe_tf.partitioner.milp.plan_virtual_workers")
        try:
            plan.check_matches(names)
        except ValueError as e:
            raise _bad(f"Plan of virtual worker {v} does not match the profile",
                       str(e), "plan with this profile") from None
    return plans


def place_parameters(profile: Any, plans: Sequence[Plan], cluster: Cluster,
                     ps_hosts: Sequence[str] | None = None,
                     policy: PlacementPolicy | str = PlacementPolicy.DEFAULT) -> Placement:
    """Assign every layer with trainable parameters to a PS host under `policy`."""
    policy = PlacementPolicy.parse(policy)
    plans = _check_plans(profile, plans)
    ps = tuple(ps_hosts) if ps_hosts is not None else default_ps_hosts(cluster)
    if not ps:
        raise _bad("At least one parameter-server host is needed", "ps_hosts=()",
                   "pass host names of the cluster, or None for one PS per node")
    if len(set(ps)) != len(ps):
        raise _bad("ps_hosts has duplicates", f"ps_hosts={list(ps)}", "list each host once")
    for h in ps:
        cluster.host(h)  # unknown host -> ValueError listing the hosts
    with_params = [i for i, layer in enumerate(profile.layers) if layer.trainable_param_bytes > 0]
    names = {i: profile.layers[i].name for i in with_params}
    if policy is PlacementPolicy.DEFAULT:
        hosts = {i: ps[n % len(ps)] for n, i in enumerate(with_params)}
        return Placement(policy, ps, hosts, names)

    ps_by_node: dict[str, str] = {}
    for h in ps:
        ps_by_node.setdefault(node_of(cluster, h), h)
    ref = plans[0]
    bounds = [[(s.first, s.last) for s in p.stages] for p in plans]
    for v, b in enumerate(bounds[1:], start=1):
        if b != bounds[0]:
            k = next((k for k, (x, y) in enumerate(zip(bounds[0], b)) if x != y),
                     min(len(b), len(bounds[0])))
            raise _bad(f"ED-local needs the same partition in every virtual worker, but "
                       f"stage {k} differs",
                       f"VW 0 stage {k} = {_span(bounds[0], k)}, VW {v} stage {k} = {_span(b, k)}",
                       "allocate with ED so all VWs get identical plans, or use "
                       "PlacementPolicy.DEFAULT")
    stage_ps: list[str] = []
    for k in range(ref.num_stages):
        nodes = {v: node_of(cluster, cluster.device(p.stages[k].device).host)
                 for v, p in enumerate(plans)}
        if len(set(nodes.values())) > 1:
            where = {f"VW {v}": cluster.device(p.stages[k].device).host
                     for v, p in enumerate(plans)}
            raise _bad(f"ED-local needs stage {k} on the same node in every virtual worker, "
                       f"but it is not", f"stage {k} hosts={where}",
                       "allocate with ED (each VW takes one device of every node) or use "
                       "PlacementPolicy.DEFAULT")
        node = nodes[0]
        if node not in ps_by_node:
            host = cluster.device(ref.stages[k].device).host
            raise _bad(f"ED-local needs a parameter server on the node of stage {k}",
                       f"stage host={host!r}, ps_hosts={list(ps)}",
                       f"add {host!r} (or a ps task on the same machine) to ps_hosts")
        stage_ps.append(ps_by_node[node])
    hosts = {i: stage_ps[ref.stage_of_node(i)] for i in with_params}
    return Placement(policy, ps, hosts, names)


def traffic(placement: Placement, plans: Sequence[Plan], profile: Any,
            cluster: Cluster) -> tuple[tuple[tuple[StageTraffic, ...], ...], ...]:
    """Per VW, per stage: the parameter traffic with each PS in one wave (graph order of
    first use; PS hosts the stage exchanges nothing with are absent)."""
    plans = _check_plans(profile, plans)
    out = []
    for plan in plans:
        per_stage = []
        for stage in plan.stages:
            stage_node = node_of(cluster, cluster.device(stage.device).host)
            by_ps: dict[str, int] = {}
            for i in range(stage.first, stage.last + 1):
                if i in placement.layer_hosts:
                    h = placement.layer_hosts[i]
                    by_ps[h] = by_ps.get(h, 0) + profile.layers[i].trainable_param_bytes
            per_stage.append(tuple(
                StageTraffic(h, b, node_of(cluster, h) != stage_node)
                for h, b in by_ps.items()))
        out.append(tuple(per_stage))
    return tuple(out)


def bytes_across_hosts_per_wave(placement: Placement, plans: Sequence[Plan], profile: Any,
                                cluster: Cluster) -> int:
    """Push + pull bytes that cross a node boundary when every VW finishes one wave."""
    return sum(2 * t.bytes for vw in traffic(placement, plans, profile, cluster)
               for stage in vw for t in stage if t.crosses_host)


def ps_device(cluster: Cluster, host_name: str) -> str:
    """The TensorFlow device of the parameter server on `host_name`.

    A host that is a TF task ("ps", 0) serves from '/job:ps/replica:0/task:0/device:CPU:0'
    (a `tf.distribute.Server`); a local emulated host serves from its first logical CPU
    device (this machine's memory stands in for the host's); any other host from the
    local CPU.
    """
    host = cluster.host(host_name)
    if host.task is not None:
        job, index = host.task
        return f"/job:{job}/replica:0/task:{index}/device:CPU:0"
    for d in host.devices:
        if "CPU" in d.tf_device.upper():
            return d.tf_device
    return "/device:CPU:0"
