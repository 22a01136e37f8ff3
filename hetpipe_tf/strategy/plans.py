"""Plans made by hand (no profiling): for tests, benchmarks and users who know their split.

`manual_plan(model, stages, n_m)` builds a `hetpipe_tf.partitioner.plan.Plan` whose stage j
runs the next `num_layers` nodes of the model's layer order on `tf_device`. The predicted
times are 0 (unknown); the memory fields say "fits" (0 of 1 byte).
"""

from __future__ import annotations

import dataclasses
import itertools
from typing import Sequence

from hetpipe_tf.core.schedule import held_minibatches
from hetpipe_tf.partitioner.layer_graph import LayerGraph
from hetpipe_tf.partitioner.plan import Plan, StagePlan


@dataclasses.dataclass(frozen=True)
class StageSpec:
    """A stage of a hand-made plan: `num_layers` nodes on `tf_device`."""

    tf_device: str
    num_layers: int
    emulated_speed_factor: float = 1.0
    name: str | None = None


def layer_order(model) -> tuple[str, ...]:
    """The model's layer (node) names in the order plans index them (its LayerGraph's)."""
    return tuple(n.name for n in LayerGraph.from_model(model).nodes)


def manual_plan(model, stages: Sequence[StageSpec | tuple], n_m: int, batch_size: int = 0,
                optimizer_slots: int = 0) -> Plan:
    return _plan(model.name, LayerGraph.from_model(model), stages, n_m, batch_size,
                 optimizer_slots)


def _plan(model_name: str, graph: LayerGraph, stages: Sequence[StageSpec | tuple], n_m: int,
          batch_size: int = 0, optimizer_slots: int = 0) -> Plan:
    specs = [s if isinstance(s, StageSpec) else StageSpec(*s) for s in stages]
    names = tuple(n.name for n in graph.nodes)
    total = sum(s.num_layers for s in specs)
    if total != len(names) or any(s.num_layers < 1 for s in specs):
        raise ValueError(
            "The stages of a plan must cover every layer of the model with at least one "
            f"layer each. Received: layers per stage {[s.num_layers for s in specs]} (sum "
            f"{total}), the model has {len(names)} layers; make the counts sum to {len(names)}.")
    out, first = [], 0
    for j, s in enumerate(specs):
        last = first + s.num_layers - 1
        out.append(StagePlan(
            index=j, device=s.name or s.tf_device, device_type="MANUAL", tf_device=s.tf_device,
            first=first, last=last, layer_names=tuple(names[first:last + 1]), compute_s=0.0,
            recv_forward_s=0.0, recv_backward_s=0.0, memory_bytes=0, memory_available=1,
            minibatches_held=held_minibatches(j, len(specs), n_m),
            emulated_speed_factor=s.emulated_speed_factor))
        first = last + 1
    return Plan(model_name=model_name, batch_size=batch_size, n_m=n_m,
                optimizer_slots=optimizer_slots, stages=tuple(out), num_layers=len(names),
                solver="manual", notes=graph.notes)


def even_plan(model, tf_devices: Sequence[str], n_m: int, batch_size: int = 0,
              speed_factors: Sequence[float] | None = None) -> Plan:
    """Equal-layer split over `tf_devices` (the baseline the planner is compared with); a
    cut between two calls of a shared layer moves to the nearest allowed one."""
    graph = LayerGraph.from_model(model)
    n, k = len(graph), len(tf_devices)
    allowed = [c for c in range(n - 1) if graph.allowed_cut(c)]
    if k - 1 > len(allowed):
        why = (" (a shared layer's calls stay in one stage)" if len(allowed) < n - 1 else "")
        raise ValueError(
            f"More stages than the model can be split into. Received: {k} devices, {n} "
            f"layers with {len(allowed)} allowed cuts{why}; use at most {len(allowed) + 1} "
            "devices.")
    sizes = [n // k + (1 if j < n % k else 0) for j in range(k)]
    cuts = _nearest_allowed(list(itertools.accumulate(sizes))[:-1], allowed)
    sizes = [b - a for a, b in zip([-1, *cuts], [*cuts, n - 1])]
    factors = list(speed_factors) if speed_factors is not None else [1.0] * k
    return _plan(model.name, graph,
                 [StageSpec(d, c, f) for d, c, f in zip(tf_devices, sizes, factors)], n_m,
                 batch_size)


def _nearest_allowed(ends: Sequence[int], allowed: Sequence[int]) -> list[int]:
    """For the stage sizes' running totals `ends`, increasing cuts from `allowed`, each the
    nearest to its ideal cut (end - 1) that leaves room for the cuts after it."""
    out, lo = [], 0
    for j, end in enumerate(ends):
        hi = len(allowed) - (len(ends) - j)   # leave one allowed cut per later boundary
        pos = min(range(lo, hi + 1), key=lambda p: (abs(allowed[p] - (end - 1)), p))
        out.append(allowed[pos])
        lo = pos + 1
    return out


def layer_devices(plan: Plan) -> dict[str, str]:
    """Layer scope -> TF device of its stage in `plan`, under every suffix of the layer's
    path: a nested model's layer "backbone/block/dense" builds its variables under a name
    scope ending in "dense" (or "block/dense")."""
    out: dict[str, str] = {}
    for s in plan.stages:
        for name in s.layer_names:
            parts = name.split("@")[0].split("/")
            for i in range(len(parts)):
                out.setdefault("/".join(parts[i:]), s.tf_device)
    return out
