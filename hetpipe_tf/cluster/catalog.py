"""Device catalog: the hardware specification of every device type a cluster may hold.

A `DeviceType` is what the partitioner needs to estimate layer times on a device that
is not at hand (peak FP32 throughput, memory bandwidth, a fixed cost per layer task) and
to check that a stage fits (memory size). The catalog is keyed by upper-snake-case names
("TITAN_V"); lookups accept the spellings people write ("TITAN V", "GeForce RTX 2060").

Units: bytes are ``int``; bandwidths are bytes/second with 1 GB/s = 1e9 bytes/s (the
unit of the HetPipe paper's Table 1 and of vendor data sheets); GPU memory sizes are in
GiB (2**30 bytes), because "12 GB" on a GPU data sheet is 12 GiB of DRAM.

Built-in types: the four GPUs of the paper's Table 1, a set of current GPUs (SXM
variants where a GPU comes in several; FP32 peak without tensor cores, from NVIDIA data
sheets), and ``LOCAL_CPU``, the machine this process runs on.
"""

from __future__ import annotations

import dataclasses
import enum
import math
import numbers
import os
import re
import threading
from typing import Any, Mapping

GIB = 2**30
GB_PER_S = 1e9

# Fixed cost of launching one layer's forward+backward task on a GPU (kernel launches,
# framework dispatch); an estimate, calibrated away when layers are measured.
GPU_LAUNCH_OVERHEAD_S = 10e-6
# TensorFlow's per-op dispatch on CPU is a few microseconds; a layer is several ops.
CPU_LAUNCH_OVERHEAD_S = 20e-6

# Assumptions for LOCAL_CPU (the machine's true numbers are not discoverable portably):
# one 256-bit FMA per cycle per core = 8 fp32 lanes x 2 FLOP, conservative for AVX2 and
# AVX-512 machines; and the bandwidth of roughly one DDR4 channel for the whole socket.
ASSUMED_CPU_FLOPS_PER_CYCLE_PER_CORE = 16
ASSUMED_CPU_MEMORY_BANDWIDTH = 10e9
ASSUMED_CPU_CLOCK_MHZ = 2000.0

LOCAL_CPU_NAME = "LOCAL_CPU"

_NAME_PATTERN = re.compile(r"^[A-Z0-9_]+$")


class DeviceKind(enum.Enum):
    """Whether a device type is a GPU or a CPU."""

    GPU = "GPU"
    CPU = "CPU"


def canonical_type_name(name: str) -> str:
    """Return the catalog key for a spelling of a device type name.

    Upper case, runs of spaces and dashes become "_", and vendor or brand prefixes that
    people add or drop ("NVIDIA", "GeForce", "Tesla") are removed:
    "GeForce RTX 2060" -> "RTX_2060", "titan v" -> "TITAN_V".
    """
    if not isinstance(name, str) or not name.strip():
        raise ValueError(
            "A device type name must be a non-empty string. "
            f"Received: name={name!r}; pass a name such as 'TITAN_V'."
        )
    key = re.sub(r"[\s\-]+", "_", name.strip().upper())
    for prefix in ("NVIDIA_", "GEFORCE_", "TESLA_"):
        if key.startswith(prefix) and len(key) > len(prefix):
            key = key[len(prefix):]
    return key


def _check_positive(owner: str, field: str, value: Any, *, integer: bool = False) -> None:
    kind = "an int" if integer else "a number"
    ok = isinstance(value, numbers.Integral if integer else numbers.Real)
    if isinstance(value, bool) or not ok or not math.isfinite(value) or value <= 0:
        raise ValueError(
            f"{owner}: {field} must be {kind} > 0. Received: {field}={value!r}; "
            f"pass a positive finite value."
        )


