"""Local emulation: a heterogeneous `Cluster` played by logical CPU devices of this machine.

`local_hosts` builds the hosts of `Cluster.local`: every declared device becomes the
logical CPU "/device:CPU:i" (the type "CPU" names this machine's CPU, `LOCAL_CPU`), keeps its type's catalog memory and speed for planning, and is
slowed down at run time by its `emulated_speed_factor`. `configure_logical_devices` splits
the CPU into those logical devices before TensorFlow starts; `relative_speed_factors`
gives factors proportional to the types' peak FLOP/s.
"""

from __future__ import annotations

from typing import Any, Iterable, Mapping, Sequence

from hetpipe_tf._args import check_int

from hetpipe_tf.cluster.catalog import (
    LOCAL_CPU_NAME,
    DeviceType,
    canonical_type_name,
    get_device_type,
    register_device_type,
)
from hetpipe_tf.cluster.devices import PCIE3_X16_BANDWIDTH, Device, Host
from hetpipe_tf.cluster.errors import invalid as _bad


def local_hosts(
    device_types: Sequence[str | DeviceType] | Sequence[Sequence[str | DeviceType]],
    *,
    hosts: int = 1,
    emulated_speed_factors: Sequence[float] | Mapping[str, float] | None = None,
    intra_bandwidth: float = PCIE3_X16_BANDWIDTH,
) -> tuple[Host, ...]:
    """The hosts of `Cluster.local` (arguments as there)."""
    groups = _group_device_types(device_types, hosts)
    # DeviceType values are registered so that the cluster can refer to them by name.
    flat = [register_device_type(t).name if isinstance(t, DeviceType)
            else get_device_type(_local_name(t)).name for g in groups for t in g]
    factors = _speed_factors(emulated_speed_factors, flat)
    host_list = []
    i = 0
    for h, group in enumerate(groups):
        host_name = f"host{h}"
        counters: dict[str, int] = {}
        devices = []
        for _ in group:
            type_name = flat[i]
            kind = get_device_type(type_name).kind.value.lower()
            k = counters.get(kind, 0)
            counters[kind] = k + 1
            devices.append(Device(name=f"{host_name}/{kind}{k}", type_name=type_name,
                                  host=host_name, tf_device=f"/device:CPU:{i}",
                                  emulated_speed_factor=factors[i]))
            i += 1
        host_list.append(Host(name=host_name, devices=tuple(devices),
                              intra_bandwidth=intra_bandwidth))
    return tuple(host_list)


def relative_speed_factors(type_names: Iterable[str]) -> dict[str, float]:
    """Type name -> peak FLOP/s relative to the fastest of them (1.0 for the fastest).

    Use as `Cluster.local(..., emulated_speed_factors=relative_speed_factors(types))` to
    emulate the compute heterogeneity of the types on identical logical CPUs.
    """
    types = [get_device_type(n) for n in type_names]
    if not types:
        raise _bad("relative_speed_factors needs at least one type", "type_names=[]",
                   "pass the type names of the cluster")
    fastest = max(t.peak_flops for t in types)
    return {t.name: t.peak_flops / fastest for t in types}


def _local_name(name: Any) -> Any:
    """"CPU" (TensorFlow's device type, what a user of a local cluster writes) is this
    machine's CPU, the catalog's LOCAL_CPU; any other name is looked up as it is."""
    if isinstance(name, str) and name.strip().upper() == "CPU":
        return LOCAL_CPU_NAME
    return name


def _group_device_types(device_types: Sequence[Any], hosts: int) -> list[list[Any]]:
    if isinstance(device_types, (str, DeviceType)) or not isinstance(device_types, Sequence):
        raise _bad("device_types must be a list of type names (or one list per host)",
                   f"device_types={device_types!r}", "pass e.g. ['TITAN_V', 'RTX_2060']")
    items = list(device_types)
    if items and all(isinstance(g, Sequence) and not isinstance(g, str) for g in items):
        if hosts not in (1, len(items)):
            raise _bad("hosts does not match the number of per-host lists",
                       f"hosts={hosts}, lists={len(items)}", "omit hosts or make them equal")
        groups = [list(g) for g in items]
    else:
        check_int("hosts", hosts, minimum=1, hint="pass e.g. hosts=2")
        if len(items) % hosts:
            raise _bad("The devices cannot be split evenly over the hosts",
                       f"devices={len(items)}, hosts={hosts}",
                       "pass one list per host, or a device count divisible by hosts")
        per = len(items) // hosts
        groups = [items[h * per:(h + 1) * per] for h in range(hosts)]
    if not any(groups):
        raise _bad("A cluster needs at least one compute device", "device_types=[]",
                   "declare at least one device type")
    return groups


def _speed_factors(
    factors: Sequence[float] | Mapping[str, float] | None, flat: Sequence[str]
) -> list[float]:
    if factors is None:
        return [1.0] * len(flat)
    if isinstance(factors, Mapping):
        by_type = {canonical_type_name(_local_name(k)): v for k, v in factors.items()}
        return [by_type.get(t, 1.0) for t in flat]
    if isinstance(factors, str) or len(factors) != len(flat):
        raise _bad("emulated_speed_factors needs one factor per device",
                   f"emulated_speed_factors={factors!r}, devices={len(flat)}",
                   "pass a list as long as the device list, or a type -> factor dict")
    return list(factors)


def configure_logical_devices(n: int) -> tuple[str, ...]:
    """Split the physical CPU into (at least) n logical CPU devices.

    Must run before TensorFlow initialises its devices (before the first op). If
    TensorFlow is already initialised with >= n logical CPUs, or a configuration with
    >= n devices is pending, it is accepted as is. Returns the logical CPU device names
    ("/device:CPU:0", ...), as many as will exist.
    """
    check_int("n", n, minimum=1, hint="configure_logical_devices needs one device at least, "
              "e.g. n=4")
    import tensorflow as tf  # local import: building a cluster does not need TF

    cpu = tf.config.list_physical_devices("CPU")[0]
    pending = tf.config.get_logical_device_configuration(cpu)
    if pending is not None and len(pending) >= n:
        return tuple(f"/device:CPU:{i}" for i in range(len(pending)))
    try:
        tf.config.set_logical_device_configuration(
            cpu, [tf.config.LogicalDeviceConfiguration() for _ in range(n)])
        return tuple(f"/device:CPU:{i}" for i in range(n))
    except RuntimeError:
        have = len(tf.config.list_logical_devices("CPU"))
        if have >= n:
            return tuple(f"/device:CPU:{i}" for i in range(have))
        raise RuntimeError(
            f"TensorFlow is already initialised with {have} logical CPU device(s), fewer "
            f"than requested. Received: n={n}; call configure_logical_devices({n}) first, "
            "before any TensorFlow op runs (e.g. at the top of the program or in a "
            "conftest), or run in a fresh process."
        ) from None


def host_cpu_device() -> str:
    """Full name of this process's CPU device: '/job:localhost/replica:0/task:0/device:CPU:0'
    alone, or e.g. '/job:chief/replica:0/task:0/device:CPU:0' once connected to a cluster."""
    import tensorflow as tf

    with tf.init_scope(), tf.device("/device:CPU:0"):
        return tf.constant(0).device
