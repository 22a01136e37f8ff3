"""Several virtual workers for one Keras model: their stages, w_local, optimizers, syncs.

`build_virtual_workers` turns plans (one per VW, the same N_m) into a
`hetpipe_tf.ps.coordinator.Coordinator`:

- w_global: one parameter-server variable per versioned model variable (trainable and
  float non-trainable), on the device of the PS that the placement gives its layer
  (`hetpipe_tf.ps.placement`: default round-robin or ED-local);
- per VW: its stages (compiled for its devices), w_local = copies of the variables on the
  device of the stage that uses them, OWN optimizers (one per stage, clones of the model's
  built here in the strategy's scope: each VW's optimizer state, e.g. momentum or Adam's
  moments, is local, as each worker's is under parameter-server training; the servers only
  add the pushed updates; docs/state.md), a `WaveSync`, and a pipeline runtime whose stages
  apply their own updates and whose updater thread runs the WSP hook.

The model's variables are not trained directly: the coordinator copies w_global into them
at the end of every run, so Keras (metrics, callbacks, checkpoints, evaluate) sees the
global weights, and the VWs' optimizer states are merged into the model's optimizer
(`training_state.merge`); a run starts from the model's optimizer (`training_state.seed`).
"""

from __future__ import annotations

import types
from typing import Any, Callable, Sequence

import tensorflow as tf

from hetpipe_tf import _shim as _keras_shim
from hetpipe_tf.cluster.local import host_cpu_device
from hetpipe_tf.partitioner.plan import Plan
from hetpipe_tf.partitioner.shares import Shares
from hetpipe_tf.ps.coordinator import Coordinator, DroppableLock
from hetpipe_tf.ps.split import SplitCoordinator
from hetpipe_tf.ps.faults import FaultOptions, fault_guard
from hetpipe_tf.ps.placement import PlacementPolicy, place_parameters, ps_device
from hetpipe_tf.ps.server import ParameterServers
from hetpipe_tf.ps.wave_sync import WaveSync
from hetpipe_tf.pipeline.runtime import PipelineRuntime
from hetpipe_tf.pipeline.stage import Stage
from hetpipe_tf.pipeline.weights import StageWeights, WeightVersions
from hetpipe_tf.strategy import training_state

def _layer_of_variables(program) -> dict[int, int]:
    """id(variable) -> node index of the layer that owns it."""
    out = {}
    for i in range(len(program.graph.nodes)):
        trainable, other = program.stage_variables(i, i)
        for v in trainable + other:
            out.setdefault(id(v), i)
    return out


def variable_ps_devices(program, plans: Sequence[Plan], variables: Sequence, cluster,
                        policy: PlacementPolicy | str, ps_hosts: Sequence[str] | None
                        ) -> list[str]:
    """The PS device of every variable, by the placement of its layer."""
    policy = PlacementPolicy.parse(policy)
    if cluster is None:
        if policy is not PlacementPolicy.DEFAULT:
            raise ValueError(
                "ED-local placement needs the cluster (which node runs which stage). "
                f"Received: placement={policy.value!r} and no cluster; pass the cluster to "
                "HetPipeStrategy or use placement='default'.")
        return [host_cpu_device()] * len(variables)
    # place_parameters reads only each layer's name and trainable bytes of a profile.
    layers = [types.SimpleNamespace(name=n.name, trainable_param_bytes=n.trainable_param_bytes)
              for n in program.graph.nodes]
    placement = place_parameters(types.SimpleNamespace(layers=layers), plans, cluster,
                                 ps_hosts, policy)
    owner = _layer_of_variables(program)
    first_ps = placement.ps_hosts[0]
    return [ps_device(cluster, placement.layer_hosts.get(owner.get(id(v), -1), first_ps))
            for v in variables]