@dataclasses.dataclass(frozen=True)
class DeviceType:
    """The hardware specification of one kind of device.

    Attributes:
      name: catalog key, upper snake case ("TITAN_V").
      kind: GPU or CPU.
      cores: CUDA cores for a GPU, logical cores for a CPU.
      boost_clock_mhz: boost clock in MHz.
      memory_bytes: device memory in bytes (GPU data-sheet "GB" are GiB, 2**30 bytes).
      memory_bandwidth: device memory bandwidth in bytes/s (1 GB/s = 1e9 bytes/s).
      peak_flops: peak FP32 FLOP/s without tensor cores; for a GPU it defaults to
        cores x clock x 2 (one fused multiply-add per core per cycle). Required for CPUs.
      launch_overhead_s: fixed seconds per layer task (launch and dispatch cost).
      description: free text (architecture, variant, source of the numbers).
      year: market release year, or None.
    """

    name: str
    kind: DeviceKind
    cores: int
    boost_clock_mhz: float
    memory_bytes: int
    memory_bandwidth: float
    peak_flops: float | None = None
    launch_overhead_s: float = GPU_LAUNCH_OVERHEAD_S
    description: str = ""
    year: int | None = None

    def __post_init__(self) -> None:
        if not isinstance(self.name, str) or not _NAME_PATTERN.match(self.name):
            suggestion = (
                canonical_type_name(self.name)
                if isinstance(self.name, str) and self.name.strip()
                else "MY_GPU"
            )
            raise ValueError(
                "DeviceType name must be upper snake case (A-Z, 0-9, _). "
                f"Received: name={self.name!r}; use e.g. name={suggestion!r}."
            )
        owner = f"DeviceType {self.name}"
        if not isinstance(self.kind, DeviceKind):
            raise ValueError(
                f"{owner}: kind must be a DeviceKind. Received: kind={self.kind!r}; "
                "pass DeviceKind.GPU or DeviceKind.CPU."
            )
        _check_positive(owner, "cores", self.cores, integer=True)
        _check_positive(owner, "boost_clock_mhz", self.boost_clock_mhz)
        _check_positive(owner, "memory_bytes", self.memory_bytes, integer=True)
        _check_positive(owner, "memory_bandwidth", self.memory_bandwidth)
        if self.peak_flops is None:
            if self.kind is not DeviceKind.GPU:
                raise ValueError(
                    f"{owner}: peak_flops is required for a CPU type (no generic rule "
                    f"derives it). Received: peak_flops=None; pass the FP32 FLOP/s."
                )
            # One FMA (2 FLOP) per CUDA core per cycle: the data-sheet FP32 peak.
            object.__setattr__(
                self, "peak_flops", float(self.cores * self.boost_clock_mhz * 1e6 * 2)
            )
        _check_positive(owner, "peak_flops", self.peak_flops)
        if (
            isinstance(self.launch_overhead_s, bool)
            or not isinstance(self.launch_overhead_s, numbers.Real)
            or not math.isfinite(self.launch_overhead_s)
            or self.launch_overhead_s < 0
        ):
            raise ValueError(
                f"{owner}: launch_overhead_s must be a number >= 0. "
                f"Received: launch_overhead_s={self.launch_overhead_s!r}; "
                "pass seconds per layer task, e.g. 10e-6."
            )
        if self.year is not None and (
            isinstance(self.year, bool) or not isinstance(self.year, numbers.Integral)
        ):
            raise ValueError(
                f"{owner}: year must be an int or None. Received: year={self.year!r}; "
                "pass e.g. year=2020."
            )

    def to_dict(self) -> dict[str, Any]:
        """JSON-able form; `from_dict` restores an equal value."""
        d = dataclasses.asdict(self)
        d["kind"] = self.kind.value
        return d

    @classmethod
    def from_dict(cls, d: Mapping[str, Any]) -> DeviceType:
        """Inverse of `to_dict`."""
        fields = {f.name for f in dataclasses.fields(cls)}
        unknown = sorted(set(d) - fields)
        if unknown:
            raise ValueError(
                f"Unknown DeviceType keys. Received: keys={unknown}; "
                f"use only {sorted(fields)}."
            )
        kwargs = dict(d)
        try:
            kwargs["kind"] = DeviceKind(str(d.get("kind", "")).upper())
        except ValueError:
            raise ValueError(
                f"DeviceType kind must be 'GPU' or 'CPU'. Received: kind={d.get('kind')!r}; "
                "fix the 'kind' entry."
            ) from None
        return cls(**kwargs)


