"""From the strategy's cluster argument to a Plan, with the partitioner (Section 7).

Used when `HetPipeStrategy` gets no plan: at the first `fit` the model is profiled at the
dataset's batch size (device types present on this machine are measured on their device,
the others estimated from the catalog) and the MILP partitions it over the cluster's
devices, in pipeline order, with N_m minibatches in flight (default: min(Max_m, k)), by
`hetpipe_tf.partitioner.planner.plan_model`. What the user did not give is then chosen for
time to accuracy:
- with a cluster model (the strategy's `clock=VirtualClock(cluster)`, a described
  cluster), `plan_for_time_to_accuracy` picks N_m, D and the allocation jointly: every
  allocation of `PICK_ALLOCATIONS` the cluster admits (or the one given) x N_m in
  1..min(Max_m, k) (or the one given) x D in `PICK_DISTANCES` (or the one given), each
  candidate's seconds per minibatch from that model (`simulated_candidates`), its epochs
  from the epochs-to-target model of strategy/pick.py (docs/time_to_accuracy.md "The
  defaults"). The strategy never imports the simulator: the model comes in as a value;
- without one (this machine's time): N_m by the stage-time rule of strategy/defaults.py
  (the largest N_m only when filling the pipeline buys more time than its staleness costs
  in epochs), with no simulation per fit; D stays 0 and the allocation None (one VW of
  every device) when not given.
The memory model counts the staleness compensation's buffers (weight prediction's copies
of the weights, strategy/prediction_memory.py).
"""

from __future__ import annotations

import logging
import time
from typing import Any, Sequence

logger = logging.getLogger(__name__)

# The candidates of the pick under a cluster model when the user gives no D / allocation:
# the paper's clock distances (Section 8.3) and allocation policies (Section 8.1; ED-local
# is ED with a placement of the cluster model, which the user's VirtualClock carries).
PICK_DISTANCES = (0, 4, 32)
PICK_ALLOCATIONS = ("NP", "ED", "HD")


def resolve_cluster(cluster: Any):
    """A `hetpipe_tf.cluster.spec.Cluster` from a Cluster, dict, ClusterSpec/resolver or
    TF_CONFIG (cluster=None)."""
    import tensorflow as tf

    from hetpipe_tf.cluster.spec import Cluster
    from hetpipe_tf.cluster.tf_cluster import default_declarations

    if isinstance(cluster, Cluster):
        return cluster
    if cluster is None:
        return Cluster.from_tf_config()
    if isinstance(cluster, dict) and "hosts" in cluster:
        return Cluster.from_dict(cluster)
    if isinstance(cluster, (dict, tf.train.ClusterSpec,
                            tf.distribute.cluster_resolver.ClusterResolver)):
        # A TF cluster names tasks, not devices: each worker task gets LOCAL_CPU as with
        # TF_CONFIG; declare devices with Cluster.from_tf_cluster_spec for anything else.
        return Cluster.from_tf_cluster_spec(cluster, default_declarations(cluster))
    raise ValueError(
        "HetPipeStrategy cannot read the cluster's devices from this value. Received: "
        f"cluster={cluster!r}; pass a hetpipe_tf.cluster.spec.Cluster (e.g. Cluster.local or "
        "Cluster.from_tf_cluster_spec(spec, device_declarations)), its to_dict(), or set "
        "TF_CONFIG with a 'hetpipe' devices section.")


def plan_layout(options, model, batch_size: int) -> tuple:
    """(plans, picked) of `model` under `options` (`StrategyOptions`) when no plans were
    given: one device per VW in HetSeq mode with D > 0, else the partitioner's (with the
    allocation's VWs when one is given); `picked` (a `layout.Picked`) says what the pick
    under a cluster model chose, None without a pick."""
    from hetpipe_tf.strategy.data_parallel import DataParallel
    from hetpipe_tf.strategy.schedules import sync_memory

    layout, pipeline = options.layout, options.pipeline
    compensation = options.compensation.value
    if options.data_parallel.mode is DataParallel.HETSEQ:   # D > 0 (docs/hetseq.md)
        return one_device_plans(model, batch_size, layout.cluster), None
    if options.clock.virtual and not (layout.allocation_given and options.wsp.distance_given
                                      and pipeline.n_m is not None):
        made = plan_for_time_to_accuracy(options, model, batch_size)
        if made is not None:
            return made
    timed = dict(clock_distance=options.wsp.clock_distance, cluster_model=options.clock.model)
    if layout.allocation is None:
        return plan_with_partitioner(model, batch_size, layout.cluster, pipeline.n_m,
                                     pipeline.max_m, sync=sync_memory(options.schedule),
                                     compensation=compensation, **timed), None
    return plan_virtual_workers(model, batch_size, layout.cluster, layout.allocation,
                                layout.num_virtual_workers, pipeline.n_m, pipeline.max_m,
                                compensation=compensation, **timed), None


