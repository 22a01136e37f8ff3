"""Device speeds the cluster model uses: a measured speed order imposed on a profile.

Per-layer times estimated from data sheets (the catalog's roofline) can rank two types
against what was measured on them: peak FP32 ranks TITAN RTX (16.3 TFLOP/s) above TITAN V
(14.9), while the paper measured V > R > G > Q (Section 8.1, "in terms of computation
power"). `in_measured_order` keeps every estimate but lifts each layer's time on a type to
at least its time on the next faster type of the order: the order holds layer by layer,
and no type gains speed. The paper gives the order, not the ratios, so a type the data
sheet ranks too fast runs as fast as the type above it (docs/cluster_model.md).

Updates: the paper's benchmark [52] (tf_cnn_benchmarks) trains with its default optimizer,
plain SGD (`--optimizer=sgd` in benchmark_cnn.py): w = w - lr g reads w and g and writes w,
3 bytes moved per weight byte (`SGD_UPDATE_TRAFFIC`). HetPipe also keeps the version w_p
each minibatch used until that minibatch's backward (Section 4: "w_p must be kept in GPU
memory"), a copy of the stage's weights per minibatch, 2 bytes more
(`VERSIONED_UPDATE_TRAFFIC` = `profile.update_bytes` with no slots). An update is memory
bound: bytes / memory_bandwidth / efficiency + launch overhead, the estimate
`profiling.profile_model` makes for an optimizer (data-sheet bandwidth, the profile's
`DEFAULT_EFFICIENCY`). `with_update_costs` puts HetPipe's on every layer (`update_s`);
`plain_update_s` is one GPU's plain step (single GPU, Horovod): the profile's update
without the copy.
"""

from __future__ import annotations

import dataclasses
from typing import Any, Sequence

from hetpipe_tf.cluster.catalog import get_device_type
from hetpipe_tf.partitioner.cost import optimizer_slots
from hetpipe_tf.partitioner.profile import DEFAULT_EFFICIENCY, update_bytes

# The paper's measured order of computation power, fastest first (Section 8.1, Table 3's
# text: "V > R > G > Q").
PAPER_MEASURED_ORDER = ("TITAN_V", "TITAN_RTX", "RTX_2060", "QUADRO_P4000")


def in_measured_order(profile: Any, order: Sequence[str] = PAPER_MEASURED_ORDER) -> Any:
    """`profile` with layer times non-decreasing along `order` (types it lacks skipped)."""
    present = [t for t in order if all(t in l.time_s for l in profile.layers)]
    layers = []
    for l in profile.layers:
        times = dict(l.time_s)
        for faster, slower in zip(present, present[1:]):
            times[slower] = max(times[slower], times[faster])
        layers.append(dataclasses.replace(l, time_s=times))
    return dataclasses.replace(profile, layers=tuple(layers))


# Bytes an update moves per trainable weight byte (module doc).
SGD_UPDATE_TRAFFIC = 3
VERSIONED_UPDATE_TRAFFIC = update_bytes(1, 0, 0)     # 5: SGD + the version copy


def update_seconds(nbytes: int, device_type: str) -> float:
    """Seconds a memory-bound update moving `nbytes` takes on `device_type` (0 for 0)."""
    if nbytes <= 0:
        return 0.0
    t = get_device_type(device_type)
    return nbytes / t.memory_bandwidth / DEFAULT_EFFICIENCY[t.kind] + t.launch_overhead_s


def with_update_costs(profile: Any, traffic: int = VERSIONED_UPDATE_TRAFFIC) -> Any:
    """`profile` whose layers cost HetPipe's per-minibatch update on every type of it:
    `traffic` bytes per trainable byte (module doc); times are unchanged."""
    layers = []
    for l in profile.layers:
        nbytes = int(l.trainable_param_bytes) * traffic
        layers.append(dataclasses.replace(
            l, update_s={t: update_seconds(nbytes, t) for t in l.time_s}))
    return dataclasses.replace(profile, layers=tuple(layers), update_optimizer="sgd")


def without_update_costs(profile: Any) -> Any:
    """`profile` with no update costed (every `update_s` empty)."""
    if not profile.update_optimizer and not any(l.update_s for l in profile.layers):
        return profile
    layers = tuple(dataclasses.replace(l, update_s={}) for l in profile.layers)
    return dataclasses.replace(profile, layers=layers, update_optimizer="")


def plain_update_s(profile: Any, device_type: str) -> float:
    """Seconds of one GPU's plain optimizer step over the whole model: the profile's own
    per-layer updates on `device_type` without the version copy, i.e. x (3 + 2 slots) /
    (5 + 2 slots) (module doc; slots of `profile.update_optimizer`, 0 if unknown)."""
    try:
        slots = optimizer_slots(profile.update_optimizer or "sgd")
    except ValueError:
        slots = 0
    share = (SGD_UPDATE_TRAFFIC + 2 * slots) / (VERSIONED_UPDATE_TRAFFIC + 2 * slots)
    return share * sum(l.update_s.get(device_type, 0.0) for l in profile.layers)


__all__ = ["PAPER_MEASURED_ORDER", "SGD_UPDATE_TRAFFIC", "VERSIONED_UPDATE_TRAFFIC",
           "in_measured_order", "plain_update_s", "update_seconds", "with_update_costs",
           "without_update_costs"]