def _gpu(name: str, cores: int, clock_mhz: float, mem_gib: int, bw_gb_s: float,
         year: int, description: str) -> DeviceType:
    return DeviceType(
        name=name,
        kind=DeviceKind.GPU,
        cores=cores,
        boost_clock_mhz=float(clock_mhz),
        memory_bytes=mem_gib * GIB,
        memory_bandwidth=bw_gb_s * GB_PER_S,
        launch_overhead_s=GPU_LAUNCH_OVERHEAD_S,
        description=description,
        year=year,
    )


# Table 1 of the HetPipe paper (ATC'20), exactly.
PAPER_GPU_TYPES: tuple[DeviceType, ...] = (
    _gpu("TITAN_V", 5120, 1455, 12, 653, 2017, "NVIDIA TITAN V (Volta); paper Table 1"),
    _gpu("TITAN_RTX", 4608, 1770, 24, 672, 2018, "NVIDIA TITAN RTX (Turing); paper Table 1"),
    _gpu("RTX_2060", 1920, 1680, 6, 336, 2019,
         "NVIDIA GeForce RTX 2060 (Turing); paper Table 1"),
    _gpu("QUADRO_P4000", 1792, 1480, 8, 243, 2017,
         "NVIDIA Quadro P4000 (Pascal); paper Table 1"),
)

# Current GPUs, NVIDIA data-sheet numbers. Where a GPU ships in SXM and PCIe forms the
# SXM numbers are used; register a PCIe variant yourself if you have one.
CURRENT_GPU_TYPES: tuple[DeviceType, ...] = (
    _gpu("V100_16GB", 5120, 1530, 16, 900, 2017, "NVIDIA Tesla V100 SXM2 16 GB (Volta)"),
    _gpu("V100_32GB", 5120, 1530, 32, 900, 2018, "NVIDIA Tesla V100 SXM2 32 GB (Volta)"),
    _gpu("A100_40GB", 6912, 1410, 40, 1555, 2020, "NVIDIA A100 SXM4 40 GB (Ampere)"),
    _gpu("A100_80GB", 6912, 1410, 80, 2039, 2020, "NVIDIA A100 SXM4 80 GB (Ampere)"),
    _gpu("H100_SXM", 16896, 1980, 80, 3350, 2022, "NVIDIA H100 SXM5 80 GB (Hopper)"),
    _gpu("RTX_3090", 10496, 1695, 24, 936, 2020, "NVIDIA GeForce RTX 3090 (Ampere)"),
    _gpu("RTX_4090", 16384, 2520, 24, 1008, 2022, "NVIDIA GeForce RTX 4090 (Ada)"),
    _gpu("A10", 9216, 1695, 24, 600, 2021, "NVIDIA A10 PCIe (Ampere)"),
    _gpu("T4", 2560, 1590, 16, 320, 2018, "NVIDIA T4 (Turing)"),
    _gpu("L4", 7424, 2040, 24, 300, 2023, "NVIDIA L4 (Ada)"),
)


def _local_cpu_cores() -> int:
    # Cores this process may run on (containers and taskset restrict os.cpu_count()).
    if hasattr(os, "sched_getaffinity"):
        return max(1, len(os.sched_getaffinity(0)))
    return max(1, os.cpu_count() or 1)


def _local_clock_mhz() -> float:
    try:
        import psutil  # optional dependency

        freq = psutil.cpu_freq()
        if freq is not None:
            mhz = freq.max or freq.current
            if mhz and mhz > 0:
                return float(mhz)
    except Exception:  # psutil missing or unsupported on this platform
        pass
    try:
        with open("/proc/cpuinfo", encoding="ascii", errors="replace") as f:
            for line in f:
                if line.lower().startswith("cpu mhz"):
                    return float(line.split(":", 1)[1])
    except (OSError, ValueError):
        pass
    return ASSUMED_CPU_CLOCK_MHZ


