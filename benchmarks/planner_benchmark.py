r"""How long planning takes, and whether the plan is proven optimal: DP against MILP.

  python -m benchmarks.planner_benchmark --models=resnet152 --layers=100,250,1000 \
      --stages=8,16 --methods=dp,milp

Every case is solved by each method of --methods in the same run: `dp` (the default
method: bisection on the slowest stage with a DP over cuts and device-class counts,
partitioner/dp.py) and `milp` (the MILP per device order, or the assignment MILP past 120
orders: the method before the DP). Part 1 solves VGG-19 and ResNet-152 (keras.applications,
weights=None, 224x224, batch 32, layer times estimated from the device catalog) over one
virtual worker of the paper's four GPU types (TITAN V, TITAN RTX, RTX 2060, Quadro P4000,
each on its own host as in ED), every device order, at N_m = 1 and at N_m = Max_m (capped
at 8). Part 2 times synthetic models of --layers layers over --stages stages (half the
devices of a fast type on one host, half of a slow, small type on another). Solve time is
wall time of `milp.solve` on this machine; profiling, model building and the Max_m search
are not included. The proof column: "optimal" = the DP's bisection closed (a layout meets
a proven lower bound, to float rounding), "gap<=G" = HiGHS proved the MILP optimal within
mip_rel_gap G, "NO (time limit)" = the time limit stopped the search (best layout found).
"""

from __future__ import annotations

import os

os.environ.setdefault("TF_CPP_MIN_LOG_LEVEL", "2")

import time  # noqa: E402

import numpy as np  # noqa: E402
from absl import app, flags  # noqa: E402

from benchmarks._cli import run  # noqa: E402

_MODELS = flags.DEFINE_list("models", ["vgg19", "resnet152"], "Models for part 1.")
_LAYERS = flags.DEFINE_list("layers", ["50", "100", "250", "500", "1000"],
                            "Layer counts of the synthetic models (part 2).")
_STAGES = flags.DEFINE_list("stages", ["2", "4", "8", "16"], "Stage counts (part 2).")
_BATCH_SIZE = flags.DEFINE_integer("batch_size", 32, "Minibatch size.", lower_bound=1)
_TIME_LIMIT = flags.DEFINE_float("time_limit", 60.0, "Time budget of one solve in part 2 (s); "
                                 "a solve that reaches it is marked.", lower_bound=1.0)
_SEED = flags.DEFINE_integer("seed", 0, "Seed of the synthetic models.")
_METHODS = flags.DEFINE_list("methods", ["dp", "milp"],
                             "Planning methods to compare on every case: dp, milp, auto.")


def _positive_ints(values: list[str]) -> bool:
    return all(v.isdigit() and int(v) > 0 for v in values)


flags.register_validator("layers", _positive_ints, "--layers must be positive integers.")
flags.register_validator("stages", _positive_ints, "--stages must be positive integers.")
flags.register_validator("methods", lambda v: all(m in ("dp", "milp", "auto") for m in v),
                         "--methods must be among dp, milp, auto.")


def _solve(profile, devices, n_m, cluster, method: str, time_limit: float | None):
    """(seconds, proof, bottleneck ms or None, plan or None) of one solve."""
    from hetpipe_tf.partitioner import milp
    from hetpipe_tf.partitioner.plan import PartitionError
    options = milp.SolverOptions(method=method, time_limit_s=time_limit)
    start = time.perf_counter()
    try:
        plan = milp.solve(profile, devices, n_m, cluster=cluster, optimizer_slots=1,
                          options=options)
    except PartitionError as e:
        seconds = time.perf_counter() - start
        limited = "time budget" in str(e)
        return seconds, "NO (time limit)" if limited else "no layout fits", None, None
    seconds = time.perf_counter() - start
    if "time limit" in plan.solver:
        proof = "NO (time limit)"
    elif "solver error" in plan.solver:
        proof = "NO (solver error)"
    elif plan.solver.startswith("dp") or plan.solver == "single stage":
        proof = "optimal"
    else:
        proof = f"gap<={options.mip_rel_gap:g}"
    return seconds, proof, plan.predicted_stage_time_s * 1e3, plan


