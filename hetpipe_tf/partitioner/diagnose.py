"""Explain why no partition fits: which devices are short of memory, by how much, and what fits.

The layout shown is the one that minimises the largest memory overflow over every order and
cut (an MILP of its own), so "short by" is the least shortfall any partition achieves.
"""

from __future__ import annotations

import dataclasses
from typing import Any, Sequence

from hetpipe_tf.partitioner.comm import CommModel
from hetpipe_tf.partitioner.cost import CostModel
from hetpipe_tf.partitioner.plan import PartitionError
from hetpipe_tf.partitioner.search import fits, max_minibatches, search


def format_bytes(n: float) -> str:
    """Bytes in the largest binary unit that keeps the number >= 1 (e.g. '1.50 GiB')."""
    for unit, size in (("GiB", 2**30), ("MiB", 2**20), ("KiB", 2**10)):
        if abs(n) >= size:
            return f"{n / size:.2f} {unit}"
    return f"{int(n)} B"


def _least_overflow_layout(cm: CostModel, devices: Sequence[Any], options: Any):
    # No time budget here: the diagnosis examines at most max_enumerated_orders orders.
    untimed = dataclasses.replace(options, time_limit_s=None)
    best, _, _ = search(cm, devices, untimed, objective="overflow")
    return cm.evaluate(best.cuts, best.order), best.order


def infeasible_error(profile: Any, devices: Sequence[Any], n_m: int, *, cluster: Any,
                     comm: CommModel | None, optimizer_slots: int, options: Any,
                     sync: Any = None, prediction: Any = None) -> PartitionError:
    """A PartitionError naming the short devices and suggesting what would fit."""
    cm = CostModel(profile, devices, cluster, n_m=n_m, optimizer_slots=optimizer_slots,
                   comm=comm, usable_fraction=options.usable_fraction, sync=sync,
                   prediction=prediction)
    costs, order = _least_overflow_layout(cm, devices, options)
    short = [f"{d.name} ({d.type_name}) needs {format_bytes(c.memory_bytes)} of "
             f"{format_bytes(c.memory_available)} usable, short by "
             f"{format_bytes(c.memory_bytes - c.memory_available)}"
             for d, c in zip(order, costs) if not c.fits]
    suggestions = []
    if sync is not None and not sync.rematerialize and fits(
            profile, devices, 1, cluster=cluster, optimizer_slots=optimizer_slots,
            options=options, sync=dataclasses.replace(sync, rematerialize=True)):
        suggestions.append("rematerialize=True fits")
    extra = prediction.copies(n_m) if prediction is not None else 0
    if extra and fits(profile, devices, n_m, cluster=cluster, optimizer_slots=optimizer_slots,
                      options=options):
        # The staleness compensation's buffers are what does not fit (cost.py).
        suggestions.append(f"without weight prediction's {extra} extra copies of the "
                           "weights it fits (compensation='none', 'momentum' or 'average')")
    if n_m > 1:
        m = max_minibatches(profile, devices, cluster=cluster, optimizer_slots=optimizer_slots,
                            limit=n_m - 1, options=options, prediction=prediction)
        if m:
            suggestions.append(f"N_m={m} fits (Max_m of these devices)")
    if hasattr(profile, "scaled"):
        batch = profile.batch_size // 2
        while batch >= 1:
            if fits(profile.scaled(batch), devices, 1, cluster=cluster,
                    optimizer_slots=optimizer_slots, options=options):
                suggestions.append(f"batch_size={batch} fits with N_m=1")
                break
            batch //= 2
    total_need = sum(c.memory_bytes for c in costs)
    total_have = sum(c.memory_available for c in costs)
    suggestions.append(
        f"{'or ' if suggestions else ''}add devices: this layout needs "
        f"{format_bytes(total_need)} in all, the {len(devices)} device(s) offer "
        f"{format_bytes(total_have)} usable")
    return PartitionError(
        f"No partition of {profile.model_name} (batch_size={profile.batch_size}) over "
        f"{len(devices)} device(s) fits memory with N_m={n_m}. At the best order found "
        f"({', '.join(d.name for d in order)}): " + "; ".join(short) +
        ". Received: devices=" + str([d.name for d in devices]) + f", n_m={n_m}"
        + (f", prediction={prediction}" if extra else "") + ". "
        "To fix: " + "; ".join(suggestions) + ".")
