r"""The paper's experiments: run HetPipe on the devices at hand, or simulate a cluster.

  python -m benchmarks.hetpipe_benchmark --mode=run --model=small_cnn
  python -m benchmarks.hetpipe_benchmark --mode=simulate --model=vgg19 --cluster=paper \
      --allocation=ED --placement=ed_local --staleness=0
  python -m benchmarks.hetpipe_benchmark --mode=paper   # = python -m experiments.paper

--mode=run trains for real on this machine (--cluster=local: one logical CPU device per
--devices entry, EMULATED at --speed_factors, split into --hosts hosts): the virtual workers
that --allocation forms, each a pipeline, under WSP with --staleness=D through parameter
servers placed by --placement; it prints images/sec, per-stage utilisation, waiting and
idle time, bytes across hosts and the clock distance, beside a data-parallel all-reduce
baseline (tf.distribute.MirroredStrategy over the same devices: the paper's Horovod column).

  python -m benchmarks.hetpipe_benchmark --mode=run --model=mlp --hosts=2 \
      --devices=LOCAL_CPU,LOCAL_CPU,LOCAL_CPU,LOCAL_CPU --speed_factors=1,1,0.5,0.5 \
      --allocation=ED --placement=ed_local --staleness=1
--mode=simulate predicts the same figures for any cluster of the device catalog with the
discrete-event simulator (hetpipe_tf.sim), beside the simulated all-reduce baseline and
HetSeq (the same global batch split over the GPUs by speed, hetpipe_tf/sim/hetseq.py).
"""

from __future__ import annotations

import os

os.environ.setdefault("TF_CPP_MIN_LOG_LEVEL", "3")

import time  # noqa: E402

from absl import app, flags  # noqa: E402

from benchmarks._cli import compensation, compensation_flag, load_cluster, run  # noqa: E402
from hetpipe_tf.model_names import MODEL_NAMES  # noqa: E402
from hetpipe_tf.cluster.allocation import AllocationPolicy  # noqa: E402

_MODE = flags.DEFINE_enum("mode", "run", ["run", "simulate", "paper"], "What to do "
                          "('paper': the paper's tables against the cluster model, as "
                          "python -m experiments.paper).")
_MODEL = flags.DEFINE_enum("model", "small_cnn", MODEL_NAMES, "Model.")
_CLUSTER = flags.DEFINE_string(
    "cluster", "local", "'local' (this machine's CPU split into --devices logical devices, "
    "one host each), 'paper' (the paper's 4 hosts x 4 GPUs), or a cluster JSON file.")
_DEVICES = flags.DEFINE_list("devices", ["LOCAL_CPU", "LOCAL_CPU"],
                             "Device types of --cluster=local, one per logical device.")
_HOSTS = flags.DEFINE_integer("hosts", 0, "Hosts of --cluster=local: the devices are split "
                              "into this many equal groups; 0 = one host per device.",
                              lower_bound=0)
_SPEED = flags.DEFINE_list("speed_factors", ["1.0", "0.5"], "EMULATED speed factor per "
                           "device of --cluster=local (1.0 = real speed).")
_ALLOCATION = flags.DEFINE_enum_class("allocation", "ED", AllocationPolicy,
                                      "Virtual workers: NP, ED, HD or AUTO (Section 8.1).",
                                      case_sensitive=False)
_PLACEMENT = flags.DEFINE_enum("placement", "default", ["default", "ed_local"],
                               "Parameter placement over the parameter servers.")
_NM = flags.DEFINE_integer("nm", 0, "Minibatches in flight N_m; 0 = the default: run mode "
                           "min(Max_m, stages), simulate mode the largest N_m every virtual "
                           "worker fits (min over VWs of Max_m).", lower_bound=0)
_STALENESS = flags.DEFINE_integer("staleness", 0, "Clock distance D (WSP).", lower_bound=0)
_COMPENSATION = compensation_flag("none")   # run mode (the others build no strategy)
_BATCH_SIZE = flags.DEFINE_integer("batch_size", 32, "Minibatch size.", lower_bound=1)
_INPUT_SIZE = flags.DEFINE_integer("input_size", 0, "Image side (features for mlp); 0 = the "
                                   "model's default.", lower_bound=0)
_NUM_CLASSES = flags.DEFINE_integer("num_classes", 10, "Output classes.", lower_bound=2)
_STEPS = flags.DEFINE_integer("steps", 20, "Timed minibatches (run mode).", lower_bound=1)
_WAVES = flags.DEFINE_integer("num_waves", 20, "Simulated waves (simulate mode).",
                              lower_bound=1)
_COMPUTE_SCALE = flags.DEFINE_float(
    "compute_scale", 1.0, "Simulate mode: multiply every stage's compute time (a labelled "
    "contention factor; 1 on dedicated GPUs).", lower_bound=0.01)
