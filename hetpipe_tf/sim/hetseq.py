"""HetSeq-style data parallelism on a simulated cluster: unequal shares of one global batch.

The Horovod baseline (`sim/allreduce.py`) gives every GPU a minibatch of `batch_size`, so
the slowest GPU sets the step. HetSeq gives GPU k a share n_k of the same global batch
N = (GPUs) x batch_size, chosen by `partitioner.shares.choose_shares` from the profile
(per-sample time on the device's type / its emulated speed factor) within the device's
memory, so every share ends at about the same time. A GPU whose memory does not hold even
the model is left out (as the baseline leaves it out); one that holds the model but not a
whole `batch_size` minibatch still takes the share it has room for, which the baseline
cannot use.

Step model: Horovod's (`horovod_step`, the same ring, fusion buffers and overlap with the
backward pass), with GPU k's layer times those of its share: compute x n_k / batch_size.
After the all-reduce each GPU applies the summed gradient to its own copy (HetSeq's
Figure 1): a profile that costs updates (`update_optimizer`) adds the slowest GPU's plain
optimizer step (`calibration.plain_update_s`, no weight-version copy), as Horovod's step
does (sim/allreduce.py). step = max(slowest share, end of the last fused all-reduce) +
that update; samples/s = N / step.
"""

from __future__ import annotations

import dataclasses
from typing import Any, Sequence

from hetpipe_tf.cluster.spec import Cluster, Device
from hetpipe_tf.partitioner.cost import CostModel
from hetpipe_tf.partitioner.shares import Shares, choose_shares, speeds_from_profile
from hetpipe_tf.sim.allreduce import HorovodConfig, _bytes, _ring_bandwidth, horovod_step
from hetpipe_tf.sim.calibration import plain_update_s


@dataclasses.dataclass(frozen=True)
class HetSeqResult:
    shares: Shares
    excluded: tuple[str, ...]         # GPUs the model does not fit at all
    share_s: tuple[float, ...]        # per used GPU: its share's compute + update
    step_s: float                     # the ring's step + the update after it
    bytes_inter_host: int             # per step
    bytes_intra_host: int
    update_s: float = 0.0             # the optimizer step after the all-reduce (in step_s)

    @property
    def samples_per_s(self) -> float:
        return self.shares.batch_size / self.step_s if self.step_s > 0 else 0.0

    def line(self) -> str:
        return (f"HetSeq (shares by speed of a global batch of {self.shares.batch_size} over "
                f"{len(self.shares.sizes)} GPUs"
                + (f", {len(self.excluded)} without memory for the model" if self.excluded
                   else "")
                + f"): {self.samples_per_s:.1f} samples/s; shares "
                f"{list(self.shares.sizes)}; bytes across hosts per step "
                f"{self.bytes_inter_host / 1e6:.1f} MB")


def hetseq(profile: Any, devices: Sequence[Device | str], cluster: Cluster, *,
           global_batch: int | None = None, optimizer_slots: int = 0,
           usable_fraction: float = 0.9, intra_scale: float = 0.7,
           config: HorovodConfig = HorovodConfig()) -> HetSeqResult:
    """Simulated HetSeq step for `profile` on `devices` (module doc). `global_batch`:
    None = (devices that hold the model) x the profile's batch size."""
    chosen = [cluster.device(d) for d in devices]
    speeds = speeds_from_profile(profile, chosen, cluster, optimizer_slots=optimizer_slots,
                                 usable_fraction=usable_fraction)
    used = [(d, s) for d, s in zip(chosen, speeds) if s.max_samples != 0]
    excluded = tuple(d.name for d, s in zip(chosen, speeds) if s.max_samples == 0)
    b = profile.batch_size
    n = global_batch if global_batch is not None else b * len(used)
    shares = choose_shares(n, [s for _, s in used])
    layer_times = []
    for (d, _), k in zip(used, shares.sizes):
        cm = CostModel(profile, [d], cluster, n_m=1, optimizer_slots=optimizer_slots,
                       usable_fraction=usable_fraction)
        compute = cm.layer_compute_time(d) * (k / b)
        layer_times.append([float(x) for x in compute])
    update = (max(plain_update_s(profile, d.type_name) for d, _ in used)
              if used and profile.update_optimizer else 0.0)
    grads = [int(l.trainable_param_bytes) for l in profile.layers]
    hosts = [d.host for d, _ in used]
    bw = _ring_bandwidth(hosts, cluster, intra_scale, config)
    step, _ = horovod_step(layer_times, grads, bw, config)
    inter, intra = _bytes(len(used), hosts, sum(grads))
    return HetSeqResult(shares=shares, excluded=excluded,
                        share_s=tuple(sum(t) + update for t in layer_times),
                        step_s=step + update, bytes_inter_host=inter,
                        bytes_intra_host=intra, update_s=update)
