"""CPU time and blocking of this process's threads, read from /proc (Linux): what the
benchmarks and probes use to say which threads (Keras' main thread, stage threads,
TensorFlow's op pools, gRPC) spent a run's CPU and how often each blocked."""

from __future__ import annotations

import os
import threading
from typing import Callable


def _by_name(read: Callable[[str], tuple[str, float]],
             native_label: str | None) -> dict[str, float]:
    """`read(tid)` -> (kernel name, value) of each live thread, summed by name: the Python
    thread's name where there is one, else the kernel's; `native_label` names the native
    threads that kept the process's own name (None keeps it)."""
    names = {str(t.native_id): t.name for t in threading.enumerate()}
    with open("/proc/self/comm") as f:
        own = f.read().strip()
    out: dict[str, float] = {}
    for tid in os.listdir("/proc/self/task"):
        try:
            comm, value = read(tid)
        except (OSError, LookupError, ValueError):   # it ended meanwhile (gone, or read empty)
            continue
        if native_label is not None and tid not in names and comm == own:
            comm = native_label
        name = names.get(tid, comm)
        out[name] = out.get(name, 0.0) + value
    return out


def thread_cpu(native_label: str | None = None) -> dict[str, float]:
    """CPU seconds so far (user + system) of this process's live threads, summed by name:
    the Python thread's name where there is one, else the kernel's (TensorFlow names its
    own threads, e.g. `tf_Compute`). `native_label`: the name given to native threads
    that kept the process's own name (e.g. "(unnamed native threads)"); None keeps it."""
    tick = os.sysconf("SC_CLK_TCK")

    def read(tid: str) -> tuple[str, float]:
        with open(f"/proc/self/task/{tid}/stat") as f:
            stat = f.read()
        comm = stat[stat.index("(") + 1:stat.rindex(")")]   # the name may hold spaces
        fields = stat[stat.rindex(")") + 2:].split()
        return comm, (int(fields[11]) + int(fields[12])) / tick

    return _by_name(read, native_label)


def thread_switches(native_label: str | None = None) -> dict[str, float]:
    """Voluntary context switches so far of this process's live threads (each time one
    blocked: a wait for a lock, a hand-off, a reply), summed by name as `thread_cpu`."""

    def read(tid: str) -> tuple[str, float]:
        with open(f"/proc/self/task/{tid}/status") as f:
            status = dict(line.split(":", 1) for line in f if ":" in line)
        return status["Name"].strip(), float(status["voluntary_ctxt_switches"])

    return _by_name(read, native_label)
