"""Profile a Keras model with TensorFlow: a `ModelProfile` (profile.py) for every device type.

- Measured types (a device of that type is present, `measure_on`): layer times by
  layer_timing.py at `measure_batch_size`, scaled linearly to the batch size; update
  times by update_timing.py.
- Estimated types (no device at hand): the roofline of profile.py (`estimate_time`,
  `update_bytes`).
- "calibrated": when some type of the same DeviceKind was measured (GPU -> GPU, CPU ->
  CPU), an estimated type's times are multiplied per layer class (Keras class name) by
  sum(measured) / sum(estimated) over the layers of that class on the measured types of
  that kind. Layer classes differ much more in how close they come to the roofline than
  device types of one kind do, so the class is the unit of calibration. Update times are
  calibrated with one ratio per kind (pooled over all layers: an update is elementwise
  whatever the layer class).

Profiling leaves the model and its optimizer as it found them: every variable of every
layer (`layer.variables`, seed generators' states included) and every variable of a Keras
optimizer (its iterations and slots) is restored when `profile_model` returns or raises,
so a model planned at its first fit trains exactly as the same model unplanned.
"""

from __future__ import annotations

import types
from collections.abc import Mapping, Sequence
from typing import Any

import keras
import tensorflow as tf

from hetpipe_tf._args import check_int
from hetpipe_tf.cluster.catalog import DeviceKind, DeviceType, canonical_type_name, get_device_type
from hetpipe_tf.partitioner.cost import optimizer_slots
from hetpipe_tf.partitioner.layer_graph import LayerGraph
from hetpipe_tf.partitioner.layer_timing import (
    forward_flops,
    graph_variables,
    measure_layer_times,
    preserved,
)
from hetpipe_tf.partitioner.profile import (
    DEFAULT_EFFICIENCY,
    LayerCost,
    ModelProfile,
    estimate_time,
    optimizer_name,
    update_bytes,
)
from hetpipe_tf.partitioner.update_timing import (
    fresh_optimizer,
    measure_update_times,
    update_variables,
    weight_bytes,
)


def profile_model(
    model: keras.Model | LayerGraph,
    batch_size: int,
    device_types: Sequence[str | DeviceType],
    *,
    measure_on: Mapping[str, str] = types.MappingProxyType({}),
    measure_batch_size: int | None = None,
    repeats: int = 3,
    efficiency: Mapping[DeviceKind, float] = DEFAULT_EFFICIENCY,
    optimizer: Any = None,
) -> ModelProfile:
    """Profile `model` at `batch_size` for every device type in `device_types`.

    `measure_on` maps a device type name to the TensorFlow device string of a present
    device of that type ("/CPU:0", "/job:worker/task:1/device:GPU:0"); those types are
    measured, the others estimated or calibrated (module docstring).
    `optimizer`: the optimizer (name or Keras instance) whose per-minibatch update is
    costed per layer; None = the model's compiled optimizer if it has one, else no update
    cost (`update_s` empty).
    """
    _check_positive_int("batch_size", batch_size)
    _check_positive_int("repeats", repeats)
    if measure_batch_size is None:
        measure_batch_size = batch_size
    _check_positive_int("measure_batch_size", measure_batch_size)
    resolved = _resolve_types(device_types)
    measure = _resolve_measure_on(measure_on, resolved)
    graph = model if isinstance(model, LayerGraph) else LayerGraph.from_model(model)
    if optimizer is None and not isinstance(model, LayerGraph):
        optimizer = getattr(model, "optimizer", None)
    state = graph_variables(graph)
    if isinstance(optimizer, keras.optimizers.Optimizer):
        state += list(optimizer.variables)
    with preserved(state):
        return _profile(graph, batch_size, resolved, measure, measure_batch_size, repeats,
                        efficiency, optimizer)


def _profile(graph: LayerGraph, batch_size: int, resolved: Mapping[str, DeviceType],
             measure: Mapping[str, str], measure_batch_size: int, repeats: int,
             efficiency: Mapping[DeviceKind, float], optimizer: Any) -> ModelProfile:
    has_weights = [bool(getattr(graph.layer_of(i), "trainable_weights", ())) for i in range(len(graph))]
    fwd = forward_flops(graph, batch_size)
    flops = [f * (3 if w else 2) for f, w in zip(fwd, has_weights)]
    nbytes = [3 * (batch_size * (sum(graph.tensor_bytes_per_sample(r) for r in n.inputs)
                                 + n.output_bytes_per_sample) + n.param_bytes)
              for n in graph.nodes]
    estimated = {name: [estimate_time(f, b, t, efficiency) for f, b in zip(flops, nbytes)]
                 for name, t in resolved.items()}
    times: dict[str, list[float]] = {}
    for name, device in measure.items():
        scale = batch_size / measure_batch_size
        times[name] = [s * scale for s in measure_layer_times(graph, measure_batch_size, device, repeats)]

    classes = [n.class_name for n in graph.nodes]
    source = {}
    for name, device_type in resolved.items():
        if name in measure:
            source[name] = "measured"
            continue
        peers = [m for m in measure if resolved[m].kind is device_type.kind]
        if not peers:
            source[name] = "estimated"
            times[name] = estimated[name]
            continue
        ratio = _class_ratios(classes, [times[m] for m in peers], [estimated[m] for m in peers])
        source[name] = "calibrated"
        times[name] = [e * ratio[c] for e, c in zip(estimated[name], classes)]

    updates = (_update_times(graph, optimizer, resolved, measure, source, repeats, efficiency)
               if optimizer is not None else None)
    layers = tuple(
        LayerCost(
            name=node.name,
            time_s={name: times[name][i] for name in resolved},
            update_s={name: updates[name][i] for name in resolved} if updates else {},
            flops=int(flops[i]),
            bytes_accessed=int(nbytes[i]),
            param_bytes=node.param_bytes,
            trainable_param_bytes=node.trainable_param_bytes,
            activation_bytes=node.output_bytes_per_sample * batch_size,
            tied_bytes=node.tied_bytes,
        )
        for i, node in enumerate(graph.nodes)
    )
    return ModelProfile(
        model_name=graph.model_name,
        batch_size=batch_size,
        layers=layers,
        cut_bytes=tuple(b * batch_size for b in graph.all_cut_bytes_per_sample()),
        time_source=source,
        update_optimizer=optimizer_name(optimizer) if optimizer is not None else "",
        forbidden_cuts=tuple(sorted(graph.forbidden_cuts())),
    )


