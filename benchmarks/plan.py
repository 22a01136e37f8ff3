r"""Plan a model over a virtual worker of (possibly emulated) heterogeneous devices.

  python -m benchmarks.plan --model=resnet152 \
      --devices=TITAN_V,TITAN_RTX,RTX_2060,QUADRO_P4000 --batch_size=32

Profiles the model (device types present here are measured, the others estimated from the
device catalog), finds Max_m and N_m, solves the partition MILP and prints the plan as a
table; --output_json writes it. With --cluster=local (the default) every device is a
logical CPU device of this machine that EMULATES the named type: the plan's times are the
catalog's predictions for the real type, not this machine's.
"""

from __future__ import annotations

import os

os.environ.setdefault("TF_CPP_MIN_LOG_LEVEL", "2")

from absl import app, flags  # noqa: E402

from benchmarks._cli import load_cluster, run  # noqa: E402
from hetpipe_tf.model_names import MODEL_NAMES  # noqa: E402
from hetpipe_tf.cluster import catalog  # noqa: E402

_MODEL = flags.DEFINE_enum("model", "resnet50", MODEL_NAMES, "Model to partition.")
_DEVICES = flags.DEFINE_list(
    "devices", ["TITAN_V", "TITAN_RTX", "RTX_2060", "QUADRO_P4000"],
    "Device types of the virtual worker, one entry per device (catalog names, e.g. "
    "TITAN_V; LOCAL_CPU is this machine's CPU).")
_CLUSTER = flags.DEFINE_string(
    "cluster", "local",
    "'local' (each device a logical CPU device here, emulating its type, one host per "
    "device), 'paper' (the paper's 4x4 GPU testbed; --devices picks one device of each "
    "named type), or a cluster JSON file (--devices picks by type as for 'paper').")
_BATCH_SIZE = flags.DEFINE_integer("batch_size", 32, "Minibatch size.", lower_bound=1)
_NM = flags.DEFINE_integer("nm", 0, "Minibatches in flight N_m; 0 = min(Max_m, devices).",
                           lower_bound=0)
_MAX_NM = flags.DEFINE_integer("max_nm", 32, "Largest N_m searched for Max_m.",
                               lower_bound=1)
_OPTIMIZER = flags.DEFINE_enum("optimizer", "sgd", ["sgd", "momentum", "adam", "rmsprop"],
                               "Optimizer, for the memory of its slots.")
_INPUT_SIZE = flags.DEFINE_integer("input_size", 0, "Image side (features for mlp); 0 = "
                                   "the model's default.", lower_bound=0)
_NUM_CLASSES = flags.DEFINE_integer("num_classes", 1000, "Output classes.", lower_bound=2)
_MEASURE = flags.DEFINE_bool("measure", True, "Time device types present here (CPU types "
                             "on CPU devices); others are estimated from the catalog.")
_OUTPUT_JSON = flags.DEFINE_string("output_json", None, "Write the plan as JSON here.")


@flags.validator("devices", message="--devices must name at least one device type.")
def _check_devices_given(value: list[str]) -> bool:
    return bool(value)


def _check_device_types(type_names: list[str]) -> None:
    """Known types: the catalog's, plus the custom types a --cluster file registered (so
    this runs after the cluster is loaded, not at flag parsing)."""
    unknown = []
    for name in type_names:
        try:
            catalog.get_device_type(name)
        except ValueError:
            unknown.append(name)
    if unknown:
        raise app.UsageError(
            f"--devices must name known device types. Received: {', '.join(unknown)}; use "
            f"types of the catalog (known: {', '.join(catalog.known_device_types())}) or "
            "declare custom types in the --cluster file's device_types.")


def _virtual_worker(cluster_flag: str, type_names: list[str]):
    """(cluster, devices of the virtual worker) for the --cluster and --devices flags."""
    from hetpipe_tf.cluster.local import configure_logical_devices
    from hetpipe_tf.cluster.spec import Cluster
    if cluster_flag == "local":
        _check_device_types(type_names)
        cluster = Cluster.local(type_names, hosts=len(type_names))
        configure_logical_devices(len(cluster.devices))
        return cluster, list(cluster.devices)
    cluster = load_cluster(cluster_flag)
    _check_device_types(type_names)
    free = list(cluster.devices)
    chosen = []
    for name in type_names:
        canonical = catalog.canonical_type_name(name)
        match = next((d for d in free if d.type_name == canonical), None)
        if match is None:
            raise app.UsageError(
                f"The cluster has no (further) device of type {canonical}. Received: "
                f"--devices={','.join(type_names)}; its devices are "
                f"{', '.join(d.name + '=' + d.type_name for d in cluster.devices)}.")
        chosen.append(match)
        free.remove(match)
    return cluster, chosen


def main(argv: list[str]) -> None:
    if len(argv) > 1:
        raise app.UsageError(f"Unexpected positional arguments. Received: {argv[1:]}; "
                             "pass options as --flag=value (--helpshort lists them).")
    from hetpipe_tf import models
    from hetpipe_tf.partitioner.planner import plan_model

    cluster, devices = _virtual_worker(_CLUSTER.value, _DEVICES.value)
    print(cluster.describe())
    model = models.build_model(_MODEL.value, input_size=_INPUT_SIZE.value or None,
                               num_classes=_NUM_CLASSES.value)
    result = plan_model(model, cluster, _BATCH_SIZE.value, devices=devices,
                        n_m=_NM.value or None, optimizer=_OPTIMIZER.value,
                        measure=_MEASURE.value, max_n_m=max(_MAX_NM.value, _NM.value))
    sources = ", ".join(f"{t}: {s}" for t, s in sorted(result.profile.time_source.items()))
    print(f"\nLayer times by device type ({sources}).")
    print(f"Max_m = {result.max_m} (largest N_m that fits, searched up to "
          f"{max(_MAX_NM.value, _NM.value)}); N_m = {result.plan.n_m}.\n")
    print(result.plan.table())
    if _OUTPUT_JSON.value:
        result.plan.save(_OUTPUT_JSON.value)
        print(f"\nWrote the plan to {_OUTPUT_JSON.value}")


if __name__ == "__main__":
    run(main)
