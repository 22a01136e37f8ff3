"""Shared by tests/ps/test_faults.py and test_continue.py (a module of its own so that
Bazel's py_test of each file finds it in the folder's `helpers` library): a listener that
never answers, and the chief of a cluster fit (tests/ps/chief_faults.py) run as a
subprocess."""

import json
import socket
import subprocess
import sys
import tempfile

from hetpipe_tf.cluster.probe import wait_until_reachable
from tests.benchmarks.binaries import ROOT


def silent_listener():
    """A socket that accepts TCP connections (the kernel does) but never answers: what a
    frozen process looks like from outside."""
    s = socket.socket()
    s.bind(("127.0.0.1", 0))
    s.listen(16)
    return s, f"127.0.0.1:{s.getsockname()[1]}"


# The chief's batch size (tests/ps/chief_faults.py): an epoch of `samples` has
# samples // BATCH batches.
BATCH = 8


def run_chief(cluster, victim_pid, sig, timeout_s=3.0, on_fault="stop", at_batch=8,
              epochs=1, checkpoint=None, plans=None, stall_dump_s=None, at_epoch_end=False,
              samples=512):
    args = {"cluster": cluster, "victim_pid": victim_pid, "signal": sig, "on_fault": on_fault,
            "timeout_s": timeout_s, "at_batch": at_batch, "epochs": epochs, "samples": samples,
            "plans": plans, "stall_dump_s": stall_dump_s, "at_epoch_end": at_epoch_end}
    if checkpoint:
        args["checkpoint"] = str(checkpoint)
    # Servers that start slowly on a loaded machine are not the fault under test: the chief
    # starts once every server answers (its own start-up check waits fault_timeout_s).
    wait_until_reachable({f"{job}:{i}": a for job, addresses in cluster.items()
                          if job != "chief" for i, a in enumerate(addresses)}, timeout_s=240)
    proc = subprocess.run([sys.executable, "-m", "tests.ps.chief_faults", json.dumps(args)],
                          cwd=ROOT, capture_output=True, text=True, timeout=300)
    if proc.returncode != 0:
        # The whole stderr (a hang's thread stacks are long) goes to a file the message names.
        with tempfile.NamedTemporaryFile("w", prefix="hetpipe_chief_", suffix=".stderr",
                                         delete=False) as f:
            f.write(proc.stderr)
        raise AssertionError(f"chief exited {proc.returncode}; its stderr is in {f.name}; "
                             f"the end:\n{proc.stderr[-4000:]}")
    out = json.loads(proc.stdout.strip().splitlines()[-1])
    out["stderr"] = proc.stderr   # warnings (logging) go there
    return out
