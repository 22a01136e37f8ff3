"""Profile of a Keras model as a value: per-layer time on each device type, FLOPs,
memory and cut bytes, saved and loaded as JSON. No TensorFlow: the simulator, the planner
and the tests read profiles without it; `profiling.profile_model` makes one from a model.

Everything is per minibatch at the profile's batch size; "layer" means a node of the
`LayerGraph` (one call of a Keras layer), in graph order.

- `flops`: forward+backward FLOPs (3 x forward for a layer with trainable weights, 2 x
  otherwise); `bytes_accessed` = 3 x (distinct input tensors + outputs + param_bytes): the
  forward reads inputs and weights and writes outputs, the backward touches them about
  twice.
- Memory: `param_bytes` / `trainable_param_bytes` (gradients and optimizer slots are
  derived from them by the cost model); `activation_bytes` is the layer's output for the
  minibatch, what its consumers' backward keeps.
- `time_s[type]`: forward+backward seconds; `ModelProfile.time_source[type]` says whether
  the type was "measured", "estimated" (roofline, `estimate_time`:
  max(flops / peak_flops, bytes_accessed / memory_bandwidth) / efficiency
  + launch_overhead_s, with efficiency `DEFAULT_EFFICIENCY[kind]`, GPU 0.5, CPU 0.3:
  typical fractions of peak that framework kernels reach) or "calibrated" (profiling.py).
- `update_s[type]` (empty when no optimizer was costed): the per-minibatch update of the
  node's weights (update_timing.py); estimated as bytes / memory_bandwidth / efficiency
  + launch_overhead_s with bytes from `update_bytes`: trainable x (5 + 2 x slots) + float
  non-trainable x 5 (read weight and gradient, read and write each slot, write the weight,
  and the copy-on-write copy of the weight that the live snapshot forces: 2 more).
- `ModelProfile.scaled(b)` rescales linearly: FLOPs, times, activations, cut bytes and
  the activation part of bytes_accessed by b / batch_size (it ignores fixed per-layer
  costs, which makes small-batch times optimistic); update times are kept (an update does
  not depend on the batch size).
"""

from __future__ import annotations

import dataclasses
import json
import types
from collections.abc import Mapping
from typing import Any

import numpy as np

from hetpipe_tf._args import check_int
from hetpipe_tf.cluster.catalog import DeviceKind, DeviceType

DEFAULT_EFFICIENCY: Mapping[DeviceKind, float] = types.MappingProxyType(
    {DeviceKind.GPU: 0.5, DeviceKind.CPU: 0.3}
)
TIME_SOURCES = ("measured", "estimated", "calibrated")


@dataclasses.dataclass(frozen=True)
class LayerCost:
    """Cost of one layer for one minibatch; times are forward+backward seconds by type;
    `update_s` the seconds of its weights' per-minibatch update by type (empty: none
    costed, i.e. 0)."""

    name: str
    time_s: Mapping[str, float]
    flops: int
    bytes_accessed: int
    param_bytes: int
    trainable_param_bytes: int
    activation_bytes: int
    update_s: Mapping[str, float] = dataclasses.field(default_factory=dict)
    tied_bytes: int = 0   # a tied layer's later call: its borrowed copy (LayerNode.tied_bytes)

    def __post_init__(self) -> None:
        object.__setattr__(self, "time_s", types.MappingProxyType(dict(self.time_s)))
        object.__setattr__(self, "update_s", types.MappingProxyType(dict(self.update_s)))
        bad_update = {k: v for k, v in self.update_s.items() if not (v >= 0 and np.isfinite(v))}
        if bad_update:
            raise ValueError(f"LayerCost {self.name}: update times must be finite and >= 0. "
                             f"Received: update_s={bad_update}.")
        for field in ("flops", "bytes_accessed", "param_bytes", "trainable_param_bytes",
                      "activation_bytes"):
            value = getattr(self, field)
            if value < 0:
                raise ValueError(f"LayerCost {self.name}: {field} must be >= 0. Received: {field}={value}.")
        bad = {k: v for k, v in self.time_s.items() if not (v >= 0 and np.isfinite(v))}
        if bad:
            raise ValueError(f"LayerCost {self.name}: times must be finite and >= 0. Received: time_s={bad}.")

    def to_dict(self) -> dict[str, Any]:
        return {f.name: getattr(self, f.name) for f in dataclasses.fields(self)} | {
            "time_s": dict(self.time_s), "update_s": dict(self.update_s)}

    @classmethod
    def from_dict(cls, d: Mapping[str, Any]) -> LayerCost:
        return cls(**_checked_keys(cls, d))