def synthetic_profile(num_layers: int, types: tuple[str, ...], speeds: tuple[float, ...],
                      seed: int, batch_size: int):
    """A ResNet-like profile: blocks of conv/bn/relu whose costs and sizes vary by depth."""
    from hetpipe_tf.partitioner.profile import LayerCost, ModelProfile
    rng = np.random.default_rng(seed)
    layers, cuts = [], []
    for i in range(num_layers):
        heavy = i % 3 == 0                          # a conv every third layer
        stage_of_net = 4 * i // num_layers          # deeper: fewer activations, more weights
        base = rng.uniform(2e-3, 6e-3) if heavy else rng.uniform(5e-5, 3e-4)
        # Total activations stay those of a ~100-layer net, so every size fits a GPU.
        act = int(batch_size * 56 * 56 * 256 * 4 / 2 ** stage_of_net * rng.uniform(0.5, 1.0)
                  * min(1.0, 100 / num_layers))
        params = int(rng.uniform(1e5, 3e6) * 2 ** stage_of_net) if heavy else 0
        layers.append(LayerCost(name=f"layer{i}", time_s={t: base * s for t, s in
                                                          zip(types, speeds)},
                                flops=0, bytes_accessed=0, param_bytes=params,
                                trainable_param_bytes=params, activation_bytes=act))
        if i < num_layers - 1:                      # block ends carry 1 tensor, insides 2
            cuts.append(act * (1 if i % 9 == 8 else 2))
    return ModelProfile(model_name=f"synthetic{num_layers}", batch_size=batch_size,
                        layers=tuple(layers), cut_bytes=tuple(cuts),
                        time_source={t: "estimated" for t in types})


def _paper_models() -> None:
    from hetpipe_tf import models
    from hetpipe_tf.cluster.spec import paper_cluster
    from hetpipe_tf.partitioner import milp
    from hetpipe_tf.partitioner.profiling import profile_model
    cluster = paper_cluster()
    vw = [h.devices[0] for h in cluster.hosts]
    types = sorted({d.type_name for d in vw})
    print(f"Part 1: paper models over {', '.join(d.type_name for d in vw)} "
          f"({milp.count_distinct_orders(vw)} orders), batch_size={_BATCH_SIZE.value}, "
          "layer times estimated from the catalog (optimizer SGD with momentum)")
    print(f"{'model':10} {'layers':>6} {'Max_m':>5} {'N_m':>4} {'method':>6} {'solve s':>8} "
          f"{'proof':>16} {'bottleneck ms':>13}  order")
    for name in _MODELS.value:
        model = models.build_model(name)
        profile = profile_model(model, _BATCH_SIZE.value, types)
        max_m = milp.max_minibatches(profile, vw, cluster=cluster, optimizer_slots=1, limit=8)
        for n_m in sorted({1, max(max_m, 1)}):
            for method in _METHODS.value:
                seconds, proof, ms, plan = _solve(profile, vw, n_m, cluster, method, None)
                order = "-".join(s.device_type for s in plan.stages) if plan else "-"
                value = f"{ms:>13.4f}" if ms is not None else f"{'-':>13}"
                print(f"{name:10} {len(profile.layers):>6} {max_m:>5} {n_m:>4} {method:>6} "
                      f"{seconds:>8.2f} {proof:>16} {value}  {order}", flush=True)


def _scaling() -> None:
    from hetpipe_tf.cluster.spec import Cluster, Device, Host
    from hetpipe_tf.partitioner import milp
    types, speeds = ("TITAN_V", "QUADRO_P4000"), (1.0, 2.8)
    print(f"\nPart 2: synthetic models (N_m = 2; devices half {types[0]} on host0, half "
          f"{types[1]} on host1; time limit {_TIME_LIMIT.value:g} s per solve)")
    print(f"{'layers':>6} {'stages':>6} {'orders':>7} {'method':>6} {'solve s':>8} "
          f"{'proof':>16} {'bottleneck ms':>13}  solver")
    for num_layers in (int(v) for v in _LAYERS.value):
        profile = synthetic_profile(num_layers, types, speeds, _SEED.value, _BATCH_SIZE.value)
        for k in (int(s) for s in _STAGES.value):
            if k > num_layers:
                continue
            hosts = []
            for h, t in enumerate(types):
                count = k // 2 + (k % 2 if h == 0 else 0)
                hosts.append(Host(name=f"host{h}", intra_bandwidth=15.75e9, devices=tuple(
                    Device(name=f"host{h}/gpu{i}", type_name=t, host=f"host{h}",
                           tf_device=f"/job:worker/task:{h}/device:GPU:{i}")
                    for i in range(count))))
            cluster = Cluster(hosts=tuple(h for h in hosts if h.devices), inter_bandwidth=7e9)
            orders = milp.count_distinct_orders(cluster.devices)
            for method in _METHODS.value:
                seconds, proof, ms, plan = _solve(profile, cluster.devices, 2, cluster, method,
                                                  _TIME_LIMIT.value)
                value = f"{ms:>13.4f}" if ms is not None else f"{'-':>13}"
                solver = plan.solver if plan else "-"
                print(f"{num_layers:>6} {k:>6} {orders:>7} {method:>6} {seconds:>8.2f} "
                      f"{proof:>16} {value}  {solver}", flush=True)


def main(argv: list[str]) -> None:
    if len(argv) > 1:
        raise app.UsageError(f"Unexpected positional arguments. Received: {argv[1:]}; "
                             "pass options as --flag=value (--helpshort lists them).")
    if _MODELS.value:
        _paper_models()
    if _LAYERS.value and _STAGES.value:
        _scaling()


if __name__ == "__main__":
    run(main)
