"""Device speeds the cluster model uses: a measured speed order imposed on a profile.

Per-layer times estimated from data sheets (the catalog's roofline) can rank two types
against what was measured on them: peak FP32 ranks TITAN RTX (16.3 TFLOP/s) above TITAN V
(14.9), while the paper measured V > R > G > Q (Section 8.1, "in terms of computation
power"). `in_measured_order` keeps every estimate but lifts each layer's time on a type to
at least its time on the next faster type of the order: the order holds layer by layer,
and no type gains speed. The paper gives the order, not the ratios, so a type the data
sheet ranks too fast runs as fast as the type above it (docs/cluster_model.md).
"""

from __future__ import annotations

import dataclasses
from typing import Any, Sequence

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


__all__ = ["PAPER_MEASURED_ORDER", "in_measured_order"]
