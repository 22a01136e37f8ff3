"""The devices and hosts of a cluster, and the links' default bandwidths.

A `Device` is one compute device (its catalog type, its TensorFlow device string, an
emulated speed factor); a `Host` is one TF task with its devices and its intra-host link.
`hetpipe_tf.cluster.spec.Cluster` puts hosts together; both are importable from there.
"""

from __future__ import annotations

import dataclasses
import math
import numbers
import re
from typing import Any, Union

from hetpipe_tf._args import check_int
from hetpipe_tf.cluster.catalog import canonical_type_name
from hetpipe_tf.cluster.errors import invalid as _bad


# Section 8.1 of the HetPipe paper: PCIe 3.0 x16 inside a node, 56 Gb/s InfiniBand between.
PCIE3_X16_BANDWIDTH = 15.75e9
INFINIBAND_56G_BANDWIDTH = 56e9 / 8

# Job order of hosts (and so of `Cluster.devices`): the chief first, parameter servers last.
_JOB_ORDER = {"chief": 0, "master": 1, "worker": 2}
_PS_JOB = "ps"

DeviceRef = Union["Device", str]
TaskKey = Union[str, tuple[str, int]]


def _check_bandwidth(field: str, value: Any) -> None:
    if (
        isinstance(value, bool)
        or not isinstance(value, numbers.Real)
        or not math.isfinite(value)
        or value <= 0
    ):
        raise _bad(f"{field} must be a number > 0 (bytes/s)", f"{field}={value!r}",
                   "pass a positive bandwidth, e.g. 15.75e9 for PCIe 3.0 x16")


_DEVICE_KIND_PATTERN = re.compile(r"(?:device:)?(CPU|GPU|XLA_CPU|XLA_GPU|TPU):\d+$", re.I)


def tf_device_kind(tf_device: str) -> str | None:
    """'GPU' or 'CPU' for a TF device string ("/job:w/task:0/device:GPU:1"), else None."""
    m = _DEVICE_KIND_PATTERN.search(tf_device)
    if m is None:
        return None
    return m.group(1).upper().replace("XLA_", "")


@dataclasses.dataclass(frozen=True)
class Device:
    """One compute device of a cluster.

    Attributes:
      name: unique in the cluster, e.g. "host0/gpu0".
      type_name: catalog key of its `DeviceType` (spellings like "TITAN V" are
        normalised to "TITAN_V").
      host: name of the `Host` it belongs to.
      tf_device: the TensorFlow device string stages are placed on.
      emulated_speed_factor: 1.0 = real speed; 0.5 = the runtime emulates a device of half
        the speed (emulation only: a real device is never made slower on purpose).
      memory_bytes: usable memory, or None for the type's full memory.
    """

    name: str
    type_name: str
    host: str
    tf_device: str
    emulated_speed_factor: float = 1.0
    memory_bytes: int | None = None

    def __post_init__(self) -> None:
        for field in ("name", "host", "tf_device"):
            value = getattr(self, field)
            if not isinstance(value, str) or not value:
                raise _bad(f"Device {field} must be a non-empty string",
                           f"{field}={value!r}", f"pass a {field} string")
        if not self.tf_device.startswith("/"):
            raise _bad("Device tf_device must be a TensorFlow device string",
                       f"tf_device={self.tf_device!r}",
                       "use e.g. '/job:worker/replica:0/task:0/device:GPU:0'")
        object.__setattr__(self, "type_name", canonical_type_name(self.type_name))
        f = self.emulated_speed_factor
        if (isinstance(f, bool) or not isinstance(f, numbers.Real)
                or not math.isfinite(f) or f <= 0):
            raise _bad(f"Device {self.name}: emulated_speed_factor must be > 0",
                       f"emulated_speed_factor={f!r}",
                       "use 1.0 for real speed or e.g. 0.5 for half speed")
        object.__setattr__(self, "emulated_speed_factor", float(f))
        if self.memory_bytes is not None:
            object.__setattr__(self, "memory_bytes", check_int(
                "memory_bytes", self.memory_bytes, minimum=1,
                hint=f"pass Device {self.name} bytes, or None for the type's memory"))

    def to_dict(self) -> dict[str, Any]:
        """JSON-able form (the host is implied by the enclosing host entry)."""
        return {
            "name": self.name,
            "type_name": self.type_name,
            "tf_device": self.tf_device,
            "emulated_speed_factor": self.emulated_speed_factor,
            "memory_bytes": self.memory_bytes,
        }


@dataclasses.dataclass(frozen=True)
class Host:
    """A node: one TF task (process) with its devices.

    Attributes:
      name: unique in the cluster ("worker0", "host1").
      devices: the devices on this host; a parameter-server task has none.
      intra_bandwidth: bytes/s of the link between devices of this host (PCIe).
      task: the TF (job, task index) address, or None for an emulated host.
      address: "hostname:port" of the task, when known (tells which tasks share a machine).
    """

    name: str
    devices: tuple[Device, ...]
    intra_bandwidth: float
    task: tuple[str, int] | None = None
    address: str | None = None

    def __post_init__(self) -> None:
        if not isinstance(self.name, str) or not self.name:
            raise _bad("Host name must be a non-empty string", f"name={self.name!r}",
                       "pass a name such as 'host0'")
        devices = tuple(self.devices)
        for d in devices:
            if not isinstance(d, Device):
                raise _bad(f"Host {self.name}: devices must be Device values",
                           f"device={d!r}", "build them with Device(...)")
            if d.host != self.name:
                raise _bad(f"Device {d.name} names another host than the one holding it",
                           f"device.host={d.host!r}, host={self.name!r}",
                           "set Device.host to the enclosing Host's name")
        object.__setattr__(self, "devices", devices)
        _check_bandwidth("intra_bandwidth", self.intra_bandwidth)
        object.__setattr__(self, "intra_bandwidth", float(self.intra_bandwidth))
        if self.task is not None:
            task = tuple(self.task)
            if (len(task) != 2 or not isinstance(task[0], str) or not task[0]
                    or isinstance(task[1], bool) or not isinstance(task[1], numbers.Integral)
                    or task[1] < 0):
                raise _bad(f"Host {self.name}: task must be a (job, index) pair",
                           f"task={self.task!r}", "pass e.g. ('worker', 0) or None")
            object.__setattr__(self, "task", (task[0], int(task[1])))

    def to_dict(self) -> dict[str, Any]:
        """JSON-able form."""
        return {
            "name": self.name,
            "intra_bandwidth": self.intra_bandwidth,
            "task": list(self.task) if self.task is not None else None,
            "address": self.address,
            "devices": [d.to_dict() for d in self.devices],
        }
