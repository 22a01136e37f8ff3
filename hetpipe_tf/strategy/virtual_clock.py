"""The virtual clock as a training mode: several VWs trained in a cluster model's order.

`HetPipeStrategy(plan=plans, clock=VirtualClock(cluster))` (the clock from
`hetpipe_tf.sim`, passed in: the strategy never imports the simulator) trains the model on
the devices at hand, with every stage task, push and pull in the order and at the virtual
time the cluster model gives for `cluster` and the plans (docs/virtual_clock.md). Each plan
stage's `device` names the described cluster's device (its times, host and links); its
`tf_device` is the local device that runs it (`local_plans` makes them).

The parts are those of `build_virtual_workers` (the same w_global, w_local copies, stage
optimizers, weight versions, compensation), driven without threads: `OrderedRuntime` per
VW, `TimedWaveSync`, `VirtualCoordinator`. Keras sees the virtual time as the metric
`virtual_time_s` (`VirtualTime`): in every batch's and epoch's logs and in History, so
callbacks (EarlyStopping, a target) can stop on it.

Refused before training (a ValueError naming the option): one VW, GPipe/1F1B, HetSeq and
split batches, cluster jobs (stages on remote tasks).
"""

from __future__ import annotations

import dataclasses
import math
from typing import Sequence

import keras
import tensorflow as tf

from hetpipe_tf import _shim as _keras_shim
from hetpipe_tf._shim import keras_metrics
from hetpipe_tf.cluster.local import host_cpu_device
from hetpipe_tf.cluster.roles import connected_to_cluster
from hetpipe_tf.partitioner.plan import Plan
from hetpipe_tf.pipeline.ordered_runtime import OrderedRuntime
from hetpipe_tf.pipeline.stage import Stage
from hetpipe_tf.ps.server import ParameterServers
from hetpipe_tf.ps.timed_sync import TimedWaveSync
from hetpipe_tf.ps.virtual_coordinator import VirtualCoordinator
from hetpipe_tf.strategy import training_state
from hetpipe_tf.strategy.virtual_workers import vw_weights

METRIC_NAME = "virtual_time_s"


class VirtualTime(keras.metrics.Metric):
    """The virtual seconds of training so far (set by the virtual clock, never reset by
    Keras: it is a clock, not an average)."""

    def __init__(self, name: str = METRIC_NAME, **kwargs):
        super().__init__(name=name, **kwargs)
        self.seconds = self.add_variable(shape=(), initializer="zeros", dtype="float64",
                                         name="seconds")

    def update_state(self, *args, **kwargs) -> None:
        pass

    def result(self):
        return tf.identity(self.seconds)

    def reset_state(self) -> None:
        pass


def check_options(options, plans: Sequence[Plan]) -> None:
    """Refuse what the virtual clock does not train (module docstring)."""
    clock = options.clock.model
    what = None
    if len(plans) < 2:
        what = (f"{len(plans)} virtual worker", "pass one plan per VW, at least two")
    elif options.schedule.synchronous:
        what = (f"schedule={options.schedule.schedule.value!r}", "use schedule='hetpipe'")
    elif options.hetseq or options.splits_batches:
        what = (f"data_parallel={options.data_parallel.mode.value!r}",
                "use data_parallel='wsp'")
    elif connected_to_cluster():
        what = ("a cluster job (stages on remote tasks)", "train on this process's devices")
    if what is not None:
        raise ValueError(
            "The virtual clock trains several virtual workers under WSP with HetPipe's "
            f"schedule on local devices (docs/virtual_clock.md). Received: {what[0]} with "
            f"clock={clock!r}; {what[1]}, or drop clock=.")


