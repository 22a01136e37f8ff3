"""Plans made by hand (no profiling): for tests, benchmarks and users who know their split.

`manual_plan(model, stages, n_m)` builds a `hetpipe_tf.partitioner.plan.Plan` whose stage j
runs the next `num_layers` nodes of the model's layer order on `tf_device`. The predicted
times are 0 (unknown); the memory fields say "fits" (0 of 1 byte).
"""

from __future__ import annotations

import dataclasses
from typing import Sequence

from hetpipe_tf.partitioner.cost import held_minibatches
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
    specs = [s if isinstance(s, StageSpec) else StageSpec(*s) for s in stages]
    names = layer_order(model)
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
    return Plan(model_name=model.name, batch_size=batch_size, n_m=n_m,
                optimizer_slots=optimizer_slots, stages=tuple(out), num_layers=len(names),
                solver="manual")


def even_plan(model, tf_devices: Sequence[str], n_m: int, batch_size: int = 0,
              speed_factors: Sequence[float] | None = None) -> Plan:
    """Equal-layer split over `tf_devices` (the baseline the planner is compared with)."""
    n = len(layer_order(model))
    k = len(tf_devices)
    if k > n:
        raise ValueError(f"More stages than layers. Received: {k} devices, {n} layers; use "
                         f"at most {n} devices.")
    sizes = [n // k + (1 if j < n % k else 0) for j in range(k)]
    factors = list(speed_factors) if speed_factors is not None else [1.0] * k
    return manual_plan(model, [StageSpec(d, c, f) for d, c, f in zip(tf_devices, sizes, factors)],
                       n_m, batch_size)
