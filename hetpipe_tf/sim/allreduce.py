"""Horovod-style data-parallel baseline (the paper's "Horovod" rows): an analytic model.

Every GPU holds the whole model (GPUs where it does not fit memory are left out, as the
paper leaves out the RTX 2060s for ResNet-152), runs one minibatch of `batch_size`, and the
gradients are summed by a ring all-reduce over all GPUs (the paper's byte counts, Section
8.3, are those of one flat ring: see docs/paper_reproduction.md).

Two step models:

* `data_parallel` (the simple bound): compute, then all gradients at once, no overlap:
      step = max over GPUs of compute + 2 (n-1)/n x gradient_bytes / slowest ring link
* `horovod_step` (what Horovod of 2019 did, `HorovodConfig`): the gradients of a layer are
  handed to Horovod as the backward pass produces them (last layer first); every
  `cycle_time_s` Horovod's background thread takes the tensors that EVERY rank has ready
  (its negotiation) and reduces them in fused buffers of at most `fusion_threshold_bytes`
  (a tensor larger than the threshold is reduced alone), one buffer after the other, while
  the remaining backward pass goes on (Horovod docs, tensor-fusion.rst: "interleave
  communication and computation"; defaults 64 MB and 5 ms until v0.21.0, which changed
  them to 128 MB and 1 ms). `overlap=False` waits for the whole backward pass instead.
      step = max(slowest GPU's compute, end of the last fused all-reduce)

The ring visits the GPUs host by host, so with more than one host its slowest link is the
network, else the host's PCIe x `intra_scale`; `HorovodConfig` can name other link
bandwidths (e.g. what NCCL reaches over InfiniBand, or `HOROVOD_CPU`: the rate of Horovod's
all-reduce on the CPU that Horovod's own benchmark measured). Bytes per step: each of the n ring
links carries 2 (n-1)/n x gradient_bytes; the ring crosses hosts h times.
Memory: the partitioner's cost model for one stage holding the whole model with N_m = 1,
plus Horovod's fusion buffer when there is more than one GPU.
Layer times split 1/3 forward, 2/3 backward (the profiler's 3x rule, as in sim/model.py).
Update: a profile that costs updates (`update_optimizer`) adds, after the all-reduce, the
slowest GPU's plain optimizer step (`calibration.plain_update_s`, no weight-version copy):
    step += max over GPUs of plain_update_s
"""

from __future__ import annotations

import dataclasses
import math
from typing import Any, Sequence

from hetpipe_tf.cluster.spec import Cluster, Device
from hetpipe_tf.partitioner.cost import CostModel
from hetpipe_tf.sim.calibration import plain_update_s

MIB = 2**20
# Horovod's defaults up to v0.20 (2019-2020); v0.21.0 changed them to 128 MB and 1 ms
# (release notes of v0.21.0, PR #2468). Source: horovod docs/tensor-fusion.rst.
HOROVOD_FUSION_THRESHOLD_BYTES = 64 * MIB
HOROVOD_CYCLE_TIME_S = 5e-3

# Horovod's all-reduce on the CPU (MPI on host memory; `pip install horovod` without
# HOROVOD_GPU_ALLREDUCE=NCCL, and tf_cnn_benchmarks' --horovod_device default), as Horovod's
# own benchmark measured it (horovod/horovod README table, PR #44, 2017-10-17): VGG-16,
# batch 64, 16 Pascal GPUs on 4 servers, 25 Gb/s RoCE; one GPU 130.9 images/s, "RDMA
# Horovod (allreduce on CPU)" 618.0 images/s ("TCP Horovod (allreduce on CPU)" 616.8: the
# CPU side bounds it, not the network). VGG-16 has 138,357,544 float32 parameters.
HOROVOD_README_VGG16 = {"gpus": 16, "batch_size": 64, "single_gpu_samples_per_s": 130.9,
                        "cpu_allreduce_samples_per_s": 618.0,
                        "gradient_bytes": 138_357_544 * 4}


def cpu_ring_bandwidth(gpus: int = HOROVOD_README_VGG16["gpus"],
                       batch_size: int = HOROVOD_README_VGG16["batch_size"],
                       single_gpu_samples_per_s: float =
                       HOROVOD_README_VGG16["single_gpu_samples_per_s"],
                       samples_per_s: float = HOROVOD_README_VGG16["cpu_allreduce_samples_per_s"],
                       gradient_bytes: int = HOROVOD_README_VGG16["gradient_bytes"]) -> float:
    """Bytes/s of one ring link that a measured data-parallel run implies when its step is
    compute, then the all-reduce (the `overlap=False` step model):
        2 (n-1)/n x gradient_bytes / (n x batch / samples_per_s - batch / single_gpu).
    With the defaults (Horovod's CPU all-reduce benchmark) 0.888 GB/s."""
    spare = gpus * batch_size / samples_per_s - batch_size / single_gpu_samples_per_s
    if gpus < 2 or spare <= 0:
        raise ValueError(f"The run must take longer than its compute on >= 2 GPUs. Received: "
                         f"gpus={gpus}, step {gpus * batch_size / samples_per_s:.3f} s, "
                         f"compute {batch_size / single_gpu_samples_per_s:.3f} s.")
    return 2 * (gpus - 1) / gpus * gradient_bytes / spare


