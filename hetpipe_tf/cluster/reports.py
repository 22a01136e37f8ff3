"""The devices a TensorFlow server task reports, mapped to the device catalog.

TensorFlow's own worker service answers `/tensorflow.WorkerService/GetStatus` with a
`GetStatusResponse` whose `device_attributes` list every device of the task (name,
device_type, memory_limit, physical_device_desc: the GPU model for a GPU); the chief uses it
at start (`hetpipe_tf.cluster.roles.connect_chief`) to learn each worker's devices, so a
cluster job needs no declaration where the hosts' devices are real.

- `decode_status(raw)`: the response's devices (`ReportedDevice`), decoded with
  TensorFlow's `DeviceAttributes` proto. TensorFlow's pip package ships no `worker_pb2`, so
  the two messages of `worker.proto` this needs are described here over TensorFlow's
  `device_attributes.proto`, in a private descriptor pool.
- `catalog_types(task, devices)`: the catalog type names of a task's compute devices: its
  GPUs if it has any (a GPU named by a catalog type is that type, another GPU a generic
  type registered with its reported memory), else its CPUs, each `LOCAL_CPU` (TensorFlow
  reports 256 MiB for a CPU device, not the host's memory; LOCAL_CPU carries the memory
  measured on this machine). A task with neither is an error.
- `collect(cluster, deadline_s)` asks every worker task and keeps the answers for the
  cluster's description (`known_declarations`, read by `tf_cluster.default_declarations`);
  a declaration (TF_CONFIG's `hetpipe` devices, the launcher's `--devices_per_worker`)
  wins over them.
"""

from __future__ import annotations

import dataclasses
import functools
import re
import threading
from typing import Mapping, Sequence

from hetpipe_tf.cluster.catalog import (GIB, DeviceKind, DeviceType, canonical_type_name,
                                        get_device_type, known_device_types,
                                        register_device_type, LOCAL_CPU_NAME)

_METHOD = "/tensorflow.WorkerService/GetStatus"
REPORTED_JOBS = ("worker",)   # the tasks whose devices the planner uses (as declarations)

# A GPU the catalog does not know: its memory is reported, its compute is not. Assumed
# numbers of a mid-range data-centre GPU (T4-like); the planner's estimate for it is rough.
GENERIC_GPU_CORES = 2560
GENERIC_GPU_CLOCK_MHZ = 1590.0
GENERIC_GPU_BANDWIDTH = 320e9


@dataclasses.dataclass(frozen=True)
class ReportedDevice:
    """One device of a task, as its server reports it."""

    name: str                  # "/job:worker/replica:0/task:0/device:CPU:1"
    device_type: str           # "CPU", "GPU", ...
    memory_limit: int          # bytes
    physical_device_desc: str = ""

    @property
    def index(self) -> int:
        m = re.search(r":(\d+)$", self.name)
        return int(m.group(1)) if m else 0


@functools.cache
def _status_messages():
    """(GetStatusRequest, GetStatusResponse) classes of tensorflow/core/protobuf/worker.proto,
    over TensorFlow's DeviceAttributes, in a pool of their own."""
    from google.protobuf import descriptor_pb2, descriptor_pool, message_factory
    from tensorflow.core.framework import device_attributes_pb2

    pool = descriptor_pool.DescriptorPool()
    base = descriptor_pb2.FileDescriptorProto()
    device_attributes_pb2.DESCRIPTOR.CopyToProto(base)
    pool.Add(base)
    f = descriptor_pb2.FileDescriptorProto(name="hetpipe_tf/worker_get_status.proto",
                                           package="tensorflow", syntax="proto3",
                                           dependency=[base.name])
    f.message_type.add(name="GetStatusRequest")
    response = f.message_type.add(name="GetStatusResponse")
    response.field.add(name="device_attributes", number=1,
                       label=descriptor_pb2.FieldDescriptorProto.LABEL_REPEATED,
                       type=descriptor_pb2.FieldDescriptorProto.TYPE_MESSAGE,
                       type_name=".tensorflow.DeviceAttributes")
    pool.Add(f)
    return tuple(message_factory.GetMessageClass(pool.FindMessageTypeByName(
        f"tensorflow.{n}")) for n in ("GetStatusRequest", "GetStatusResponse"))


def decode_status(raw: bytes) -> tuple[ReportedDevice, ...]:
    """The devices of a serialized GetStatusResponse."""
    response = _status_messages()[1].FromString(raw)
    return tuple(ReportedDevice(d.name, d.device_type, int(d.memory_limit),
                                d.physical_device_desc) for d in response.device_attributes)


def encode_status(devices: Sequence[ReportedDevice]) -> bytes:
    """A serialized GetStatusResponse listing `devices` (the inverse of `decode_status`)."""
    response = _status_messages()[1]()
    for d in devices:
        response.device_attributes.add(name=d.name, device_type=d.device_type,
                                       memory_limit=d.memory_limit,
                                       physical_device_desc=d.physical_device_desc)
    return response.SerializeToString()


def gpu_model(physical_device_desc: str) -> str | None:
    """The model name in a GPU's description ("device: 0, name: NVIDIA TITAN V, pci bus
    id: ..." -> "NVIDIA TITAN V")."""
    m = re.search(r"(?:^|,)\s*name:\s*([^,]+)", physical_device_desc)
    return m.group(1).strip() if m and m.group(1).strip() else None