_TRACE_DIR = flags.DEFINE_string(
    "trace_dir", None, "Write the timeline here: <mode>_trace.json (Chrome trace: Perfetto "
    "or chrome://tracing) and <mode>_pipeline.png (drawn like the paper's Figure 1).")


@flags.validator("speed_factors", message="--speed_factors must be numbers in (0, 1].")
def _check_speed(values: list[str]) -> bool:
    try:
        return all(0 < float(v) <= 1 for v in values)
    except ValueError:
        return False


def _check_placement() -> None:
    """Flag combinations refused before any cluster is loaded or model profiled."""
    if _PLACEMENT.value == "ed_local" and _ALLOCATION.value is not AllocationPolicy.ED:
        raise app.UsageError(
            "--placement=ed_local keeps partition k of every virtual worker on the node that "
            "holds it, which only Equal Distribution guarantees (Section 8.1). Received: "
            f"--placement=ed_local --allocation={_ALLOCATION.value.name}; use --allocation=ED "
            "or --placement=default.")


def _check_vw_sizes(vws, num_layers: int) -> None:
    """A stage needs at least one layer: a virtual worker of more devices than the model
    has layers cannot be planned (a clear error here rather than from the MILP)."""
    biggest = max(len(vw) for vw in vws)
    if biggest > num_layers:
        raise ValueError(
            f"--allocation={_ALLOCATION.value.name} forms virtual workers of up to {biggest} "
            f"devices, but --model={_MODEL.value} has {num_layers} layers and every device of "
            f"a virtual worker needs at least one. Received: {len(vws)} virtual worker(s) of "
            f"{sorted({len(vw) for vw in vws})} devices on --cluster={_CLUSTER.value}; use "
            "--allocation=NP (one virtual worker per host) or HD, a model with more layers, "
            "or a cluster with fewer devices per virtual worker.")


def _cluster():
    from hetpipe_tf.cluster.spec import Cluster
    if _CLUSTER.value == "local":
        if len(_SPEED.value) != len(_DEVICES.value):
            raise app.UsageError(
                "--speed_factors needs one factor per --devices entry. Received: "
                f"{len(_SPEED.value)} factors for {len(_DEVICES.value)} devices.")
        hosts = _HOSTS.value or len(_DEVICES.value)
        if len(_DEVICES.value) % hosts:
            raise app.UsageError(
                "--hosts must divide the number of --devices. Received: --hosts="
                f"{hosts} for {len(_DEVICES.value)} devices.")
        return Cluster.local(_DEVICES.value, hosts=hosts,
                             emulated_speed_factors=[float(v) for v in _SPEED.value])
    return load_cluster(_CLUSTER.value)


def _model():
    from hetpipe_tf import models

    return models.build_model(_MODEL.value, input_size=_INPUT_SIZE.value or None,
                              num_classes=_NUM_CLASSES.value)


def _dataset(tf, model):
    """Random inputs and labels of the model's shapes (offline; throughput only)."""
    shape = tuple(model.inputs[0].shape[1:])
    n = _BATCH_SIZE.value * 4
    x = tf.random.stateless_normal((n, *shape), seed=(1, 2))
    y = tf.random.stateless_uniform((n,), seed=(3, 4), maxval=_NUM_CLASSES.value,
                                    dtype=tf.int32)
    return tf.data.Dataset.from_tensor_slices((x, y)).batch(
        _BATCH_SIZE.value, drop_remainder=True).repeat()


def _timed_fit(model, ds) -> tuple[float, float]:
    """(images/s of the timed fit, its perf_counter start), after a warm-up fit."""
    model.fit(ds, epochs=1, steps_per_epoch=3, verbose=0)        # warm-up: tracing
    start = time.perf_counter()
    model.fit(ds, epochs=1, steps_per_epoch=_STEPS.value, verbose=0)
    return _STEPS.value * _BATCH_SIZE.value / (time.perf_counter() - start), start


def _bytes_across_hosts(plan, profile, cluster) -> int:
    """Activation and gradient bytes one minibatch moves between hosts of a virtual worker."""
    total = 0
    for a, b in zip(plan.stages, plan.stages[1:]):
        if not cluster.same_host(a.device, b.device):
            total += 2 * profile.cut_bytes[a.last]   # activations forward, gradients back
    return total


def _write_timeline(events, plan, title: str) -> None:
    if not _TRACE_DIR.value:
        return
    from hetpipe_tf.observe import draw_pipeline_png, write_chrome_trace
    os.makedirs(_TRACE_DIR.value, exist_ok=True)
    base = os.path.join(_TRACE_DIR.value, _MODE.value)
    write_chrome_trace(events, base + "_trace.json", label=title, plan=plan)
    draw_pipeline_png(events, base + "_pipeline.png", title=title, plan=plan)
    print(f"timeline: {base}_trace.json, {base}_pipeline.png")


