"""Horovod-style data-parallel baseline (the paper's "Horovod" rows): an analytic model.

Every GPU holds the whole model (GPUs where it does not fit memory are left out, as the
paper leaves out the RTX 2060s for ResNet-152), runs one minibatch of `batch_size`, then
all GPUs ring-all-reduce the gradients; no overlap of compute and communication:

    step = max over GPUs of compute + 2 (n-1)/n x gradient_bytes / slowest ring link
    throughput = n x batch_size / step

The ring visits the GPUs host by host, so with more than one host its slowest link is the
network (`inter_bandwidth`), else the host's PCIe x `intra_scale`. Bytes per step: each of
the n ring links carries 2 (n-1)/n x gradient_bytes; the ring crosses hosts h times.
Memory: the partitioner's cost model for one stage holding the whole model with N_m = 1.
"""

from __future__ import annotations

import dataclasses
from typing import Any, Sequence

from hetpipe_tf.cluster.spec import Cluster, Device
from hetpipe_tf.partitioner.cost import CostModel


@dataclasses.dataclass(frozen=True)
class AllReduceResult:
    devices: tuple[str, ...]          # the GPUs used
    excluded: tuple[str, ...]         # GPUs the model does not fit
    compute_s: tuple[float, ...]      # per used GPU
    allreduce_s: float
    step_s: float
    batch_size: int
    bytes_inter_host: int             # per step
    bytes_intra_host: int

    @property
    def samples_per_s(self) -> float:
        if not self.devices:
            return 0.0
        return len(self.devices) * self.batch_size / self.step_s


def ring_allreduce_seconds(nbytes: int, n: int, bandwidth: float) -> float:
    """Time of a ring all-reduce of `nbytes` over n participants at `bandwidth` per link."""
    if n <= 1 or nbytes <= 0:
        return 0.0
    return 2 * (n - 1) / n * nbytes / bandwidth


def data_parallel(compute_s: Sequence[float], hosts: Sequence[str], gradient_bytes: int,
                  cluster: Cluster, batch_size: int, *, names: Sequence[str] | None = None,
                  intra_scale: float = 0.7, excluded: Sequence[str] = ()) -> AllReduceResult:
    """The step model for GPUs with the given per-minibatch compute times and hosts."""
    n = len(compute_s)
    distinct = list(dict.fromkeys(hosts))
    if len(distinct) > 1:
        bw = cluster.inter_bandwidth
    elif distinct:
        bw = cluster.host(distinct[0]).intra_bandwidth * intra_scale
    else:
        bw = 1.0
    ar = ring_allreduce_seconds(gradient_bytes, n, bw)
    per_link = int(2 * (n - 1) / n * gradient_bytes) if n > 1 else 0
    crossings = len(distinct) if len(distinct) > 1 else 0
    return AllReduceResult(
        devices=tuple(names or [f"gpu{i}" for i in range(n)]), excluded=tuple(excluded),
        compute_s=tuple(compute_s), allreduce_s=ar,
        step_s=(max(compute_s) if n else 0.0) + ar, batch_size=batch_size,
        bytes_inter_host=crossings * per_link, bytes_intra_host=(n - crossings) * per_link
        if n > 1 else 0)


def horovod(profile: Any, devices: Sequence[Device | str], cluster: Cluster, *,
            optimizer_slots: int = 0, usable_fraction: float = 0.9,
            intra_scale: float = 0.7) -> AllReduceResult:
    """The baseline for a `ModelProfile` on `devices` of `cluster` (module doc)."""
    chosen = [cluster.device(d) for d in devices]
    used, excluded, times = [], [], []
    last = len(profile.layers) - 1
    for d in chosen:
        cm = CostModel(profile, [d], cluster, n_m=1, optimizer_slots=optimizer_slots,
                       usable_fraction=usable_fraction)
        cost = cm.stage_cost(0, last, 0, [d])
        if not cost.fits:
            excluded.append(d.name)
            continue
        used.append(d)
        times.append(cost.compute_s)
    grad = int(sum(l.trainable_param_bytes for l in profile.layers))
    return data_parallel(times, [d.host for d in used], grad, cluster, profile.batch_size,
                         names=[d.name for d in used], intra_scale=intra_scale,
                         excluded=excluded)