@dataclasses.dataclass(frozen=True)
class HorovodConfig:
    """How the Horovod baseline is modelled (see the module doc).

    fusion_threshold_bytes: HOROVOD_FUSION_THRESHOLD (0 = every tensor reduced alone).
    cycle_time_s: HOROVOD_CYCLE_TIME in seconds.
    overlap: reduce gradients while the backward pass goes on (Horovod does); False waits
      for the whole backward pass.
    intra_bandwidth: bytes/s of a ring link inside a host; None = the host's PCIe x
      `intra_scale` of `horovod()`.
    inter_bandwidth: bytes/s of a ring link across hosts; None = the cluster's.
    """

    fusion_threshold_bytes: int = HOROVOD_FUSION_THRESHOLD_BYTES
    cycle_time_s: float = HOROVOD_CYCLE_TIME_S
    overlap: bool = True
    intra_bandwidth: float | None = None
    inter_bandwidth: float | None = None

    def __post_init__(self) -> None:
        if self.fusion_threshold_bytes < 0:
            raise ValueError("fusion_threshold_bytes must be >= 0. Received: "
                             f"fusion_threshold_bytes={self.fusion_threshold_bytes!r}.")
        if not (self.cycle_time_s >= 0 and math.isfinite(self.cycle_time_s)):
            raise ValueError(f"cycle_time_s must be a finite number >= 0. Received: "
                             f"cycle_time_s={self.cycle_time_s!r}.")
        for f in ("intra_bandwidth", "inter_bandwidth"):
            v = getattr(self, f)
            if v is not None and not (v > 0 and math.isfinite(v)):
                raise ValueError(f"{f} must be None or > 0 (bytes/s). Received: {f}={v!r}.")


# Horovod with its all-reduce on the CPU: compute, then the all-reduce at the measured CPU
# rate on every ring link, inside a host or across (`cpu_ring_bandwidth`).
_CPU_RING_BANDWIDTH = cpu_ring_bandwidth()
HOROVOD_CPU = HorovodConfig(overlap=False, intra_bandwidth=_CPU_RING_BANDWIDTH,
                            inter_bandwidth=_CPU_RING_BANDWIDTH)


@dataclasses.dataclass(frozen=True)
class AllReduceResult:
    devices: tuple[str, ...]          # the GPUs used
    excluded: tuple[str, ...]         # GPUs the model does not fit
    compute_s: tuple[float, ...]      # per used GPU
    allreduce_s: float                # time the ring is busy (not all of it on the step's path)
    step_s: float
    batch_size: int
    bytes_inter_host: int             # per step
    bytes_intra_host: int
    ring_bandwidth: float = 0.0       # bytes/s of the slowest ring link (0: one GPU)
    update_s: float = 0.0             # the optimizer step after the all-reduce (in step_s)

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


def fusion_buffers(sizes: Sequence[int], threshold: int) -> list[int]:
    """Byte sizes of the fused all-reduces of tensors `sizes` taken in order (Horovod's
    rule: the next tensors that fit in `threshold` bytes; a larger tensor goes alone)."""
    out: list[int] = []
    current = 0
    for s in sizes:
        if s <= 0:
            continue
        if current and current + s > threshold:
            out.append(current)
            current = 0
        current += s
        if current >= threshold:
            out.append(current)
            current = 0
    if current:
        out.append(current)
    return out


def horovod_step(layer_times: Sequence[Sequence[float]], grad_bytes: Sequence[int],
                 bandwidth: float, config: HorovodConfig = HorovodConfig()) -> tuple[float, float]:
    """(step seconds, seconds the ring is busy) of one Horovod step.

    layer_times[g][i]: forward+backward seconds of layer i on GPU g (profile order);
    grad_bytes[i]: gradient bytes of layer i; bandwidth: the slowest ring link (bytes/s).
    """
    n = len(layer_times)
    if n == 0:
        return 0.0, 0.0
    num_layers = len(grad_bytes)
    compute_end = max(sum(t) for t in layer_times)
    if n == 1:
        return compute_end, 0.0
    # ready[i]: every rank has layer i's gradient (forward, then backward from the end).
    ready = [0.0] * num_layers
    for times in layer_times:
        t = sum(times) / 3
        for i in range(num_layers - 1, -1, -1):
            t += 2 * times[i] / 3
            ready[i] = max(ready[i], t)
    if not config.overlap:
        ready = [compute_end] * num_layers
    pending = [i for i in range(num_layers - 1, -1, -1) if grad_bytes[i] > 0]
    pending.sort(key=lambda i: ready[i])      # stable: backward order among equals
    cycle = config.cycle_time_s
    busy = 0.0
    start = 0.0                               # start of the current cycle
    end = 0.0
    k = 0
    while k < len(pending):
        first_ready = ready[pending[k]]
        if first_ready > start:               # sleep whole cycles until something is ready
            start += math.ceil((first_ready - start) / cycle) * cycle if cycle > 0 else \
                first_ready - start
        start = max(start, first_ready) if cycle <= 0 else start
        batch = []
        while k < len(pending) and (ready[pending[k]] <= start + 1e-12 or not batch):
            batch.append(grad_bytes[pending[k]])      # (the first is ready up to rounding)
            k += 1
        t = start
        for nbytes in fusion_buffers(batch, config.fusion_threshold_bytes or 1):
            d = ring_allreduce_seconds(nbytes, n, bandwidth)
            t += d
            busy += d
        end = t
        start = max(start + cycle, t)         # next cycle
    return max(compute_end, end), busy


