"""Cluster specification: hosts, the devices on them, and the links between them.

A `Cluster` is the device inventory the partitioner and the runtime work from. It is a
frozen, JSON-serialisable value built one of four ways:

- by hand or from JSON (`Cluster.from_dict`, `Cluster.from_json`);
- from a TensorFlow cluster (`Cluster.from_tf_cluster_spec`, `Cluster.from_tf_config`):
  one `Host` per TF task, whose devices are declared by type name, because a chief
  cannot know the GPUs of a remote task before connecting to it (the hosts are built by
  `hetpipe_tf.cluster.tf_cluster`);
- as an emulation on this machine (`Cluster.local`): every declared device is a logical
  CPU device "/device:CPU:i", optionally slowed by an emulated speed factor (the hosts
  are built by `hetpipe_tf.cluster.local`, beside `configure_logical_devices` and
  `relative_speed_factors`);
- the paper's testbed (`paper_cluster`).

A host is one TF task (one process); devices on one host talk over the intra-host link
(PCIe), devices on different hosts over the inter-host network. `Device` and `Host` live in
`hetpipe_tf.cluster.devices`. `local_cluster`, `cluster_from_tf_cluster_spec` and
`cluster_from_tf_config` are the three classmethods as functions.
"""

from __future__ import annotations

import dataclasses
import json
import os
from typing import Any, Mapping, Sequence

from hetpipe_tf.cluster import local, tf_cluster
from hetpipe_tf.cluster.catalog import (
    BUILTIN_TYPE_NAMES,
    DeviceType,
    get_device_type,
    register_device_type,
)
from hetpipe_tf.cluster.devices import (  # noqa: F401 - Device, Host and the links' defaults
    INFINIBAND_56G_BANDWIDTH,             # are importable from here, beside Cluster
    PCIE3_X16_BANDWIDTH,
    Device,
    DeviceRef,
    Host,
    TaskKey,
    _check_bandwidth,
    tf_device_kind,
)
from hetpipe_tf.cluster.errors import invalid as _bad

