"""CPU time of this process's threads, read from /proc (Linux): what the benchmarks and
probes use to say which threads (Keras' main thread, stage threads, TensorFlow's op pools,
gRPC) spent a run's CPU."""

from __future__ import annotations

import os
import threading


def thread_cpu(native_label: str | None = None) -> dict[str, float]:
    """CPU seconds so far (user + system) of this process's live threads, summed by name:
    the Python thread's name where there is one, else the kernel's (TensorFlow names its
    own threads, e.g. `tf_Compute`). `native_label`: the name given to native threads
    that kept the process's own name (e.g. "(unnamed native threads)"); None keeps it."""
    names = {str(t.native_id): t.name for t in threading.enumerate()}
    tick = os.sysconf("SC_CLK_TCK")
    with open("/proc/self/comm") as f:
        own = f.read().strip()
    out: dict[str, float] = {}
    for tid in os.listdir("/proc/self/task"):
        try:
            with open(f"/proc/self/task/{tid}/stat") as f:
                stat = f.read()
        except OSError:   # the thread ended meanwhile
            continue
        comm = stat[stat.index("(") + 1:stat.rindex(")")]   # the name may hold spaces
        fields = stat[stat.rindex(")") + 2:].split()
        if native_label is not None and tid not in names and comm == own:
            comm = native_label
        name = names.get(tid, comm)
        out[name] = out.get(name, 0.0) + (int(fields[11]) + int(fields[12])) / tick
    return out