def build_virtual_workers(model, program, plans: Sequence[Plan], n_m: int,
                          clock_distance: int, update_metrics: Callable, *, cluster=None,
                          placement: PlacementPolicy | str = PlacementPolicy.DEFAULT,
                          ps_hosts: Sequence[str] | None = None,
                          place_locally: Callable[[], Any], fresh_pulls: bool = True,
                          make_runtime: Callable[..., Any] | None = None,
                          split: Shares | None = None,
                          strategy=None, adjust=None,
                          predictor: Callable[[str], Any] = lambda device: None,
                          faults: FaultOptions | None = None,
                          vw_metrics=None) -> Coordinator:
    """The coordinator of len(plans) virtual workers training `model` under WSP.

    `place_locally()` returns a context in which the strategy's variable creator keeps the
    caller's device scope (so w_global lands on the parameter servers' devices and w_local
    on the stage devices). `adjust` and `predictor` are staleness compensation's
    (strategy/compensation.py). `split`: every batch is cut into these shares, one per VW,
    each share's gradient weighted by n_k / N (ps/split.py), instead of whole batches going
    to whichever VW is free. `vw_metrics`: the metric state per VW (strategy/vw_metrics.py)
    the VWs' pipelines enroll in, or None (the model's metrics under a shared lock).
    """
    per_vw_stages = [Stage.for_plan(p, program, model) for p in plans]
    # Each variable once, in stage order (a dict keeps the first insertion's position).
    variables = list({id(v): v for s in per_vw_stages[0]
                      for v in [*s.trainable, *s.versioned_nt]}.values())
    devices = variable_ps_devices(program, plans, variables, cluster, placement, ps_hosts)
    with tf.init_scope():
        initial = [tf.identity(_keras_shim.variable_handle(v)) for v in variables]
        with place_locally():  # w_global on its parameter servers' devices
            servers = ParameterServers(initial, devices, len(plans),
                                       names=[v.path if hasattr(v, "path") else v.name
                                              for v in variables])
        # Droppable: a dropped VW's thread stuck holding it is let go of (ps/coordinator.py).
        metrics_lock = DroppableLock()
        runtimes, syncs = [], []
        states = training_state.OptimizerStates(model, strategy, len(plans), adjust=adjust)
        for w, stages in enumerate(per_vw_stages):
            local_flat, weights = vw_weights(w, stages, variables, initial, states, model,
                                             n_m, predictor, place_locally)
            sync = WaveSync(w, servers, local_flat, n_m, clock_distance,
                            fresh_pulls=fresh_pulls, weights=weights)
            # `make_runtime(stages, weights, plan, **kwargs)`: another schedule's executor
            # (strategy/schedules.py), driven by the same wave sync.
            make = make_runtime or (lambda st, wt, plan, **kw: PipelineRuntime(
                st, wt, n_m, update_metrics, plan=plan, vw_metrics=vw_metrics, **kw))
            rt = make(stages, weights, plans[w], after_apply=sync.after_apply,
                      update_thread=True, metrics_lock=metrics_lock, vw=w)
            runtimes.append(rt)
            syncs.append(sync)
    # Cluster jobs: lost tasks found within faults.timeout_s (hetpipe_tf/ps/faults.py).
    guard = fault_guard(faults, plans, devices, cluster)
    if split is not None:   # every batch cut into one share per VW (ps/split.py)
        return SplitCoordinator(runtimes, syncs, servers, variables, shares=split,
                                queue_size=(clock_distance + 1) * n_m,
                                on_run_start=states.seed, on_run_end=states.merge,
                                guard=guard, on_drop=states.drop)
    return Coordinator(runtimes, syncs, servers, variables, on_run_start=states.seed,
                       on_run_end=states.merge, guard=guard, on_drop=states.drop,
                       metrics_lock=metrics_lock)


def vw_weights(w: int, stages: Sequence[Stage], variables: Sequence, initial: Sequence,
               states: "training_state.OptimizerStates", model, n_m: int,
               predictor: Callable, place_locally: Callable) -> tuple[list, WeightVersions]:
    """VW `w`'s w_local: a copy of each of its stages' variables on the stage's device,
    from `initial` (w_global's first values, in `variables`' order), and the stages'
    weight versions with their optimizers. Returns (the copies in `variables`' order, the
    VW's WeightVersions)."""
    index = {id(v): k for k, v in enumerate(variables)}
    flat: list = [None] * len(variables)
    by_stage = []
    with place_locally():
        for s in stages:
            groups = []
            for group in (s.trainable, s.versioned_nt):
                copies = []
                for v in group:
                    with tf.device(s.device):
                        # No "/" in the name: optimizers name their slots after it, and
                        # Keras refuses "/" there (Adafactor).
                        c = tf.Variable(initial[index[id(v)]], trainable=False,
                                        name=f"vw{w}_{v.name.replace(':', '_')}")
                    _keras_shim.stand_in_for(c, v)
                    flat[index[id(v)]] = c
                    copies.append(c)
                groups.append(copies)
            by_stage.append(tuple(groups))
    optimizers = states.for_virtual_worker([t for t, _ in by_stage],
                                           [s.trainable for s in stages])
    weights = WeightVersions([
        StageWeights(s.device, t, n, o, n_m,
                     counter=model.optimizer.iterations if s.index == 0 else None,
                     emulated_speed_factor=s.emulated_speed_factor,
                     predictor=predictor(s.device))
        for s, (t, n), o in zip(stages, by_stage, optimizers)])
    return flat, weights