@dataclasses.dataclass(frozen=True)
class Cluster:
    """The hosts of a training job and the network between them.

    Attributes:
      hosts: the hosts, in order; `devices` follows this order.
      inter_bandwidth: bytes/s of the network between two hosts.
    """

    hosts: tuple[Host, ...]
    inter_bandwidth: float
    _by_name: dict[str, Device] = dataclasses.field(
        init=False, repr=False, compare=False, hash=False)
    _host_by_name: dict[str, Host] = dataclasses.field(
        init=False, repr=False, compare=False, hash=False)
    _devices: tuple[Device, ...] = dataclasses.field(
        init=False, repr=False, compare=False, hash=False)

    def __post_init__(self) -> None:
        hosts = tuple(self.hosts)
        object.__setattr__(self, "hosts", hosts)
        _check_bandwidth("inter_bandwidth", self.inter_bandwidth)
        object.__setattr__(self, "inter_bandwidth", float(self.inter_bandwidth))
        host_by_name: dict[str, Host] = {}
        by_name: dict[str, Device] = {}
        tf_devices: dict[str, str] = {}
        tasks: dict[tuple[str, int], str] = {}
        for h in hosts:
            if not isinstance(h, Host):
                raise _bad("Cluster hosts must be Host values", f"host={h!r}",
                           "build them with Host(...)")
            if h.name in host_by_name:
                raise _bad("Duplicate host name", f"name={h.name!r}",
                           "give every host a unique name")
            host_by_name[h.name] = h
            if h.task is not None:
                if h.task in tasks:
                    raise _bad("Two hosts have the same TF task", f"task={h.task!r}",
                               "give every host its own (job, index)")
                tasks[h.task] = h.name
            for d in h.devices:
                if d.name in by_name:
                    raise _bad("Duplicate device name", f"name={d.name!r}",
                               "give every device a unique name, e.g. 'host1/gpu0'")
                if d.tf_device in tf_devices:
                    raise _bad("Two devices share one TF device",
                               f"tf_device={d.tf_device!r} for {tf_devices[d.tf_device]!r} "
                               f"and {d.name!r}", "map each device to its own TF device")
                get_device_type(d.type_name)  # unknown type -> ValueError with known names
                by_name[d.name] = d
                tf_devices[d.tf_device] = d.name
        if not by_name:
            raise _bad("A cluster needs at least one compute device",
                       f"hosts={[h.name for h in hosts]} with no devices",
                       "declare devices for at least one host")
        object.__setattr__(self, "_by_name", by_name)
        object.__setattr__(self, "_host_by_name", host_by_name)
        object.__setattr__(self, "_devices", tuple(d for h in hosts for d in h.devices))

    # ----------------------------------------------------------------- queries

    @property
    def devices(self) -> tuple[Device, ...]:
        """Every device, in host order."""
        return self._devices

    def device(self, name: DeviceRef) -> Device:
        """The device with this name (a `Device` of this cluster is returned as is)."""
        key = name.name if isinstance(name, Device) else name
        try:
            return self._by_name[key]
        except (KeyError, TypeError):
            raise _bad("Unknown device", f"name={key!r}",
                       f"use one of {sorted(self._by_name)}") from None

    def host(self, name: str) -> Host:
        """The host with this name."""
        try:
            return self._host_by_name[name]
        except (KeyError, TypeError):
            raise _bad("Unknown host", f"name={name!r}",
                       f"use one of {sorted(self._host_by_name)}") from None

    def host_of(self, device: DeviceRef) -> Host:
        """The host holding a device."""
        return self._host_by_name[self.device(device).host]

    def same_host(self, a: DeviceRef, b: DeviceRef) -> bool:
        """Whether two devices sit on the same host."""
        return self.device(a).host == self.device(b).host

    def device_type(self, device: DeviceRef) -> DeviceType:
        """The catalog entry of a device's type."""
        return get_device_type(self.device(device).type_name)

    def memory_of(self, device: DeviceRef) -> int:
        """Usable memory of a device in bytes (its own limit, else its type's memory)."""
        d = self.device(device)
        return d.memory_bytes if d.memory_bytes is not None else self.device_type(d).memory_bytes

    def device_is_emulated(self, device: DeviceRef) -> bool:
        """True if the device stands in for another: slowed down, or a GPU type on a CPU."""
        d = self.device(device)
        kind = tf_device_kind(d.tf_device)
        type_kind = self.device_type(d).kind.value
        return d.emulated_speed_factor != 1.0 or (kind is not None and kind != type_kind)

    @property
    def is_emulated(self) -> bool:
        """True if any device is emulated (see `device_is_emulated`)."""
        return any(self.device_is_emulated(d) for d in self.devices)

    def describe(self) -> str:
        """Human-readable inventory; emulated devices are labelled as such."""
        n_dev = len(self.devices)
        head = (f"Cluster: {len(self.hosts)} host(s), {n_dev} device(s), "
                f"inter-host {self.inter_bandwidth / 1e9:g} GB/s")
        if self.is_emulated:
            head += " [emulated: devices stand in for other device types on this machine]"
        lines = [head]
        for h in self.hosts:
            task = f" task={h.task[0]}:{h.task[1]}" if h.task else ""
            addr = f" at {h.address}" if h.address else ""
            lines.append(f"  {h.name}{task}{addr} (intra-host {h.intra_bandwidth / 1e9:g} GB/s)")
            if not h.devices:
                lines.append("    (no compute devices)")
            for d in h.devices:
                gib = self.memory_of(d) / 2**30
                note = ""
                if self.device_is_emulated(d):
                    note = f"  emulated, speed factor {d.emulated_speed_factor:g}"
                lines.append(f"    {d.name}: {d.type_name}, {gib:.1f} GiB, "
                             f"on {d.tf_device}{note}")
        return "\n".join(lines)

    # ----------------------------------------------------------- serialisation

    def to_dict(self) -> dict[str, Any]:
        """JSON-able form. Custom (non built-in) device types travel with the cluster."""
        custom = sorted({d.type_name for d in self.devices} - BUILTIN_TYPE_NAMES)
        return {
            "inter_bandwidth": self.inter_bandwidth,
            "hosts": [h.to_dict() for h in self.hosts],
            "device_types": [get_device_type(n).to_dict() for n in custom],
        }

    def to_json(self, indent: int | None = 2) -> str:
        """`to_dict` as a JSON string."""
        return json.dumps(self.to_dict(), indent=indent)

    @classmethod
    def from_dict(cls, d: Mapping[str, Any]) -> Cluster:
        """Inverse of `to_dict`. Custom device types in the dict are registered (an
        equal registration is a no-op; a conflicting one is an error)."""
        if not isinstance(d, Mapping):
            raise _bad("A cluster dict must be a mapping", f"d={d!r}",
                       "pass the output of Cluster.to_dict()")
        unknown = sorted(set(d) - {"inter_bandwidth", "hosts", "device_types"})
        if unknown or "hosts" not in d or "inter_bandwidth" not in d:
            raise _bad("A cluster dict needs 'hosts' and 'inter_bandwidth' (and optionally "
                       "'device_types') only", f"keys={sorted(d)}",
                       "pass the output of Cluster.to_dict()")
        for t in d.get("device_types") or ():
            register_device_type(DeviceType.from_dict(t))
        hosts = []
        for h in d["hosts"]:
            devices = tuple(
                Device(name=x["name"], type_name=x["type_name"], host=h["name"],
                       tf_device=x["tf_device"],
                       emulated_speed_factor=x.get("emulated_speed_factor", 1.0),
                       memory_bytes=x.get("memory_bytes"))
                for x in h.get("devices", ())
            )
            task = h.get("task")
            hosts.append(Host(name=h["name"], devices=devices,
                              intra_bandwidth=h["intra_bandwidth"],
                              task=tuple(task) if task is not None else None,
                              address=h.get("address")))
        return cls(hosts=tuple(hosts), inter_bandwidth=d["inter_bandwidth"])

    @classmethod
    def from_json(cls, path_or_str: str | os.PathLike[str]) -> Cluster:
        """Load from a JSON string (starting with '{') or from a JSON file path."""
        text = os.fspath(path_or_str)
        source = "the JSON string"
        if not text.lstrip().startswith("{"):
            source = repr(text)
            try:
                with open(text, encoding="utf-8") as f:
                    text = f.read()
            except (FileNotFoundError, IsADirectoryError, NotADirectoryError):
                raise _bad("No cluster JSON file at this path", f"path={source}",
                           "pass the path of a file written by Cluster.to_json (or a JSON "
                           "string starting with '{')") from None
        try:
            d = json.loads(text)
        except json.JSONDecodeError as e:
            raise _bad("A cluster file is not valid JSON", f"{source}: {e}",
                       "write it with Cluster.to_json") from None
        try:
            return cls.from_dict(d)
        except (KeyError, TypeError) as e:
            # A hand-written host or device entry without a required key.
            raise _bad("A cluster JSON entry is malformed", f"{source}: {type(e).__name__}: "
                       f"{e}", "give every host 'name', 'intra_bandwidth' and 'devices', and "
                       "every device 'name', 'type_name' and 'tf_device'") from None

    # ------------------------------------------------------ TensorFlow clusters

    @classmethod
    def from_tf_cluster_spec(
        cls,
        cluster_spec: Any,
        device_declarations: Mapping[TaskKey, Sequence[str]],
        *,
        inter_bandwidth: float = INFINIBAND_56G_BANDWIDTH,
        intra_bandwidth: float = PCIE3_X16_BANDWIDTH,
    ) -> Cluster:
        """Build a cluster from a TF cluster and declared device types per task.

        Args:
          cluster_spec: a dict {job: [address, ...] or {index: address}}, a
            `tf.train.ClusterSpec`, or a `ClusterResolver`.
          device_declarations: task -> list of device type names, the task given as
            "worker:1", "/job:worker/task:1" or ("worker", 1). Tasks without a declaration
            have no compute devices; "ps" tasks must have none. Devices of task
            (job, i) are placed on "/job:<job>/replica:0/task:<i>/device:<GPU|CPU>:<k>",
            numbered per kind in declaration order.
          inter_bandwidth: bytes/s between hosts (default: 56 Gb/s InfiniBand, Section 8.1).
          intra_bandwidth: bytes/s inside a host (default: PCIe 3.0 x16, 15.75 GB/s).

        Hosts are ordered chief, master, worker, other jobs by name, then ps; one host per
        task, named "<job><index>" (e.g. "worker1"); devices are named "worker1/gpu0".
        """
        hosts = tf_cluster.hosts_of_tf_cluster(cluster_spec, device_declarations,
                                               intra_bandwidth=intra_bandwidth)
        return cls(hosts=hosts, inter_bandwidth=inter_bandwidth)

    @classmethod
    def from_tf_config(
        cls,
        env: Mapping[str, str] | None = None,
        *,
        device_declarations: Mapping[TaskKey, Sequence[str]] | None = None,
    ) -> Cluster:
        """Build a cluster from the TF_CONFIG environment variable.

        TF_CONFIG's "cluster" gives the tasks. An optional "hetpipe" section gives
        {"devices": {"worker:0": ["TITAN_V", ...], ...}, "inter_bandwidth": float,
        "intra_bandwidth": float, "device_types": [DeviceType.to_dict(), ...]} (custom
        types are registered). `device_declarations` overrides "devices". Without any
        declaration every "worker" task gets the devices it reported to the chief
        (`hetpipe_tf.cluster.reports.collect`, at the chief's start in a cluster job),
        else one LOCAL_CPU device (its CPU:0), a worker on a machine like this one.
        """
        cluster_spec, declarations, bandwidths = tf_cluster.read_tf_config(
            env, device_declarations)
        return cls.from_tf_cluster_spec(cluster_spec, declarations, **bandwidths)

    # ---------------------------------------------------------------- emulation

    @classmethod
    def local(
        cls,
        device_types: Sequence[str | DeviceType] | Sequence[Sequence[str | DeviceType]],
        *,
        hosts: int = 1,
        emulated_speed_factors: Sequence[float] | Mapping[str, float] | None = None,
        intra_bandwidth: float = PCIE3_X16_BANDWIDTH,
        inter_bandwidth: float = INFINIBAND_56G_BANDWIDTH,
    ) -> Cluster:
        """Emulate a cluster on this machine: device i is the logical CPU "/device:CPU:i".

        Call `configure_logical_devices(len(cluster.devices))` before TensorFlow starts.
        The device types keep their catalog memory and speed for planning; the runtime
        slows device i down by `emulated_speed_factor` (see `relative_speed_factors` for
        factors proportional to the types' peak FLOP/s). The bandwidths default to the
        paper's links, i.e. the emulated network, not this machine's memory copies.

        Args:
          device_types: a flat list split into `hosts` equal contiguous groups, or one
            list per host.
          hosts: number of hosts for a flat list.
          emulated_speed_factors: one factor per device (flat order), or type name ->
            factor; None = 1.0 everywhere.
        """
        host_list = local.local_hosts(device_types, hosts=hosts,
                                      emulated_speed_factors=emulated_speed_factors,
                                      intra_bandwidth=intra_bandwidth)
        return cls(hosts=host_list, inter_bandwidth=inter_bandwidth)