def local_plans(plans: Sequence[Plan], devices: Sequence[str] | None = None) -> list[Plan]:
    """`plans` with every stage run on a local device: stage j on devices[j % len(devices)]
    (default: this process's logical CPUs), emulated speed 1 (the clock, not a sleep, says
    how slow a device is). The stages' `device` (the described cluster's) is kept."""
    if devices is None:
        devices = [d.name for d in tf.config.list_logical_devices("CPU")]
    if not devices:
        raise ValueError("local_plans needs at least one device. Received: devices=[]; pass "
                         "local TensorFlow device names.")
    out = []
    for p in plans:
        stages = tuple(dataclasses.replace(s, tf_device=devices[j % len(devices)],
                                           emulated_speed_factor=1.0)
                       for j, s in enumerate(p.stages))
        out.append(dataclasses.replace(p, stages=stages))
    return out


def _param_bytes(stages: Sequence[Stage]) -> list[int]:
    # Keras variables name their dtype by a string.
    return [int(sum(tf.as_dtype(v.dtype).size * math.prod(v.shape) for v in s.trainable))
            for s in stages]


def build_virtual_clock(options, job) -> VirtualCoordinator:
    """The virtual-clock executor of `job` (a `modes.Job`) under `options`."""
    model, program, plans, n_m = job.model, job.program, job.layout.plans, job.layout.n_m
    check_options(options, plans)
    d = job.layout.clock_distance
    runs = [dataclasses.replace(p, stages=tuple(
        dataclasses.replace(s, emulated_speed_factor=1.0) for s in p.stages)) for p in plans]
    per_vw = [Stage.for_plan(p, program, model) for p in runs]
    variables = list({id(v): v for s in per_vw[0]
                      for v in [*s.trainable, *s.versioned_nt]}.values())
    with tf.init_scope():
        initial = [tf.identity(_keras_shim.variable_handle(v)) for v in variables]
        with job.place_locally():
            servers = ParameterServers(initial, [host_cpu_device()] * len(variables),
                                       len(plans), names=[getattr(v, "path", v.name)
                                                          for v in variables])
            metric = VirtualTime()
        states = training_state.OptimizerStates(model, job.strategy, len(plans),
                                                adjust=job.adjust)
        runtimes, syncs = [], []
        for w, stages in enumerate(per_vw):
            # The stages' emulated speed is 1 (`runs`): the clock gives the times.
            flat, weights = vw_weights(w, stages, variables, initial, states, model, n_m,
                                       job.predictor, job.place_locally)
            syncs.append(TimedWaveSync(w, servers, flat, n_m, d, weights=weights))
            runtimes.append((stages, weights, runs[w]))
    _attach(model, metric)
    param_bytes = [_param_bytes(s) for s in per_vw]
    clock = options.clock.model

    def schedule(num_waves: int):
        return clock.schedule(plans, n_m, d, param_bytes, num_waves)

    def on_time(t: float) -> None:
        metric.seconds.assign(t)

    coordinator = VirtualCoordinator(
        [], syncs, servers, variables, schedule, first_waves=d + 8, n_m=n_m,
        on_time=on_time, on_run_start=states.seed, on_run_end=states.merge)
    lock = _NoLock()   # several VWs: the metrics update is a call of its own, as threaded
    coordinator.attach([
        OrderedRuntime(stages, weights, n_m, job.update_metrics, plan=plan,
                       metrics_lock=lock, vw=w, on_commit=coordinator.committer(w))
        for w, (stages, weights, plan) in enumerate(runtimes)])
    return coordinator


class _NoLock:
    """The metrics lock of VWs that never run at once."""

    def __enter__(self):
        return self

    def __exit__(self, *exc) -> None:
        return None


def _attach(model, metric: VirtualTime) -> None:
    """Make `metric` one of the model's metrics (its result in every log), once per model:
    a rebuild (re-compile) keeps the first one's clock."""
    old = model.__dict__.get("_hetpipe_virtual_time")
    if old is not None:
        metric.seconds.assign(old.seconds)
        keras_metrics.replace_tracked_metric(model, old, metric)
    else:
        keras_metrics.track_metric(model, metric)
    object.__setattr__(model, "_hetpipe_virtual_time", metric)