def _ring_bandwidth(hosts: Sequence[str], cluster: Cluster, intra_scale: float,
                    config: HorovodConfig | None) -> float:
    distinct = list(dict.fromkeys(hosts))
    if not distinct:
        return 1.0
    intra = min((config.intra_bandwidth if config and config.intra_bandwidth else
                 cluster.host(h).intra_bandwidth * intra_scale) for h in distinct)
    if len(distinct) == 1:
        return intra
    inter = (config.inter_bandwidth if config and config.inter_bandwidth
             else cluster.inter_bandwidth)
    return min(intra, inter)


def _bytes(n: int, hosts: Sequence[str], gradient_bytes: int) -> tuple[int, int]:
    distinct = list(dict.fromkeys(hosts))
    per_link = int(2 * (n - 1) / n * gradient_bytes) if n > 1 else 0
    crossings = len(distinct) if len(distinct) > 1 else 0
    return crossings * per_link, (n - crossings) * per_link if n > 1 else 0


def data_parallel(compute_s: Sequence[float], hosts: Sequence[str], gradient_bytes: int,
                  cluster: Cluster, batch_size: int, *, names: Sequence[str] | None = None,
                  intra_scale: float = 0.7, excluded: Sequence[str] = ()) -> AllReduceResult:
    """The no-overlap step model for GPUs with the given per-minibatch compute times."""
    n = len(compute_s)
    bw = _ring_bandwidth(hosts, cluster, intra_scale, None)
    ar = ring_allreduce_seconds(gradient_bytes, n, bw)
    inter, intra = _bytes(n, hosts, gradient_bytes)
    return AllReduceResult(
        devices=tuple(names or [f"gpu{i}" for i in range(n)]), excluded=tuple(excluded),
        compute_s=tuple(compute_s), allreduce_s=ar,
        step_s=(max(compute_s) if n else 0.0) + ar, batch_size=batch_size,
        bytes_inter_host=inter, bytes_intra_host=intra, ring_bandwidth=bw if n > 1 else 0.0)


def horovod(profile: Any, devices: Sequence[Device | str], cluster: Cluster, *,
            optimizer_slots: int = 0, usable_fraction: float = 0.9,
            intra_scale: float = 0.7,
            config: HorovodConfig | None = HorovodConfig()) -> AllReduceResult:
    """The baseline for a `ModelProfile` on `devices` of `cluster` (module doc).

    config=None: the no-overlap `data_parallel` bound; else `horovod_step` with `config`.
    """
    chosen = [cluster.device(d) for d in devices]
    fusion = (config.fusion_threshold_bytes if config is not None and len(chosen) > 1 else 0)
    used, excluded, times = [], [], []
    last = len(profile.layers) - 1
    for d in chosen:
        cm = CostModel(profile, [d], cluster, n_m=1, optimizer_slots=optimizer_slots,
                       usable_fraction=usable_fraction)
        cost = cm.stage_cost(0, last, 0, [d])
        if cost.memory_bytes + fusion > cost.memory_available:
            excluded.append(d.name)
            continue
        used.append(d)
        times.append(cm.layer_compute_time(d))   # the update comes after the ring
    grads = [int(l.trainable_param_bytes) for l in profile.layers]
    hosts = [d.host for d in used]
    names = [d.name for d in used]
    update = (max(plain_update_s(profile, d.type_name) for d in used)
              if used and profile.update_optimizer else 0.0)
    if config is None:
        r = data_parallel([float(t.sum()) for t in times], hosts, sum(grads), cluster,
                          profile.batch_size, names=names, intra_scale=intra_scale,
                          excluded=excluded)
        return dataclasses.replace(r, step_s=r.step_s + update, update_s=update)
    n = len(used)
    bw = _ring_bandwidth(hosts, cluster, intra_scale, config)
    step, busy = horovod_step([list(map(float, t)) for t in times], grads, bw, config)
    inter, intra = _bytes(n, hosts, sum(grads))
    return AllReduceResult(devices=tuple(names), excluded=tuple(excluded),
                           compute_s=tuple(float(t.sum()) for t in times), allreduce_s=busy,
                           step_s=step + update, batch_size=profile.batch_size,
                           bytes_inter_host=inter, bytes_intra_host=intra,
                           ring_bandwidth=bw if n > 1 else 0.0, update_s=update)
