"""Resource allocation: which devices of a cluster form each virtual worker (Section 8.1).

`allocate(cluster, policy, ...)` returns one tuple of `Device`s per virtual worker (VW),
ready for `hetpipe_tf.partitioner.milp.plan_virtual_workers`. Hosts without devices
(parameter-server tasks) are ignored.

- NP (Node Partition): each VW is the devices of one host (or a contiguous chunk of
  `gpus_per_worker` of them). Least communication inside a VW; VWs differ, stragglers.
- ED (Equal Distribution): every VW gets an equal share of every host's devices: a host's
  devices, grouped by type, are dealt round-robin to the VWs (VW i takes device i of each
  host when hosts hold as many devices as there are VWs). All VWs hold the same multiset
  of device types, so they get the same plan (what ED-local parameter placement needs).
- HD (Hybrid Distribution): device classes are ranked by speed and paired fastest with
  slowest, second fastest with second slowest, ... (an odd middle class stays alone);
  each pair's devices are split evenly over as many VWs as they fill, each VW taking the
  next devices of each class in host order (so a VW spans as few hosts as possible). On
  the paper's cluster with the measured ranking V > R > G > Q this is Table 3's
  VVQQ, VVQQ, RRGG, RRGG.
- AUTO: the best of NP, ED, HD under `score(vws) -> float` (higher is better, e.g. the
  simulator's predicted throughput); policies that cannot be built are skipped. Without a
  scorer the heuristic `straggler_score` is used: the smallest aggregate peak FLOP/s of
  any VW (the pace of the slowest VW bounds synchronous progress under WSP), ties broken
  by fewer hosts per VW (less cross-host traffic), then by the order NP, HD, ED.

Speed ranking (HD and the straggler score): an explicit `ranking` (device type names,
fastest first) wins; else a `ModelProfile`'s total forward+backward time per type; else
the catalog's `peak_flops`; a device's speed is then multiplied by its
`emulated_speed_factor`. Note that peak FLOP/s ranks TITAN_RTX above TITAN_V, while the
paper measured V > R; pass the profile or a ranking to reproduce the paper's HD.
"""

from __future__ import annotations

import collections
import dataclasses
import enum
import math
from functools import reduce
from typing import Any, Callable, Sequence

from hetpipe_tf._args import check_int, parse_enum
from hetpipe_tf.cluster.catalog import canonical_type_name, get_device_type
from hetpipe_tf.cluster.errors import AllocationError, invalid
from hetpipe_tf.cluster.spec import Cluster, Device

VirtualWorkers = tuple[tuple[Device, ...], ...]
Scorer = Callable[[VirtualWorkers], float]


class AllocationPolicy(enum.Enum):
    """How devices are grouped into virtual workers (Section 8.1, Table 3)."""

    NP = "NP"
    ED = "ED"
    HD = "HD"
    AUTO = "AUTO"

    @classmethod
    def parse(cls, value: "str | AllocationPolicy") -> "AllocationPolicy":
        """The policy for a flag value such as "ed" or "auto" (case-insensitive)."""
        return parse_enum(cls, value, arg="policy", what="allocation policy",
                          error=AllocationError)


@dataclasses.dataclass(frozen=True)
class PolicyScore:
    """One candidate of AUTO: the policy, its virtual workers and its score (or the error)."""

    policy: AllocationPolicy
    virtual_workers: VirtualWorkers | None
    score: float | None
    error: str | None = None


def _bad(what: str, received: str, fix: str) -> AllocationError:
    return invalid(what, received, fix, AllocationError)


def _class_key(d: Device) -> tuple[str, float]:
    return (d.type_name, d.emulated_speed_factor)


def _compute_hosts(cluster: Cluster) -> list[tuple[str, tuple[Device, ...]]]:
    if not isinstance(cluster, Cluster):
        raise _bad("allocate needs a Cluster", f"cluster={cluster!r}",
                   "build one with Cluster(...) or paper_cluster()")
    hosts = [(h.name, h.devices) for h in cluster.hosts if h.devices]
    if not hosts:  # Cluster itself forbids this; kept for safety with subclasses
        raise _bad("The cluster has no compute devices", "cluster with 0 devices",
                   "declare devices on at least one host")
    return hosts


