"""Instances whose device memories sit exactly at a layout's needs (the MILP's knife edge)."""

from __future__ import annotations

import dataclasses

import numpy as np

from hetpipe_tf.cluster.spec import Cluster, Host
from hetpipe_tf.partitioner.cost import CostModel
from tests.partitioner.instances import clustered_instance, random_instance


def with_memories(cluster: Cluster, memory: dict[str, int]):
    """(devices, cluster) with the named devices' memory replaced, hosts kept."""
    hosts = tuple(Host(name=h.name, intra_bandwidth=h.intra_bandwidth,
                       devices=tuple(dataclasses.replace(d, memory_bytes=memory.get(d.name,
                                                                                d.memory_bytes))
                                     for d in h.devices))
                  for h in cluster.hosts)
    new = Cluster(hosts=hosts, inter_bandwidth=cluster.inter_bandwidth)
    return [d for h in new.hosts for d in h.devices], new


def knife_edge_instance(seed: int, num_layers: int, num_devices: int, n_m: int, slots: int,
                        short_by: int = 0):
    """(profile, devices, cluster, witness) where a random layout `witness` = (cuts, order
    names) needs exactly each device's memory (usable_fraction must be 1.0), except the
    device at a random position, which is `short_by` bytes short of it."""
    rng = np.random.default_rng(seed)
    profile, devices, cluster = random_instance(seed, num_layers, num_devices)
    order = [devices[i] for i in rng.permutation(num_devices)]
    cuts = sorted(int(c) for c in rng.choice(num_layers - 1, num_devices - 1, replace=False))
    cm = CostModel(profile, devices, cluster, n_m=n_m, optimizer_slots=slots,
                   usable_fraction=1.0)
    need = {d.name: c.memory_bytes for d, c in zip(order, cm.evaluate(cuts, order))}
    short = order[int(rng.integers(num_devices))].name
    need[short] -= short_by
    devices, cluster = with_memories(cluster, need)
    return profile, devices, cluster, (cuts, [d.name for d in order])


def clustered_knife_edge_instance(seed: int, num_layers: int, class_sizes: tuple[int, ...],
                                  n_m: int, slots: int, short_by: int = 0):
    """As `knife_edge_instance` with interchangeable devices (`clustered_instance`): each
    class gets the memory its neediest member needs in the random witness layout (so classes
    stay classes and that member is exactly at the edge), and one random class `short_by`
    bytes less."""
    rng = np.random.default_rng(seed)
    profile, devices, cluster = clustered_instance(seed, num_layers, class_sizes)
    k = len(devices)
    order = [devices[i] for i in rng.permutation(k)]
    cuts = sorted(int(c) for c in rng.choice(num_layers - 1, k - 1, replace=False))
    cm = CostModel(profile, devices, cluster, n_m=n_m, optimizer_slots=slots,
                   usable_fraction=1.0)
    need = {d.name: c.memory_bytes for d, c in zip(order, cm.evaluate(cuts, order))}
    by_class: dict[str, int] = {}
    for d in devices:      # names are c<class>d<index>
        g = d.name.split("d")[0]
        by_class[g] = max(by_class.get(g, 0), need[d.name])
    short = sorted(by_class)[int(rng.integers(len(by_class)))]
    by_class[short] -= short_by
    devices, cluster = with_memories(
        cluster, {d.name: by_class[d.name.split("d")[0]] for d in devices})
    return profile, devices, cluster, (cuts, [d.name for d in order])