def _run() -> None:
    from hetpipe_tf.cluster.allocation import allocate, type_string
    from hetpipe_tf.cluster.local import configure_logical_devices
    if _CLUSTER.value != "local":
        raise app.UsageError(
            "--mode=run trains on the devices at hand, which here are logical CPU devices: "
            f"use --cluster=local. Received: --cluster={_CLUSTER.value}; use --mode=simulate "
            "for a cluster that is not at hand.")
    comp = compensation(_COMPENSATION)
    cluster = _cluster()
    if _BATCH_SIZE.value % len(cluster.devices):
        raise app.UsageError(
            "The all-reduce baseline (MirroredStrategy) splits each minibatch evenly over the "
            f"devices. Received: --batch_size={_BATCH_SIZE.value} for "
            f"{len(cluster.devices)} devices; use a multiple of {len(cluster.devices)}.")
    vws = allocate(cluster, _ALLOCATION.value)
    configure_logical_devices(len(cluster.devices))
    import keras
    import tensorflow as tf

    from hetpipe_tf import HetPipeStrategy
    from hetpipe_tf.observe import stage_stats
    from hetpipe_tf.observe.events import normalize
    from hetpipe_tf.partitioner.milp import plan_virtual_workers
    from hetpipe_tf.partitioner.planner import plan_model
    from hetpipe_tf.ps.placement import bytes_across_hosts_per_wave, place_parameters

    print(cluster.describe())
    print(f"{len(vws)} virtual worker(s) by {_ALLOCATION.value.name}: "
          + ", ".join(f"vw{w}=[{', '.join(d.name for d in vw)}]" for w, vw in enumerate(vws)))
    from hetpipe_tf.partitioner.layer_graph import LayerGraph
    _check_vw_sizes(vws, len(LayerGraph.from_model(_model()).nodes))
    from hetpipe_tf.strategy.prediction_memory import prediction_memory
    pm = prediction_memory(comp)   # the compensation's buffers, as the strategy plans them
    first = plan_model(_model(), cluster, _BATCH_SIZE.value, devices=vws[0],
                       n_m=_NM.value or None, prediction=pm)
    profile = first.profile
    plans = (first.plan,) if len(vws) == 1 else plan_virtual_workers(
        profile, vws, cluster=cluster, n_m=_NM.value or None,
        optimizer_slots=first.plan.optimizer_slots, prediction=pm)
    for w, plan in enumerate(plans):
        print(f"virtual worker {w} ({type_string(vws[w])}):\n{plan.table()}")
    strategy = HetPipeStrategy(cluster, plan=plans[0] if len(plans) == 1 else plans,
                               clock_distance=_STALENESS.value, placement=_PLACEMENT.value,
                               compensation=comp)
    with strategy.scope():
        model = _model()
        model.compile(keras.optimizers.SGD(0.01), "sparse_categorical_crossentropy")
    ds = _dataset(tf, model)
    try:
        hetpipe, start = _timed_fit(model, ds)
        events = [e for w in range(len(plans))         # the timed fit only
                  for e in normalize(strategy.pipeline(model, w).trace, vw=w)
                  if e.start >= start]
        coord = strategy.coordinator(model)
    finally:
        strategy.close()
    devices = [d.tf_device for vw in vws for d in vw]
    tf.get_logger().setLevel("ERROR")   # MirroredStrategy logs every reduction at INFO
    mirrored = tf.distribute.MirroredStrategy(devices)
    with mirrored.scope():
        baseline = _model()
        baseline.compile(keras.optimizers.SGD(0.01), "sparse_categorical_crossentropy")
    allreduce, _ = _timed_fit(baseline, ds)
    print(f"\nHetPipe, {len(plans)} virtual worker(s), N_m={plans[0].n_m}, "
          f"D={_STALENESS.value}, placement={_PLACEMENT.value}, compensation={comp.value}: "
          f"{hetpipe:8.1f} images/s")
    print(f"all-reduce data parallelism (MirroredStrategy, {len(devices)} replicas, global "
          f"batch {_BATCH_SIZE.value}): {allreduce:8.1f} images/s = "
          f"{hetpipe / allreduce:.2f}x for HetPipe (the baseline runs every device at real "
          "speed: emulated speed factors do not apply to it, which favours it)")
    activations = sum(_bytes_across_hosts(p, profile, cluster) for p in plans) / len(plans)
    print(f"bytes across hosts per minibatch (activations + gradients, mean over VWs): "
          f"{activations:.0f}")
    if coord is None:
        print("parameter traffic: 0 (one virtual worker has no parameter server)")
    else:
        placement = place_parameters(profile, plans, cluster, policy=_PLACEMENT.value)
        per_wave = bytes_across_hosts_per_wave(placement, plans, profile, cluster)
        waves = len(coord.servers.pushes)
        print(f"parameter traffic: {waves} pushes and {coord.servers.pull_count} pulls "
              f"(whole run, warm-up included); bytes across hosts per wave of every VW: "
              f"{per_wave} (push + pull, {_PLACEMENT.value} placement)")
        print(f"minibatches per virtual worker: {[len(a) for a in coord.assignment]}; "
              f"largest clock distance after a push: {coord.servers.max_clock_distance} "
              f"(bound D+1 = {_STALENESS.value + 1})")
        for w, sync in enumerate(coord.syncs):
            print(f"vw{w}: waited {sync.wait_s:.2f} s for global weights")
    print("vw  stage  device                          utilisation  idle s  waiting s")
    for (w, j), st in sorted(stage_stats(events).items()):
        print(f"{w:2}  {j:5}  {plans[w].stages[j].device:30}  {st.utilisation:11.2f}  "
              f"{st.idle_s:6.2f}  {st.waiting_s:9.2f}")
    _write_timeline(events, plans[0], f"{_MODEL.value}, real run, {len(plans)} VW(s), "
                    f"N_m={plans[0].n_m}")