_generic: set[str] = set()   # catalog types registered here for GPUs the catalog lacked


def _catalog_name(model: str) -> str | None:
    """The catalog type of a GPU model name, if the catalog has it (also without the SXM
    form factor: "Tesla V100-SXM2-16GB" -> V100_16GB); not a generic type of this module."""
    known = set(known_device_types()) - _generic
    key = canonical_type_name(model)
    for candidate in (key, re.sub(r"_SXM\d*", "", key)):
        if candidate in known:
            return candidate
    return None


def _generic_gpu(model: str, memory: int, task: str) -> str:
    """Register (once) a catalog type for a GPU the catalog lacks, with its reported
    memory; its name is the model's, plus the memory when another type holds that name."""
    name = re.sub(r"[^A-Z0-9_]", "_", canonical_type_name(model)) or "GPU"
    memory = max(int(memory), 1)
    for candidate in (name, f"{name}_{memory // 2**20}MIB"):
        t = DeviceType(name=candidate, kind=DeviceKind.GPU, cores=GENERIC_GPU_CORES,
                       boost_clock_mhz=GENERIC_GPU_CLOCK_MHZ, memory_bytes=memory,
                       memory_bandwidth=GENERIC_GPU_BANDWIDTH,
                       description=f"{model} as reported by {task} ({memory / GIB:.1f} GiB); "
                                   "not in the catalog: compute numbers assumed")
        try:
            existing = get_device_type(candidate)
        except ValueError:
            _generic.add(candidate)
            return register_device_type(t).name
        if candidate in _generic and existing.memory_bytes == memory:
            return existing.name
    _generic.add(t.name)
    return register_device_type(t, overwrite=True).name


def catalog_types(task: str, address: str, devices: Sequence[ReportedDevice]
                  ) -> tuple[str, ...]:
    """The catalog type names of a task's compute devices, in TensorFlow's device order:
    its GPUs if it has any, else its CPUs (module docstring)."""
    gpus = sorted((d for d in devices if d.device_type == "GPU"), key=lambda d: d.index)
    cpus = sorted((d for d in devices if d.device_type == "CPU"), key=lambda d: d.index)
    if gpus:
        return tuple(_catalog_name(m) or _generic_gpu(m, d.memory_limit, task)
                     for d in gpus for m in [gpu_model(d.physical_device_desc) or "GPU"])
    if cpus:
        return (LOCAL_CPU_NAME,) * len(cpus)
    raise ValueError(
        f"Task {task} at {address} reported no CPU or GPU device. Received: devices="
        f"{[(d.name, d.device_type) for d in devices]}; declare its devices in TF_CONFIG's "
        "'hetpipe' section ({'devices': {'" + task + "': ['TITAN_V', ...]}}) or start its "
        "server with CPU or GPU devices.")


def request_devices(address: str, deadline_s: float) -> tuple[ReportedDevice, ...]:
    """Ask the server at `address` for its devices (one GetStatus RPC with a deadline)."""
    import grpc

    channel = grpc.insecure_channel(address, options=[("grpc.enable_retries", 0)])
    try:
        call = channel.unary_unary(_METHOD, request_serializer=None,
                                   response_deserializer=None)
        return decode_status(call(_status_messages()[0]().SerializeToString(),
                                  timeout=deadline_s))
    finally:
        channel.close()


_lock = threading.Lock()
_reported: dict[tuple[str, int, str], tuple[str, ...]] = {}   # (job, index, address) -> types


def collect(cluster: Mapping[str, Sequence[str]], deadline_s: float
            ) -> dict[str, tuple[str, ...]]:
    """Ask every worker task of `cluster` ({job: [address, ...]}) for its devices; keep and
    return {"worker:0": (type name, ...), ...}. A task that does not answer within
    `deadline_s` is named in a TaskUnreachableError."""
    import grpc

    from hetpipe_tf.cluster.probe import Health, TaskUnreachableError

    out = {}
    for job in REPORTED_JOBS:
        for index, address in enumerate(cluster.get(job, ())):
            task = f"{job}:{index}"
            try:
                devices = request_devices(address, deadline_s)
            except grpc.RpcError as e:
                silent = e.code() == grpc.StatusCode.DEADLINE_EXCEEDED
                raise TaskUnreachableError(task, address, Health.SILENT if silent
                                           else Health.REFUSED, deadline_s) from None
            out[task] = catalog_types(task, address, devices)
            with _lock:
                _reported[(job, index, address)] = out[task]
    return out


def known_declarations(jobs: Mapping[str, Mapping[int, str]]) -> dict[str, tuple[str, ...]] | None:
    """The reported devices of every worker task of `jobs` ({job: {index: address}}), or
    None unless each was reported (by `collect`)."""
    out = {}
    with _lock:
        for job in REPORTED_JOBS:
            for index, address in jobs.get(job, {}).items():
                got = _reported.get((job, index, address))
                if got is None:
                    return None
                out[f"{job}:{index}"] = got
    return out or None


def forget() -> None:
    """Drop every kept report (tests)."""
    with _lock:
        _reported.clear()
