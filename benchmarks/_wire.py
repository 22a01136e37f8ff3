"""What benchmarks/wire_speed.py and benchmarks/chief_cpu.py share: their MLP, the CPU time
of processes (/proc) and the counter of what a process asks TensorFlow to run."""

from __future__ import annotations

import os
import re
import sys

FEATURES, DEPTH = 1024, 4


def width(params: int) -> int:
    """The hidden width that gives `mlp` about `params` parameters."""
    # FEATURES*w + (DEPTH-1)*w^2 ~ params.
    a, b = DEPTH - 1, FEATURES
    return max(8, int((-b + (b * b + 4 * a * params) ** 0.5) / (2 * a)))


def cpu_seconds(pids) -> float:
    """User + system CPU seconds used so far by the processes `pids` (/proc/<pid>/stat)."""
    total = 0
    for pid in pids:
        with open(f"/proc/{pid}/stat") as f:
            fields = f.read().rsplit(")", 1)[1].split()
        total += int(fields[11]) + int(fields[12])   # utime, stime (fields 14 and 15)
    return total / os.sysconf("SC_CLK_TCK")


def _caller() -> str:
    f = sys._getframe(3)   # past count() and the patched function
    skip = r"/(tensorflow|keras|absl)/|compiled\.py|/_shim/|_tf_calls\.py"
    while f is not None and re.search(skip, f.f_code.co_filename):
        f = f.f_back
    if f is None:
        return "?"
    return f"{os.path.basename(f.f_code.co_filename)}:{f.f_lineno} {f.f_code.co_name}"


class CallCounter:
    """Counts what this process asks TensorFlow to run while `counting`: compiled calls
    (`execute.execute`, which every function call and slow-path op goes through), eager ops
    (the generated ops' fast path) and host reads (`.numpy()`), each by op name
    (`_tf_calls.observe_tf_calls`). On the chief of a cluster job nearly each is a remote call
    (a request and a wait)."""

    def __init__(self):
        from benchmarks import _tf_calls

        self.counts: dict[tuple[str, str], int] = {}
        self.counting = False
        self.where = False   # also key by the calling line outside TensorFlow and Keras

        def count(kind: str, name) -> None:
            if self.counting:
                name = name if isinstance(name, str) else str(name)
                if self.where:
                    name += " @ " + _caller()
                key = (kind, name)
                self.counts[key] = self.counts.get(key, 0) + 1

        _tf_calls.observe_tf_calls(count)

    def by_kind(self) -> dict[str, int]:
        out: dict[str, int] = {}
        for (kind, _), c in self.counts.items():
            out[kind] = out.get(kind, 0) + c
        return out


def mlp(keras, width: int, name: str):
    """The MLP of the wire benchmarks: FEATURES inputs, DEPTH Dense(width) + Dense(10)."""
    inp = keras.Input((FEATURES,))
    h = inp
    for i in range(DEPTH):
        h = keras.layers.Dense(width, activation="relu", name=f"d{i}")(h)
    return keras.Model(inp, keras.layers.Dense(10, name="out")(h), name=name)