def one_device_plans(model, batch_size: int, cluster_arg) -> tuple:
    """HetSeq with D > 0: one virtual worker of one stage per device of the cluster, N_m = 1
    (each holds the whole model; its plan's time is the device's speed)."""
    cl = resolve_cluster(cluster_arg)
    return plan_devices(model, batch_size, cl, [(d,) for d in cl.devices], 1, None)


def max_stages(model) -> int:
    """How many stages `model` can be cut into: one per layer-graph node, less the cuts
    between two calls of a shared layer."""
    from hetpipe_tf.partitioner.layer_graph import LayerGraph

    graph = LayerGraph.from_model(model)
    return len(graph) - len(graph.forbidden_cuts())


def groups_within(devices: Sequence[Any], most: int) -> list[tuple]:
    """The fewest virtual workers of at most `most` devices each, in the cluster's device
    order (so a VW's devices share a host where they can), sizes as equal as possible."""
    count = -(-len(devices) // most)
    size, extra = divmod(len(devices), count)
    out, start = [], 0
    for w in range(count):
        end = start + size + (1 if w < extra else 0)
        out.append(tuple(devices[start:end]))
        start = end
    return out


def stage_bytes(plan, profile) -> list[int]:
    """Trainable parameter bytes of each stage of `plan`, from `profile`'s layers."""
    return [int(sum(la.trainable_param_bytes for la in profile.layers[s.first:s.last + 1]))
            for s in plan.stages]


def simulated_candidates(clock, plans: Sequence, param_bytes: Sequence[Sequence[int]],
                         n_ms: Sequence[int], distances: Sequence[int], label: str = "",
                         num_waves: int = 8) -> list:
    """One `pick.Candidate` per (N_m, D): `plans` in the cluster model `clock` (a
    `sim.VirtualClock`, the model the virtual clock trains in: its `simulate(plans, n_m,
    d, param_bytes, num_waves)`), seconds per minibatch = the simulation's makespan /
    minibatches of every VW over `num_waves` waves."""
    from hetpipe_tf.strategy.pick import Candidate

    out = []
    for n in n_ms:
        for d in distances:
            r = clock.simulate(plans, n, d, param_bytes, num_waves)
            out.append(Candidate(n, d, 1.0 / r.minibatches_per_s, label))
    return out


def _n_m_for_time(plans: Sequence, compensation, cluster_model=None, profile=None,
                  clock_distance: int = 0) -> int:
    """N_m of `plans` (the throughput default) lowered by the time-to-accuracy pick: in
    `cluster_model` when given (with the plans' `profile`), else by the stage-time rule."""
    if cluster_model is not None and profile is not None:
        from hetpipe_tf.strategy.pick import epoch_model, pick_for_time_to_accuracy

        cands = simulated_candidates(cluster_model, plans,
                                     [stage_bytes(p, profile) for p in plans],
                                     range(1, plans[0].n_m + 1), [clock_distance])
        best = pick_for_time_to_accuracy(cands, epoch_model(compensation)).best.candidate.n_m
        how = "the cluster model's time per minibatch"
    else:
        from hetpipe_tf.strategy.defaults import epoch_cost, n_m_for_time_to_accuracy

        best = n_m_for_time_to_accuracy([[s.time_s for s in p.stages] for p in plans],
                                        plans[0].n_m, epoch_cost(compensation))
        how = "the pipeline's predicted pace"
    if best < plans[0].n_m:
        logger.info("N_m = %d chosen for time to accuracy (%s against the epochs staleness "
                    "costs; throughput alone: N_m = %d); pass n_m= to choose.", best, how,
                    plans[0].n_m)
    return best


def plan_with_partitioner(model, batch_size: int, cluster: Any, n_m: int | None,
                          max_m: int | None, sync=None, compensation=None,
                          clock_distance: int = 0, cluster_model=None) -> tuple:
    """Profile and partition `model` with hetpipe_tf.partitioner.planner.plan_model: one
    virtual worker of every device, or, when the model has fewer stages to give than the
    cluster has devices, the fewest VWs that use every device (data parallelism between
    them, as MirroredStrategy would use every device), logged as a warning.

    N_m > Max_m raises ValueError (PartitionError) from the planner; a user-given `max_m`
    bounds N_m further.
    """
    from hetpipe_tf.partitioner.planner import plan_model
    from hetpipe_tf.strategy.prediction_memory import prediction_memory

    cl = resolve_cluster(cluster)
    pm = prediction_memory(compensation)   # weight prediction's buffers (None: none)
    most = max_stages(model)
    if len(cl.devices) > most:
        vws = groups_within(cl.devices, most)
        logger.warning(
            "Model %r can be cut into at most %d stage(s) but the cluster has %d devices: "
            "training as %d virtual workers (data parallel under WSP) of %s devices: %s.",
            model.name, most, len(cl.devices), len(vws),
            "/".join(str(len(v)) for v in vws), [[d.name for d in v] for v in vws])
        return plan_devices(model, batch_size, cl, vws, n_m, max_m, compensation,
                            clock_distance, cluster_model)
    # `sync`: a synchronous schedule's memory model (partitioner/cost.py SyncMemory).
    result = plan_model(model, cl, batch_size, n_m=n_m, optimizer=model.optimizer, sync=sync,
                        prediction=pm)
    if max_m is not None and result.plan.n_m > max_m:
        result = plan_model(model, cl, batch_size, n_m=max_m, optimizer=model.optimizer,
                            profile=result.profile, prediction=pm)
    if n_m is None and sync is None:
        best = _n_m_for_time((result.plan,), compensation, cluster_model, result.profile,
                             clock_distance)
        if best < result.plan.n_m:
            result = plan_model(model, cl, batch_size, n_m=best, optimizer=model.optimizer,
                                profile=result.profile, prediction=pm)
    return (result.plan,)


def plan_virtual_workers(model, batch_size: int, cluster: Any, allocation, num_vws,
                         n_m: int | None, max_m: int | None, compensation=None,
                         clock_distance: int = 0, cluster_model=None) -> tuple:
    """Form virtual workers by `allocation` (hetpipe_tf.cluster.allocation) and plan each
    with one N_m, profiling the model once: `n_m` if given, else the single-VW default
    min(Max_m, k) taken over the VWs (k = devices of a VW: k minibatches in flight keep a
    k-stage pipeline busy; more only adds staleness and memory)."""
    from hetpipe_tf.cluster.allocation import allocate

    cl = resolve_cluster(cluster)
    return plan_devices(model, batch_size, cl,
                        allocate(cl, allocation, num_virtual_workers=num_vws), n_m, max_m,
                        compensation, clock_distance, cluster_model)


def _profile_of_types(model, batch_size: int, vws: Sequence[Sequence]):
    """A profile with times for every device type of `vws` when the first VW lacks some
    (VWs of different types, e.g. groups of a heterogeneous cluster); else None, and the
    first VW's planning profiles its own types."""
    devices = [d for vw in vws for d in vw]
    if {d.type_name for d in devices} <= {d.type_name for d in vws[0]}:
        return None
    return _profile_of_devices(model, batch_size, devices)


def _profile_of_devices(model, batch_size: int, devices: Sequence):
    """The model's profile with times for every device type of `devices` (those present
    here measured on them, the others estimated)."""
    from hetpipe_tf.partitioner.layer_graph import LayerGraph
    from hetpipe_tf.partitioner.planner import measurable_devices
    from hetpipe_tf.partitioner.profiling import profile_model

    return profile_model(LayerGraph.from_model(model), batch_size,
                         sorted({d.type_name for d in devices}),
                         measure_on=measurable_devices(list(devices)),
                         optimizer=model.optimizer)


def _plan_vws(model, batch_size: int, cl, vws: Sequence[Sequence], n_m: int | None,
              max_m: int | None, pm, profile=None) -> tuple:
    """(plans, profile, replan) of `vws` at `n_m`, or at the throughput default min(Max_m,
    k) bounded by `max_m` (n_m=None), profiling once unless `profile` is given; `replan(n)`
    plans the same VWs at N_m = n on that profile."""
    from hetpipe_tf.partitioner.milp import plan_virtual_workers as plan_all
    from hetpipe_tf.partitioner.planner import plan_model

    first = plan_model(model, cl, batch_size, devices=vws[0], n_m=n_m,
                       optimizer=model.optimizer, prediction=pm,
                       profile=(profile if profile is not None
                                else _profile_of_types(model, batch_size, vws)))

    def replan(n: int | None) -> tuple:
        return tuple(plan_all(first.profile, vws, cluster=cl, n_m=n,
                              optimizer_slots=first.plan.optimizer_slots, prediction=pm))

    plans = replan(n_m)
    if n_m is None and plans[0].n_m > min(len(vw) for vw in vws):
        plans = replan(min(len(vw) for vw in vws))
    if max_m is not None and plans[0].n_m > max_m:
        plans = replan(max_m)
    return plans, first.profile, replan


def plan_devices(model, batch_size: int, cl, vws: Sequence[Sequence], n_m: int | None,
                 max_m: int | None, compensation=None, clock_distance: int = 0,
                 cluster_model=None) -> tuple:
    """Plan each virtual worker of `vws` (device tuples) with one N_m, profiling the model
    once (the N_m rule of `plan_virtual_workers`)."""
    from hetpipe_tf.strategy.prediction_memory import prediction_memory

    pm = prediction_memory(compensation)   # weight prediction's buffers (None: none)
    plans, profile, replan = _plan_vws(model, batch_size, cl, vws, n_m, max_m, pm)
    if n_m is None:
        best = _n_m_for_time(plans, compensation, cluster_model, profile, clock_distance)
        if best < plans[0].n_m:
            plans = replan(best)
    return plans


def candidate_allocations(cl, policies: Sequence, num_vws: int | None) -> list[tuple]:
    """(policy, VWs) of each of `policies` that `cl` admits with at least two VWs (the
    virtual clock trains several), a grouping already listed counted once."""
    from hetpipe_tf.cluster.allocation import AllocationPolicy, allocate
    from hetpipe_tf.cluster.errors import AllocationError

    out, seen = [], set()
    for name in policies:
        policy = AllocationPolicy.parse(name)
        try:
            vws = tuple(tuple(vw) for vw in allocate(cl, policy, num_virtual_workers=num_vws))
        except AllocationError as e:
            logger.info("The pick leaves out allocation %s: %s", policy.name, e)
            continue
        key = frozenset(frozenset(d.name for d in vw) for vw in vws)
        if len(vws) >= 2 and key not in seen:
            seen.add(key)
            out.append((policy, vws))
    return out


def plan_for_time_to_accuracy(options, model, batch_size: int) -> tuple | None:
    """(plans, picked) of the joint pick of N_m, D and the allocation under the strategy's
    cluster model (module docstring), each value the user gave kept as given; `picked` (a
    `layout.Picked`) holds the D and the allocation picked (None where given), which the
    model's `Layout` keeps. None when the cluster admits no allocation of several VWs (the
    caller then plans as without a pick).

    Cost: one profile of the model; per allocation one MILP per VW at the throughput N_m
    (and one more at the picked N_m for the allocation picked); one simulation of
    `num_waves` waves per (allocation, N_m, D): at most 3 x k x 3 for k stages per VW."""
    from hetpipe_tf.partitioner.plan import PartitionError
    from hetpipe_tf.strategy.layout import Picked
    from hetpipe_tf.strategy.pick import epoch_model, pick_for_time_to_accuracy
    from hetpipe_tf.strategy.prediction_memory import prediction_memory

    t0 = time.perf_counter()
    layout, pipeline, wsp = options.layout, options.pipeline, options.wsp
    cl = resolve_cluster(layout.cluster)
    given_alloc = layout.allocation_given
    groupings = candidate_allocations(
        cl, (layout.allocation,) if given_alloc else PICK_ALLOCATIONS,
        layout.num_virtual_workers)
    if not groupings:
        return None
    distances = (wsp.clock_distance,) if wsp.distance_given else PICK_DISTANCES
    compensation = options.compensation.value
    pm = prediction_memory(compensation)
    # One profile for every allocation the pick weighs.
    profile = None if given_alloc else _profile_of_devices(model, batch_size, cl.devices)
    planned, cands, first_error = {}, [], None
    for policy, vws in groupings:
        try:
            plans, profile_used, replan = _plan_vws(model, batch_size, cl, vws, pipeline.n_m,
                                                    pipeline.max_m, pm, profile)
            n_ms = ((pipeline.n_m,) if pipeline.n_m is not None
                    else range(1, plans[0].n_m + 1))
            cands += simulated_candidates(
                options.clock.model, plans, [stage_bytes(p, profile_used) for p in plans],
                n_ms, distances, label=policy.name)
        except (PartitionError, ValueError) as e:
            if given_alloc:
                raise
            logger.warning("The pick leaves out allocation %s: %s", policy.name, e)
            first_error = first_error or e
            continue
        planned[policy.name] = (policy, plans, replan)
    if not cands:
        raise first_error
    picked = pick_for_time_to_accuracy(cands, epoch_model(compensation))
    best = picked.best.candidate
    policy, plans, replan = planned[best.label]
    if best.n_m != plans[0].n_m:
        plans = replan(best.n_m)
    chosen = Picked(None if wsp.distance_given else best.clock_distance,
                    None if given_alloc else policy)
    logger.info(
        "Picked by predicted time to accuracy in the cluster model (%d candidates, %.1f s): "
        "allocation %s%s, N_m = %d%s, D = %d%s; predicted epochs to target %.3g x %.3g "
        "virtual s per minibatch. Candidates (times relative: 1 base epoch of 1 "
        "minibatch, only their order counts):\n%s", len(cands), time.perf_counter() - t0,
        policy.name,
        " (given)" if given_alloc else "", best.n_m,
        " (given)" if pipeline.n_m is not None else "", best.clock_distance,
        " (given)" if wsp.distance_given else "", picked.best.epochs, best.seconds_per_minibatch,
        "\n".join(" | ".join(row) for row in picked.rows()))
    return plans, chosen
