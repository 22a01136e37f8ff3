"""From a Keras model and a cluster to a Plan: profile, find Max_m and N_m, solve the MILP.

Which device types are measured: a type is timed on a device of the cluster that is present
in this process (a local TensorFlow device string such as "/device:CPU:1") and whose kind
matches the type's kind (a CPU type on a CPU device). A GPU type emulated on a logical CPU
device is never "measured" there: its times come from the catalog (estimated, or calibrated
by a measured GPU of another type). Default N_m is min(Max_m, k): with the last stage doing
forward and backward as one task, k minibatches in flight keep every stage of a k-stage
pipeline busy, and more only adds staleness and memory (docs/partitioner.md).
"""

from __future__ import annotations

import dataclasses
from typing import Any, Sequence

from hetpipe_tf._args import check_int
from hetpipe_tf.cluster.catalog import get_device_type
from hetpipe_tf.cluster.spec import Cluster, Device, tf_device_kind
from hetpipe_tf.partitioner import milp
from hetpipe_tf.partitioner.comm import CommModel
from hetpipe_tf.partitioner.cost import PredictionMemory, SyncMemory, optimizer_slots
from hetpipe_tf.partitioner.layer_graph import LayerGraph
from hetpipe_tf.partitioner.plan import PartitionError, Plan
from hetpipe_tf.partitioner.profile import ModelProfile
from hetpipe_tf.partitioner.profiling import profile_model


@dataclasses.dataclass(frozen=True)
class PlannerResult:
    """A plan with what it was made from: the profile and the virtual worker's Max_m."""

    plan: Plan
    profile: ModelProfile
    max_m: int


def measurable_devices(devices: Sequence[Device]) -> dict[str, str]:
    """Device type name -> local TF device string to time that type on (see module doc)."""
    import tensorflow as tf
    local = {d.name for d in tf.config.list_logical_devices()}
    found: dict[str, str] = {}
    for d in devices:
        kind = tf_device_kind(d.tf_device)
        if "/job:" in d.tf_device or kind is None:
            continue
        if kind != get_device_type(d.type_name).kind.value:
            continue
        full = f"/job:localhost/replica:0/task:0/device:{d.tf_device.split('device:')[-1]}"
        if full in local or d.tf_device in local:
            found.setdefault(d.type_name, d.tf_device)
    return found


def _check_count(name: str, value: Any, fix: str) -> None:
    # bool is an int in Python, and "2" from a flag or a config would fail later as a
    # TypeError deep in the MILP: refuse both here, by name.
    check_int(name, value, minimum=1, error=PartitionError, hint=f"pass {fix}")


def plan_model(model: Any, cluster: Cluster, batch_size: int, *,
               devices: Sequence[Device | str] | None = None, n_m: int | None = None,
               optimizer: Any = "sgd", measure: bool = True, max_n_m: int = 32,
               comm: CommModel | None = None, profile: ModelProfile | None = None,
               options: milp.SolverOptions = milp.SolverOptions(),
               sync: SyncMemory | None = None,
               prediction: PredictionMemory | None = None) -> PlannerResult:
    """Profile `model` at `batch_size` and partition it over `devices` (default: all).

    Args:
      n_m: minibatches in flight; None = min(Max_m, number of devices).
      max_n_m: the largest N_m the search for Max_m considers.
      optimizer: the optimizer (or its name, or slots per weight) for the memory model.
      measure: time device types present in this process (module doc); else estimate all.
      profile: reuse a profile made earlier (same model and batch size).
      sync: plan for a synchronous schedule's memory (cost.py; N_m = 1, so `n_m` must be
        None or 1).
      prediction: the staleness compensation's extra weight copies (cost.py; None: none),
        charged in Max_m and the plan at N_m > 1.
    """
    _check_count("batch_size", batch_size, "the minibatch size, e.g. batch_size=32")
    if n_m is not None:
        _check_count("n_m", n_m, "n_m=None for min(Max_m, devices) or e.g. n_m=2")
    _check_count("max_n_m", max_n_m, "e.g. max_n_m=32")
    # numpy integers are accepted; the plan keeps Python ints (JSON-serialisable).
    batch_size, max_n_m = int(batch_size), int(max_n_m)
    n_m = None if n_m is None else int(n_m)
    chosen = [cluster.device(d) for d in (devices if devices is not None else cluster.devices)]
    if not chosen:
        raise PartitionError("The cluster has no compute devices to plan on. Received: "
                             f"devices={list(devices) if devices is not None else []}; "
                             "declare devices for the worker tasks.")
    slots = optimizer_slots(optimizer)
    graph = LayerGraph.from_model(model) if model is not None else None
    if profile is None:
        types = sorted({d.type_name for d in chosen})
        # An int says only the slot count: cost the update of the model's own optimizer.
        update = getattr(model, "optimizer", None) if isinstance(optimizer, int) else optimizer
        profile = profile_model(graph, batch_size, types,
                                measure_on=measurable_devices(chosen) if measure else {},
                                optimizer=update)
    elif profile.batch_size != batch_size:
        profile = profile.scaled(batch_size)
    notes = graph.notes if graph is not None else ()
    if sync is not None:
        if n_m not in (None, 1):
            raise PartitionError(
                "A synchronous schedule applies each minibatch before the next (N_m = 1). "
                f"Received: n_m={n_m} with sync={sync}; pass n_m=None or 1.")
        plan = milp.solve(profile, chosen, 1, cluster=cluster, comm=comm,
                          optimizer_slots=slots, options=options, sync=sync)
        return PlannerResult(plan=dataclasses.replace(plan, notes=notes), profile=profile,
                             max_m=1)
    max_m = milp.max_minibatches(profile, chosen, cluster=cluster, optimizer_slots=slots,
                                 limit=max(max_n_m, n_m or 1), options=options,
                                 prediction=prediction)
    if n_m is None:
        n_m = max(1, min(max_m, len(chosen)))
    elif n_m > max_m >= 1:
        raise PartitionError(
            f"N_m exceeds what the devices' memory allows (Max_m={max_m}). Received: "
            f"n_m={n_m}; use n_m <= {max_m}, a smaller batch, or more devices.")
    plan = milp.solve(profile, chosen, n_m, cluster=cluster, comm=comm, optimizer_slots=slots,
                      options=options, prediction=prediction)
    return PlannerResult(plan=dataclasses.replace(plan, notes=notes), profile=profile,
                         max_m=max_m)
