"""The partition of a model over one virtual worker: a frozen, JSON-serialisable value.

A `Plan` says which contiguous range of layer-graph nodes each pipeline stage runs, on which
device, and what the cost model predicted for it. It can be printed, saved, loaded, cached
and simulated; the runtime places stages from it and checks it against the model.
"""

from __future__ import annotations

import dataclasses
import json
from typing import Any, Mapping, Sequence


class PartitionError(ValueError):
    """No partition of the model fits the devices (or the request is malformed)."""


@dataclasses.dataclass(frozen=True)
class StagePlan:
    """One pipeline stage: nodes `first..last` (inclusive) of the layer graph on `device`."""

    index: int
    device: str
    device_type: str
    tf_device: str
    first: int
    last: int
    layer_names: tuple[str, ...]
    compute_s: float
    recv_forward_s: float
    recv_backward_s: float
    memory_bytes: int
    memory_available: int
    minibatches_held: int
    emulated_speed_factor: float = 1.0
    update_s: float = 0.0   # the stage's own update per minibatch (optimizer + next version)

    @property
    def time_s(self) -> float:
        """Predicted time of one minibatch on this stage: forward+backward, its update and
        receiving activations and gradients (the cost model's `StageCost.time_s`)."""
        return self.compute_s + self.update_s + self.recv_forward_s + self.recv_backward_s

    @property
    def num_layers(self) -> int:
        return self.last - self.first + 1