def device_speeds(devices: Sequence[Device], *, profile: Any = None,
                  ranking: Sequence[str] | None = None) -> dict[str, float]:
    """Relative speed of each device (by name); larger is faster.

    `ranking` (type names, fastest first) gives speed len-rank; else `profile` gives
    1 / total forward+backward seconds of the model on the type; else peak FLOP/s. The
    result is multiplied by the device's emulated speed factor.
    """
    types = sorted({d.type_name for d in devices})
    if ranking is not None:
        order = [canonical_type_name(t) for t in ranking]
        missing = [t for t in types if t not in order]
        if missing:
            raise _bad("The ranking leaves out device types of the cluster",
                       f"ranking={list(ranking)}, missing={missing}",
                       "list every device type of the cluster, fastest first")
        base = {t: float(len(order) - order.index(t)) for t in types}
    elif profile is not None:
        missing = [t for t in types if t not in profile.time_source]
        if missing:
            raise _bad("The profile has no times for some device types of the cluster",
                       f"profile types={sorted(profile.time_source)}, missing={missing}",
                       "profile the model for these types or pass ranking=[...]")
        base = {}
        for t in types:
            total = sum(layer.time_s[t] for layer in profile.layers)
            base[t] = 1.0 / total if total > 0 else math.inf
    else:
        base = {t: float(get_device_type(t).peak_flops) for t in types}
    return {d.name: base[d.type_name] * d.emulated_speed_factor for d in devices}


def _resolve_counts(total: int, default_v: int, num_virtual_workers: int | None,
                    gpus_per_worker: int | None) -> tuple[int, int]:
    for field, value in (("num_virtual_workers", num_virtual_workers),
                         ("gpus_per_worker", gpus_per_worker)):
        if value is not None:
            check_int(field, value, minimum=1, error=AllocationError,
                      hint=f"pass a positive {field}, or None for the policy's default")
    if num_virtual_workers is None and gpus_per_worker is None:
        v = default_v
    elif num_virtual_workers is None:
        if total % gpus_per_worker:
            raise _bad("gpus_per_worker must divide the number of devices",
                       f"gpus_per_worker={gpus_per_worker}, devices={total}",
                       f"use a divisor of {total}")
        v = total // gpus_per_worker
    else:
        v = num_virtual_workers
    if total % v:
        raise _bad("num_virtual_workers must divide the number of devices",
                   f"num_virtual_workers={v}, devices={total}", f"use a divisor of {total}")
    g = total // v
    if gpus_per_worker is not None and g != gpus_per_worker:
        raise _bad("num_virtual_workers x gpus_per_worker must equal the number of devices",
                   f"num_virtual_workers={v}, gpus_per_worker={gpus_per_worker}, "
                   f"devices={total}", "pass only one of the two")
    return v, g


def _default_v(hosts: list[tuple[str, tuple[Device, ...]]]) -> int:
    return reduce(math.gcd, (len(ds) for _, ds in hosts))


def _np(hosts, num_virtual_workers, gpus_per_worker) -> VirtualWorkers:
    total = sum(len(ds) for _, ds in hosts)
    if num_virtual_workers is None and gpus_per_worker is None:
        return tuple(tuple(ds) for _, ds in hosts)
    v, g = _resolve_counts(total, len(hosts), num_virtual_workers, gpus_per_worker)
    uneven = {name: len(ds) for name, ds in hosts if len(ds) % g}
    if uneven:
        raise _bad("NP keeps each virtual worker inside one host, so gpus_per_worker must "
                   "divide every host's device count",
                   f"gpus_per_worker={g}, devices per host={uneven}",
                   "pick a divisor of every host's device count, or use ED/HD")
    return tuple(tuple(ds[i:i + g]) for _, ds in hosts for i in range(0, len(ds), g))


def _deal(devices: Sequence[Device], v: int) -> list[list[Device]]:
    """Group `devices` by class (first appearance order) and deal them round-robin."""
    by_class: dict[tuple, list[Device]] = {}
    for d in devices:
        by_class.setdefault(_class_key(d), []).append(d)
    out: list[list[Device]] = [[] for _ in range(v)]
    i = 0
    for ds in by_class.values():
        for d in ds:
            out[i % v].append(d)
            i += 1
    return out