def _local_memory_bytes() -> int:
    try:
        pages = os.sysconf("SC_PHYS_PAGES")
        page_size = os.sysconf("SC_PAGE_SIZE")
        if pages > 0 and page_size > 0:
            return int(pages * page_size)
    except (AttributeError, ValueError, OSError):
        pass
    try:
        with open("/proc/meminfo", encoding="ascii") as f:
            for line in f:
                if line.startswith("MemTotal:"):
                    return int(line.split()[1]) * 1024
    except (OSError, ValueError, IndexError):
        pass
    raise RuntimeError(
        "Cannot determine this machine's memory size. Received: no os.sysconf and no "
        "/proc/meminfo; register a CPU DeviceType named 'LOCAL_CPU' with "
        "register_device_type(..., overwrite=True)."
    )


def _build_local_cpu_type() -> DeviceType:
    cores = _local_cpu_cores()
    clock = _local_clock_mhz()
    return DeviceType(
        name=LOCAL_CPU_NAME,
        kind=DeviceKind.CPU,
        cores=cores,
        boost_clock_mhz=clock,
        memory_bytes=_local_memory_bytes(),
        memory_bandwidth=ASSUMED_CPU_MEMORY_BANDWIDTH,
        peak_flops=float(cores * clock * 1e6 * ASSUMED_CPU_FLOPS_PER_CYCLE_PER_CORE),
        launch_overhead_s=CPU_LAUNCH_OVERHEAD_S,
        description=(
            "This machine's CPU. Cores, clock and memory are measured; peak_flops assumes "
            f"{ASSUMED_CPU_FLOPS_PER_CYCLE_PER_CORE} FP32 FLOP/cycle/core and "
            f"memory_bandwidth assumes {ASSUMED_CPU_MEMORY_BANDWIDTH / GB_PER_S:g} GB/s "
            "(conservative assumptions, not measurements)."
        ),
        year=None,
    )


LOCAL_CPU: DeviceType = _build_local_cpu_type()

BUILTIN_TYPE_NAMES: frozenset[str] = frozenset(
    t.name for t in PAPER_GPU_TYPES + CURRENT_GPU_TYPES + (LOCAL_CPU,)
)

_lock = threading.Lock()
_registry: dict[str, DeviceType] = {
    t.name: t for t in PAPER_GPU_TYPES + CURRENT_GPU_TYPES + (LOCAL_CPU,)
}


def get_device_type(name: str) -> DeviceType:
    """Look a device type up by name, case-insensitively ("TITAN V" -> TITAN_V)."""
    key = canonical_type_name(name)
    with _lock:
        found = _registry.get(key)
        known = sorted(_registry)
    if found is None:
        raise ValueError(
            f"Unknown device type. Received: name={name!r}; use one of {known} "
            "or add it with register_device_type(DeviceType(...))."
        )
    return found


def register_device_type(device_type: DeviceType, *, overwrite: bool = False) -> DeviceType:
    """Add a device type to the catalog (process-wide) and return it.

    Registering a type equal to the one already present is a no-op, so that every
    process of a cluster may register the same custom types. A different type under an
    existing name is an error unless ``overwrite=True``.
    """
    if not isinstance(device_type, DeviceType):
        raise ValueError(
            "register_device_type takes a DeviceType. "
            f"Received: device_type={device_type!r}; build one with DeviceType(...)."
        )
    with _lock:
        existing = _registry.get(device_type.name)
        if existing is not None and existing != device_type and not overwrite:
            raise ValueError(
                f"Device type {device_type.name} is already registered with different "
                f"values. Received: device_type={device_type!r}; existing={existing!r}; "
                "choose another name or pass overwrite=True."
            )
        _registry[device_type.name] = device_type
    return device_type


def known_device_types() -> tuple[str, ...]:
    """Names of every registered device type, sorted."""
    with _lock:
        return tuple(sorted(_registry))


def local_cpu_type() -> DeviceType:
    """The registered ``LOCAL_CPU`` type (this machine, unless a user overwrote it)."""
    return get_device_type(LOCAL_CPU_NAME)
