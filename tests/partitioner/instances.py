"""Random small partitioning instances built from the real cluster and profile types."""

from __future__ import annotations

import itertools

import numpy as np

from hetpipe_tf.cluster.spec import Cluster, Device, Host
from hetpipe_tf.partitioner.cost import CostModel
from hetpipe_tf.partitioner.profile import LayerCost, ModelProfile

TYPES = ("TITAN_V", "RTX_2060", "QUADRO_P4000")


def random_instance(seed: int, num_layers: int, num_devices: int, *, memory_scale: float = 1.0):
    """(profile, devices, cluster) with random times, bytes and memories (memory in KiB)."""
    rng = np.random.default_rng(seed)
    layers = tuple(
        LayerCost(name=f"l{i}",
                  time_s={t: float(rng.uniform(1e-3, 2e-2)) for t in TYPES},
                  flops=0, bytes_accessed=0,
                  param_bytes=int(rng.integers(0, 200_000)),
                  trainable_param_bytes=0, activation_bytes=int(rng.integers(0, 300_000)))
        for i in range(num_layers))
    # trainable <= param, as in a real model
    layers = tuple(
        LayerCost(**{**l.to_dict(), "trainable_param_bytes": int(l.param_bytes * rng.uniform())})
        for l in layers)
    profile = ModelProfile(model_name="random", batch_size=8, layers=layers,
                           cut_bytes=tuple(int(b) for b in rng.integers(0, 40_000_000,
                                                                        num_layers - 1)),
                           time_source={t: "estimated" for t in TYPES})
    hosts: dict[str, list[Device]] = {}
    for i in range(num_devices):
        host = f"h{int(rng.integers(0, 2))}"
        hosts.setdefault(host, []).append(Device(
            name=f"d{i}", type_name=str(rng.choice(TYPES)), host=host,
            tf_device=f"/device:CPU:{i}",
            emulated_speed_factor=float(rng.choice([1.0, 0.5])),
            memory_bytes=int(rng.integers(300_000, 3_000_000) * memory_scale)))
    cluster = Cluster(hosts=tuple(Host(name=h, devices=tuple(ds), intra_bandwidth=15.75e9)
                                  for h, ds in hosts.items()),
                      inter_bandwidth=7e9)
    devices = [d for h in cluster.hosts for d in h.devices]
    return profile, devices, cluster


def clustered_instance(seed: int, num_layers: int, class_sizes: tuple[int, ...], *,
                       memory_scale: float = 1.0):
    """(profile, devices, cluster) whose devices come in classes of interchangeable ones
    (same type, host, speed and memory), `class_sizes[g]` devices in class g; classes may
    share a host (PCIe between them) or not (network)."""
    rng = np.random.default_rng(seed)
    profile, _, _ = random_instance(seed, num_layers, 1)
    hosts: dict[str, list[Device]] = {}
    for g, size in enumerate(class_sizes):
        host = f"h{int(rng.integers(0, 2))}"
        kind = dict(type_name=str(rng.choice(TYPES)), host=host,
                    emulated_speed_factor=float(rng.choice([1.0, 0.5])),
                    memory_bytes=int(rng.integers(300_000, 3_000_000) * memory_scale))
        for i in range(size):
            n = sum(len(v) for v in hosts.values())
            hosts.setdefault(host, []).append(
                Device(name=f"c{g}d{i}", tf_device=f"/device:CPU:{n}", **kind))
    cluster = Cluster(hosts=tuple(Host(name=h, devices=tuple(ds), intra_bandwidth=15.75e9)
                                  for h, ds in hosts.items()),
                      inter_bandwidth=7e9)
    devices = [d for h in cluster.hosts for d in h.devices]
    return profile, devices, cluster


def exhaustive_best(profile, devices, cluster, n_m, optimizer_slots=0, usable_fraction=0.9):
    """The independent reference: every order and every set of allowed cuts (none between
    two calls of a shared layer: `profile.forbidden_cuts`), cost by CostModel."""
    cm = CostModel(profile, devices, cluster, n_m=n_m, optimizer_slots=optimizer_slots,
                   usable_fraction=usable_fraction)
    best = None
    allowed = [c for c in range(len(profile.layers) - 1) if c not in profile.forbidden_cuts]
    for order in itertools.permutations(devices):
        for cuts in itertools.combinations(allowed, len(devices) - 1):
            costs = cm.evaluate(list(cuts), order)
            if all(c.fits for c in costs):
                value = max(c.time_s for c in costs)
                if best is None or value < best:
                    best = value
    return best