def _ed(hosts, num_virtual_workers, gpus_per_worker) -> VirtualWorkers:
    total = sum(len(ds) for _, ds in hosts)
    default = _default_v(hosts)
    counts = {name: len(ds) for name, ds in hosts}
    if num_virtual_workers is None and gpus_per_worker is None and default == 1 and \
            len(set(counts.values())) > 1:
        raise _bad("ED needs every host to give each virtual worker the same number of "
                   "devices, and these hosts' device counts have no common divisor > 1",
                   f"devices per host={counts}",
                   "pass num_virtual_workers=1 for one VW over all devices, or use NP/HD")
    v, _ = _resolve_counts(total, default, num_virtual_workers, gpus_per_worker)
    uneven = {name: c for name, c in counts.items() if c % v}
    if uneven:
        raise _bad("ED gives every virtual worker an equal share of every host, so the "
                   "number of virtual workers must divide each host's device count",
                   f"num_virtual_workers={v}, devices per host={counts}",
                   f"use a common divisor of {sorted(set(counts.values()))} or use NP/HD")
    vws: list[list[Device]] = [[] for _ in range(v)]
    for _, ds in hosts:
        for i, part in enumerate(_deal(ds, v)):
            vws[i].extend(part)
    multisets = [collections.Counter(_class_key(d) for d in vw) for vw in vws]
    if any(m != multisets[0] for m in multisets[1:]):
        odd = {f"{name}:{t}": c for name, ds in hosts
               for (t, _), c in collections.Counter(_class_key(d) for d in ds).items() if c % v}
        raise _bad("ED needs identical virtual workers, but some host holds a device type "
                   "in a count the virtual workers cannot share equally",
                   f"num_virtual_workers={v}, host:type counts not divisible={odd}",
                   "use another num_virtual_workers, or HD/NP")
    return tuple(tuple(vw) for vw in vws)


def _hd(hosts, num_virtual_workers, gpus_per_worker, speeds) -> VirtualWorkers:
    total = sum(len(ds) for _, ds in hosts)
    _, g = _resolve_counts(total, _default_v(hosts), num_virtual_workers, gpus_per_worker)
    classes: dict[tuple, list[Device]] = {}
    for _, ds in hosts:  # host order inside each class
        for d in ds:
            classes.setdefault(_class_key(d), []).append(d)
    ranked = sorted(classes, key=lambda k: -speeds[classes[k][0].name])  # stable
    groups = []
    lo, hi = 0, len(ranked) - 1
    while lo <= hi:
        groups.append([ranked[lo]] if lo == hi else [ranked[lo], ranked[hi]])
        lo, hi = lo + 1, hi - 1
    vws: list[tuple[Device, ...]] = []
    for group in groups:
        size = sum(len(classes[k]) for k in group)
        counts = {k[0]: len(classes[k]) for k in group}
        w, rem = divmod(size, g)
        if rem or any(len(classes[k]) % w for k in group):
            raise _bad("HD pairs the fastest device type with the slowest, and this pair's "
                       "devices cannot be split into equal virtual workers",
                       f"pair={counts}, gpus_per_worker={g}",
                       "choose gpus_per_worker so every pair splits evenly, or use ED/NP/AUTO")
        for i in range(w):
            vw: list[Device] = []
            for k in group:
                n = len(classes[k]) // w
                vw.extend(classes[k][i * n:(i + 1) * n])
            vws.append(tuple(vw))
    return tuple(vws)


def straggler_score(vws: VirtualWorkers) -> float:
    """The default AUTO score: min over VWs of aggregate peak FLOP/s (x emulation factor)."""
    return min(sum(get_device_type(d.type_name).peak_flops * d.emulated_speed_factor
                   for d in vw) for vw in vws)


def _hosts_per_vw(vws: VirtualWorkers) -> float:
    return sum(len({d.host for d in vw}) for vw in vws) / len(vws)