def _simulate() -> None:
    from hetpipe_tf.partitioner.profiling import profile_model
    from hetpipe_tf.ps.placement import PlacementPolicy
    from hetpipe_tf.sim.calibration import in_measured_order
    from hetpipe_tf.sim.scenario import simulate_scenario
    from hetpipe_tf.cluster.allocation import allocate
    cluster = _cluster()
    types = sorted({d.type_name for d in cluster.devices})
    # The cluster model (docs/cluster_model.md): estimated times in the paper's measured
    # speed order, PS traffic over shared links (simulate_scenario's default network).
    profile = in_measured_order(profile_model(_model(), _BATCH_SIZE.value, types))
    # The virtual workers simulate_scenario forms (same call), checked for a clear error.
    _check_vw_sizes(allocate(cluster, _ALLOCATION.value, profile=profile),
                    len(profile.layers))
    print(cluster.describe())
    print(f"Simulated (layer times estimated from the device catalog; compute_scale="
          f"{_COMPUTE_SCALE.value:g}).")
    # The paper's cluster gets the paper setup's Horovod (all-reduce on the CPU, its install
    # default, HOROVOD_CPU); other clusters Horovod over NCCL (docs/cluster_model.md).
    from hetpipe_tf.sim.allreduce import HOROVOD_CPU, HorovodConfig
    hv_config = HOROVOD_CPU if _CLUSTER.value == "paper" else HorovodConfig()
    result = simulate_scenario(
        profile, cluster, _ALLOCATION.value, PlacementPolicy.parse(_PLACEMENT.value),
        n_m=_NM.value or None, clock_distance=_STALENESS.value, num_waves=_WAVES.value,
        batch_size=_BATCH_SIZE.value, compute_scale=_COMPUTE_SCALE.value,
        horovod_config=hv_config)
    print("Horovod: " + ("all-reduce on the CPU at Horovod's measured rate (HOROVOD_CPU, "
                         "the paper setup)" if hv_config == HOROVOD_CPU else
                         "NCCL ring, fusion and overlap (HorovodConfig())"))
    print(result.table())
    from hetpipe_tf.sim.hetseq import hetseq
    # HetSeq on the same GPUs: their global batch (GPUs x --batch_size) split by speed.
    hs = hetseq(profile, cluster.devices, cluster)
    print(f"{hs.line()} = {hs.samples_per_s / result.horovod.samples_per_s:.2f}x Horovod, "
          f"{hs.samples_per_s / result.samples_per_s:.2f}x HetPipe")
    _write_timeline(result.sim.events, result.plans[0],
                    f"{_MODEL.value}, simulated, N_m={result.n_m}, D={_STALENESS.value}")


def _paper() -> None:
    # The same report as python -m experiments.paper, from the same cluster model.
    from experiments import paper, paper_goals
    print(paper_goals.report(cache_dir=paper.DEFAULT_CACHE_DIR))


def main(argv: list[str]) -> None:
    if len(argv) > 1:
        raise app.UsageError(f"Unexpected positional arguments. Received: {argv[1:]}; "
                             "pass options as --flag=value (--helpshort lists them).")
    if _MODE.value != "paper":
        _check_placement()
    {"run": _run, "simulate": _simulate, "paper": _paper}[_MODE.value]()


if __name__ == "__main__":
    run(main)