@dataclasses.dataclass(frozen=True)
class Plan:
    """Partition of `model_name` over the devices of one virtual worker, in pipeline order."""

    model_name: str
    batch_size: int
    n_m: int
    optimizer_slots: int
    stages: tuple[StagePlan, ...]
    num_layers: int
    solver: str = "milp"
    orders_considered: int = 1
    solve_seconds: float = 0.0
    # What limits the split, from the layer graph (e.g. a nested model that stays one node).
    notes: tuple[str, ...] = ()

    def __post_init__(self) -> None:
        if not self.stages:
            raise PartitionError("A plan needs at least one stage. Received: stages=().")
        expected = 0
        seen: dict[str, int] = {}
        for position, stage in enumerate(self.stages):
            if stage.index != position:
                raise PartitionError(
                    "Plan stages must be numbered 0, 1, ... in pipeline order. Received: "
                    f"stage at position {position} with index={stage.index}; set "
                    f"index={position} (or rebuild the plan).")
            if stage.first != expected or stage.last < stage.first:
                raise PartitionError(
                    "Plan stages must cover the layer graph with contiguous, non-empty ranges "
                    f"in order. Received: stage {stage.index} with first={stage.first}, "
                    f"last={stage.last}; expected first={expected}.")
            # A hand-edited JSON can make layer_names disagree with first..last, and the
            # runtime places layers by name while the simulator counts by range.
            if len(stage.layer_names) != stage.num_layers:
                raise PartitionError(
                    f"Plan stage {stage.index} covers nodes {stage.first}..{stage.last} "
                    f"({stage.num_layers} layers) but lists {len(stage.layer_names)} layer "
                    f"names. Received: layer_names={list(stage.layer_names)[:6]}; list "
                    "exactly one name per node of first..last, or fix first/last.")
            for name in stage.layer_names:
                if name in seen:
                    raise PartitionError(
                        "A layer appears twice in the plan (every layer runs on one stage). "
                        f"Received: layer {name!r} in stage {seen[name]} and stage "
                        f"{stage.index}; list each layer once (rebuild the plan with "
                        "hetpipe_tf.partitioner.plan_model or strategy.manual_plan).")
                seen[name] = stage.index
            expected = stage.last + 1
        if expected != self.num_layers:
            raise PartitionError(
                f"Plan stages cover {expected} nodes but the model has {self.num_layers}. "
                f"Received: num_layers={self.num_layers}.")

    @property
    def num_stages(self) -> int:
        return len(self.stages)

    @property
    def bottleneck(self) -> StagePlan:
        """The stage with the largest predicted time: it sets the pipeline's pace."""
        return max(self.stages, key=lambda s: s.time_s)

    @property
    def predicted_stage_time_s(self) -> float:
        return self.bottleneck.time_s

    @property
    def devices(self) -> tuple[str, ...]:
        return tuple(s.device for s in self.stages)

    def stage_of_node(self, node: int) -> int:
        for stage in self.stages:
            if stage.first <= node <= stage.last:
                return stage.index
        raise ValueError(f"Node index out of range. Received: node={node}; the plan has "
                         f"{self.num_layers} nodes.")

    def check_matches(self, layer_names: Sequence[str]) -> None:
        """Raise PartitionError unless this plan was made for a graph with these node names."""
        planned = tuple(n for s in self.stages for n in s.layer_names)
        if tuple(layer_names) != planned:
            first_diff = next((i for i, (a, b) in enumerate(zip(planned, layer_names)) if a != b),
                              min(len(planned), len(layer_names)))
            raise PartitionError(
                "The plan does not match the model: its layers differ from the model's layer "
                f"graph at position {first_diff}. Received: plan has {len(planned)} layers, "
                f"model has {len(layer_names)}; make a new plan for this model "
                "(hetpipe_tf.partitioner.plan_model).")

    # --- serialisation -------------------------------------------------------------------
    def to_dict(self) -> dict[str, Any]:
        d = dataclasses.asdict(self)
        d["stages"] = [dataclasses.asdict(s) for s in self.stages]
        return d

    @classmethod
    def from_dict(cls, d: Mapping[str, Any]) -> "Plan":
        fields = {f.name for f in dataclasses.fields(cls)}
        unknown = set(d) - fields
        if unknown:
            raise ValueError(f"Unknown keys in a plan. Received: {sorted(unknown)}; expected "
                             f"a subset of {sorted(fields)}.")
        missing = {f.name for f in dataclasses.fields(cls)
                   if f.default is dataclasses.MISSING} - set(d)
        if missing:
            raise ValueError(f"A plan lacks required keys. Received: keys={sorted(d)}; add "
                             f"{sorted(missing)} (write plans with Plan.save / to_json).")
        stage_fields = {f.name for f in dataclasses.fields(StagePlan)}
        stage_required = {f.name for f in dataclasses.fields(StagePlan)
                          if f.default is dataclasses.MISSING}
        stages = []
        for j, s in enumerate(d["stages"]):
            bad = set(s) - stage_fields
            lacking = stage_required - set(s)
            if bad or lacking:
                raise ValueError(
                    f"Plan stage {j} has unknown or missing keys. Received: unknown="
                    f"{sorted(bad)}, missing={sorted(lacking)}; use exactly "
                    f"{sorted(stage_required)} (plus emulated_speed_factor, update_s).")
            names = s["layer_names"]
            if isinstance(names, str) or not all(isinstance(n, str) for n in names):
                raise ValueError(
                    f"Plan stage {j}: layer_names must be a list of layer-name strings. "
                    f"Received: layer_names={names!r}; list one name per layer.")
            stages.append(StagePlan(**{**s, "layer_names": tuple(names)}))
        return cls(**{**d, "stages": tuple(stages), "notes": tuple(d.get("notes", ()))})

    def to_json(self, indent: int | None = 2) -> str:
        return json.dumps(self.to_dict(), indent=indent)

    @classmethod
    def from_json(cls, text: str) -> "Plan":
        try:
            d = json.loads(text)
        except json.JSONDecodeError as e:
            raise ValueError(f"A plan file is not valid JSON. Received: {e}; write plans "
                             "with Plan.save / to_json.") from None
        if not isinstance(d, dict):
            raise ValueError(f"A plan's JSON must be an object. Received: {type(d).__name__}; "
                             "write plans with Plan.save / to_json.")
        return cls.from_dict(d)

    def save(self, path: str) -> None:
        with open(path, "w", encoding="utf-8") as f:
            f.write(self.to_json())

    @classmethod
    def load(cls, path: str) -> "Plan":
        with open(path, encoding="utf-8") as f:
            return cls.from_json(f.read())

    # --- display -------------------------------------------------------------------------
    def table(self) -> str:
        """A text table: stage, device, layers, predicted ms, memory used/available."""
        head = (f"Plan for {self.model_name}: batch_size={self.batch_size}, N_m={self.n_m}, "
                f"{self.num_stages} stages, bottleneck stage {self.bottleneck.index} "
                f"({self.bottleneck.time_s * 1e3:.2f} ms/minibatch)")
        rows = [("stage", "device", "type", "layers", "first..last", "compute ms", "update ms",
                 "comm ms", "total ms", "memory GiB used/avail", "held")]
        for s in self.stages:
            emul = f" (emulated x{s.emulated_speed_factor:g})" if s.emulated_speed_factor != 1 else ""
            rows.append((
                str(s.index), s.device + emul, s.device_type, str(s.num_layers),
                f"{s.layer_names[0]}..{s.layer_names[-1]}", f"{s.compute_s * 1e3:.2f}",
                f"{s.update_s * 1e3:.2f}", f"{(s.recv_forward_s + s.recv_backward_s) * 1e3:.2f}",
                f"{s.time_s * 1e3:.2f}",
                f"{s.memory_bytes / 2**30:.2f}/{s.memory_available / 2**30:.2f}",
                str(s.minibatches_held)))
        widths = [max(len(r[i]) for r in rows) for i in range(len(rows[0]))]
        lines = [head]
        for n, r in enumerate(rows):
            lines.append("  ".join(c.ljust(w) for c, w in zip(r, widths)).rstrip())
            if n == 0:
                lines.append("  ".join("-" * w for w in widths))
        if len(self.stages) > 1:
            lines.append("cuts after: " + " | ".join(s.layer_names[-1] for s in self.stages[:-1]))
        lines.extend(f"note: {n}" for n in self.notes)
        lines.append(f"solver={self.solver}, orders considered={self.orders_considered}, "
                     f"solve time={self.solve_seconds:.2f} s")
        return "\n".join(lines)