def compare_policies(cluster: Cluster, num_virtual_workers: int | None = None,
                     gpus_per_worker: int | None = None, *, score: Scorer | None = None,
                     profile: Any = None, ranking: Sequence[str] | None = None,
                     ) -> tuple[PolicyScore, ...]:
    """NP, ED and HD on this cluster with their scores (error text where impossible)."""
    out = []
    for policy in (AllocationPolicy.NP, AllocationPolicy.HD, AllocationPolicy.ED):
        try:
            vws = allocate(cluster, policy, num_virtual_workers, gpus_per_worker,
                           profile=profile, ranking=ranking)
        except AllocationError as e:
            out.append(PolicyScore(policy, None, None, str(e)))
            continue
        value = float(score(vws)) if score is not None else straggler_score(vws)
        out.append(PolicyScore(policy, vws, value))
    return tuple(out)


def choose_policy(cluster: Cluster, num_virtual_workers: int | None = None,
                  gpus_per_worker: int | None = None, *, score: Scorer | None = None,
                  profile: Any = None, ranking: Sequence[str] | None = None,
                  ) -> PolicyScore:
    """The AUTO choice: highest score; ties -> fewer hosts per VW, then NP, HD, ED."""
    candidates = compare_policies(cluster, num_virtual_workers, gpus_per_worker,
                                  score=score, profile=profile, ranking=ranking)
    ok = [c for c in candidates if c.virtual_workers is not None]
    if not ok:
        raise _bad("No allocation policy can build these virtual workers",
                   "; ".join(f"{c.policy.value}: {c.error}" for c in candidates),
                   "change num_virtual_workers / gpus_per_worker")
    best_score = max(c.score for c in ok)
    tied = [c for c in ok if math.isclose(c.score, best_score, rel_tol=1e-9)]
    return min(tied, key=lambda c: _hosts_per_vw(c.virtual_workers))  # stable: NP, HD, ED


def allocate(cluster: Cluster, policy: AllocationPolicy | str,
             num_virtual_workers: int | None = None, gpus_per_worker: int | None = None,
             *, profile: Any = None, ranking: Sequence[str] | None = None,
             score: Scorer | None = None) -> VirtualWorkers:
    """The devices of each virtual worker under `policy` (one tuple per VW).

    Args:
      cluster: the cluster; hosts without devices are ignored.
      policy: an `AllocationPolicy` (or its name, e.g. "hd").
      num_virtual_workers, gpus_per_worker: give at most what you need; the defaults are
        one VW per host (NP) and g.c.d. of the hosts' device counts VWs (ED, HD; 4 VWs of
        4 on the paper cluster).
      profile: a `ModelProfile` ranking device types by measured/estimated model time.
      ranking: device type names, fastest first (overrides `profile`).
      score: AUTO only: `score(vws) -> float`, higher is better.
    """
    policy = AllocationPolicy.parse(policy)
    hosts = _compute_hosts(cluster)
    if policy is AllocationPolicy.AUTO:
        return choose_policy(cluster, num_virtual_workers, gpus_per_worker, score=score,
                             profile=profile, ranking=ranking).virtual_workers
    if score is not None:
        raise _bad("score is only used by AUTO", f"policy={policy.value}, score={score!r}",
                   "drop score or pass policy=AllocationPolicy.AUTO")
    if policy is AllocationPolicy.NP:
        return _np(hosts, num_virtual_workers, gpus_per_worker)
    if policy is AllocationPolicy.ED:
        return _ed(hosts, num_virtual_workers, gpus_per_worker)
    speeds = device_speeds([d for _, ds in hosts for d in ds], profile=profile,
                           ranking=ranking)
    return _hd(hosts, num_virtual_workers, gpus_per_worker, speeds)


PAPER_LETTERS = {"TITAN_V": "V", "TITAN_RTX": "R", "RTX_2060": "G", "QUADRO_P4000": "Q"}


def type_string(vw: Sequence[Device], letters: dict[str, str] | None = None) -> str:
    """A VW as a string of type letters, e.g. "VVQQ": the paper's letters (V, R, G, Q) for
    its four types, `letters` for others, else a type's first letter."""
    table = {**PAPER_LETTERS, **(letters or {})}
    return "".join(table.get(d.type_name, d.type_name[0]) for d in vw)