@dataclasses.dataclass(frozen=True)
class ModelProfile:
    """Per-layer costs of a model at one batch size, on several device types."""

    model_name: str
    batch_size: int
    layers: tuple[LayerCost, ...]
    cut_bytes: tuple[int, ...]
    time_source: Mapping[str, str]
    # The optimizer whose update `LayerCost.update_s` times ("" = no update costed).
    update_optimizer: str = ""
    # Cuts no plan may use: between two calls of a shared layer (`LayerGraph.forbidden_cuts`).
    forbidden_cuts: tuple[int, ...] = ()

    def __post_init__(self) -> None:
        object.__setattr__(self, "layers", tuple(self.layers))
        object.__setattr__(self, "forbidden_cuts", tuple(sorted(int(c) for c in
                                                                self.forbidden_cuts)))
        if any(not 0 <= c < len(self.layers) - 1 for c in self.forbidden_cuts):
            raise ValueError(
                "forbidden_cuts must index cuts (0 <= cut < layers - 1). Received: "
                f"forbidden_cuts={list(self.forbidden_cuts)[:8]}, {len(self.layers)} layers.")
        object.__setattr__(self, "cut_bytes", tuple(int(b) for b in self.cut_bytes))
        object.__setattr__(self, "time_source", types.MappingProxyType(dict(self.time_source)))
        check_int("batch_size", self.batch_size, minimum=1)
        if len(self.cut_bytes) != max(len(self.layers) - 1, 0):
            raise ValueError(
                "cut_bytes needs one entry per cut (layers - 1). Received: "
                f"len(cut_bytes)={len(self.cut_bytes)}, len(layers)={len(self.layers)}.")
        bad = {k: v for k, v in self.time_source.items() if v not in TIME_SOURCES}
        if bad:
            raise ValueError(f"Unknown time sources. Received: {bad}; use one of {TIME_SOURCES}.")
        for layer in self.layers:
            if set(layer.time_s) != set(self.time_source):
                raise ValueError(
                    f"Layer {layer.name} has times for other device types than the profile. "
                    f"Received: {sorted(layer.time_s)} vs time_source {sorted(self.time_source)}.")
            if layer.update_s and set(layer.update_s) != set(self.time_source):
                raise ValueError(
                    f"Layer {layer.name} has update times for other device types than the "
                    f"profile. Received: {sorted(layer.update_s)} vs time_source "
                    f"{sorted(self.time_source)}; give every type or none.")

    @property
    def device_types(self) -> tuple[str, ...]:
        return tuple(self.time_source)

    def scaled(self, batch_size: int) -> ModelProfile:
        """The profile at another batch size, rescaled linearly (see module docstring)."""
        check_int("batch_size", batch_size, minimum=1)
        k = batch_size / self.batch_size
        layers = tuple(
            dataclasses.replace(
                c,
                time_s={t: s * k for t, s in c.time_s.items()},
                flops=round(c.flops * k),
                bytes_accessed=3 * c.param_bytes + round((c.bytes_accessed - 3 * c.param_bytes) * k),
                activation_bytes=round(c.activation_bytes * k),
            )
            for c in self.layers
        )
        return dataclasses.replace(self, batch_size=batch_size, layers=layers,
                                   cut_bytes=tuple(round(b * k) for b in self.cut_bytes))

    def to_dict(self) -> dict[str, Any]:
        return {
            "model_name": self.model_name,
            "batch_size": self.batch_size,
            "layers": [c.to_dict() for c in self.layers],
            "cut_bytes": list(self.cut_bytes),
            "time_source": dict(self.time_source),
            "update_optimizer": self.update_optimizer,
            "forbidden_cuts": list(self.forbidden_cuts),
        }

    @classmethod
    def from_dict(cls, d: Mapping[str, Any]) -> ModelProfile:
        kwargs = _checked_keys(cls, d)
        kwargs["layers"] = tuple(LayerCost.from_dict(c) for c in kwargs["layers"])
        return cls(**kwargs)

    def to_json(self, **kwargs: Any) -> str:
        return json.dumps(self.to_dict(), **kwargs)

    @classmethod
    def from_json(cls, text: str) -> ModelProfile:
        return cls.from_dict(json.loads(text))


def _checked_keys(cls: type, d: Mapping[str, Any]) -> dict[str, Any]:
    fields = {f.name for f in dataclasses.fields(cls)}
    # Fields with a default may be absent (profiles saved before they existed).
    required = {f.name for f in dataclasses.fields(cls)
                if f.default is dataclasses.MISSING and f.default_factory is dataclasses.MISSING}
    if not required <= set(d) <= fields:
        raise ValueError(
            f"{cls.__name__} dict has wrong keys. Received: keys={sorted(d)}; "
            f"expected {sorted(required)}, optionally {sorted(fields - required)}.")
    return dict(d)


def estimate_time(flops: float, bytes_accessed: float, device_type: DeviceType,
                  efficiency: Mapping[DeviceKind, float] = DEFAULT_EFFICIENCY) -> float:
    """Roofline estimate of one layer task's seconds on `device_type`."""
    roofline = max(flops / device_type.peak_flops, bytes_accessed / device_type.memory_bandwidth)
    return roofline / efficiency[device_type.kind] + device_type.launch_overhead_s


def optimizer_name(optimizer: Any) -> str:
    """The name a profile records for the optimizer whose update it times."""
    return optimizer.lower() if isinstance(optimizer, str) else type(optimizer).__name__.lower()


def update_bytes(trainable_bytes: int, versioned_bytes: int, slots: int) -> int:
    """Bytes one update moves (module docstring): trainable x (5 + 2 slots) + versioned x 5."""
    return trainable_bytes * (5 + 2 * slots) + versioned_bytes * 5