def _update_times(graph: LayerGraph, optimizer: Any, resolved: Mapping[str, DeviceType],
                  measure: Mapping[str, str], source: Mapping[str, str], repeats: int,
                  efficiency: Mapping[DeviceKind, float]) -> dict[str, list[float]]:
    """Per type, per node: update seconds, by the same source as the type's times."""
    fresh_optimizer(optimizer)   # refuse what is not an optimizer before any work
    slots = optimizer_slots(optimizer)
    nbytes = []
    for i in range(len(graph)):
        trainable, versioned = update_variables(graph, i)
        nbytes.append(update_bytes(sum(weight_bytes(w) for w in trainable),
                                   sum(weight_bytes(w) for w in versioned), slots))

    def estimate(t: DeviceType) -> list[float]:
        return [0.0 if b == 0 else
                b / t.memory_bandwidth / efficiency[t.kind] + t.launch_overhead_s
                for b in nbytes]

    out = {name: list(measure_update_times(graph, optimizer, device, repeats))
           for name, device in measure.items()}
    for name, t in resolved.items():
        if name in out:
            continue
        est = estimate(t)
        peers = [m for m in measure if resolved[m].kind is t.kind]
        if source[name] == "calibrated" and peers:
            meas = sum(sum(out[m]) for m in peers)
            base = sum(sum(estimate(resolved[m])) for m in peers)
            est = [e * (meas / base if base > 0 else 1.0) for e in est]
        out[name] = est
    return out


def _class_ratios(classes: Sequence[str], measured: Sequence[Sequence[float]],
                  estimated: Sequence[Sequence[float]]) -> dict[str, float]:
    """measured / estimated per layer class, pooled over the measured types."""
    sums: dict[str, list[float]] = {c: [0.0, 0.0] for c in classes}
    for meas, est in zip(measured, estimated):
        for c, m, e in zip(classes, meas, est):
            sums[c][0] += m
            sums[c][1] += e
    return {c: (m / e if e > 0 else 1.0) for c, (m, e) in sums.items()}


def _check_positive_int(name: str, value: Any) -> None:
    check_int(name, value, minimum=1, hint="pass a positive int")


def _resolve_types(device_types: Sequence[str | DeviceType]) -> dict[str, DeviceType]:
    if isinstance(device_types, (str, DeviceType)) or not device_types:
        raise ValueError(
            "device_types must be a non-empty sequence of names or DeviceTypes. "
            f"Received: device_types={device_types!r}; pass e.g. ['TITAN_V', 'LOCAL_CPU'].")
    resolved: dict[str, DeviceType] = {}
    for item in device_types:
        device_type = item if isinstance(item, DeviceType) else get_device_type(item)
        resolved.setdefault(device_type.name, device_type)
    return resolved


def _resolve_measure_on(measure_on: Mapping[str, str],
                        resolved: Mapping[str, DeviceType]) -> dict[str, str]:
    measure = {}
    local = {_local_key(d.name) for d in tf.config.list_logical_devices()}
    for name, device in measure_on.items():
        key = canonical_type_name(name)
        if key not in resolved:
            raise ValueError(
                "measure_on names a device type that is not profiled. Received: "
                f"measure_on[{name!r}]={device!r}, device_types={sorted(resolved)}; "
                "add the type to device_types or drop it from measure_on.")
        # Remote devices (with a job) are checked by TensorFlow when used.
        if tf.DeviceSpec.from_string(device).job is None and _local_key(device) not in local:
            raise ValueError(
                f"measure_on names a device that is not present. Received: measure_on[{name!r}]="
                f"{device!r}; use one of {sorted(local)}.")
        measure[key] = device
    return measure


def _local_key(device: str) -> str:
    spec = tf.DeviceSpec.from_string(device)
    return f"/{(spec.device_type or '').upper()}:{spec.device_index or 0}"