def paper_cluster() -> Cluster:
    """The HetPipe paper's testbed (Section 8.1, Table 1): 4 hosts x 4 GPUs.

    host i is TF task ("worker", i) holding 4 GPUs of one type: TITAN_V, TITAN_RTX,
    RTX_2060, QUADRO_P4000; PCIe 3.0 x16 (15.75 GB/s) inside a host, 56 Gb/s InfiniBand
    (7e9 bytes/s) between hosts.
    """
    types = ("TITAN_V", "TITAN_RTX", "RTX_2060", "QUADRO_P4000")
    hosts = []
    for i, type_name in enumerate(types):
        name = f"host{i}"
        devices = tuple(
            Device(name=f"{name}/gpu{k}", type_name=type_name, host=name,
                   tf_device=f"/job:worker/replica:0/task:{i}/device:GPU:{k}")
            for k in range(4))
        hosts.append(Host(name=name, devices=devices, intra_bandwidth=PCIE3_X16_BANDWIDTH,
                          task=("worker", i)))
    return Cluster(hosts=tuple(hosts), inter_bandwidth=INFINIBAND_56G_BANDWIDTH)


def local_cluster(device_types, **kwargs) -> Cluster:
    """`Cluster.local` as a function."""
    return Cluster.local(device_types, **kwargs)


def cluster_from_tf_cluster_spec(cluster_spec: Any, device_declarations, **kwargs) -> Cluster:
    """`Cluster.from_tf_cluster_spec` as a function."""
    return Cluster.from_tf_cluster_spec(cluster_spec, device_declarations, **kwargs)


def cluster_from_tf_config(env: Mapping[str, str] | None = None, **kwargs) -> Cluster:
    """`Cluster.from_tf_config` as a function."""
    return Cluster.from_tf_config(env, **kwargs)
