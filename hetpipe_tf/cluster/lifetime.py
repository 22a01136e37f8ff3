"""Processes that never outlive the job: parent-death signals, process groups, stop by pid.

- `die_with_parent()`: the kernel sends this process a signal when its parent dies, also
  by SIGKILL (Linux `prctl(PR_SET_PDEATHSIG)`, through ctypes; elsewhere a no-op that
  returns False). Used in the launcher's children before `exec` (`child_preexec`) and by a
  process of a launched job itself (`HETPIPE_TF_LAUNCHED` set), so that a program run
  through a shell wrapper still dies with the wrapper.
- `stop_processes(pids)`: SIGTERM (or a given first signal) to each process group,
  a grace period, then SIGKILL to whatever is left; by process id only.
"""

from __future__ import annotations

import ctypes
import ctypes.util
import os
import signal
import sys
import time
from typing import Callable, Iterable, Sequence

PR_SET_PDEATHSIG = 1
LAUNCHED_ENV = "HETPIPE_TF_LAUNCHED"   # the launcher sets it to its own pid in children


def die_with_parent(sig: int = signal.SIGKILL) -> bool:
    """Ask the kernel to send `sig` to this process when its parent exits; True if set."""
    if not sys.platform.startswith("linux"):
        return False
    libc = ctypes.CDLL(ctypes.util.find_library("c") or "libc.so.6", use_errno=True)
    return libc.prctl(PR_SET_PDEATHSIG, int(sig), 0, 0, 0) == 0


def child_preexec(parent_pid: int) -> Callable[[], None]:
    """A Popen `preexec_fn`: own process group (stopped as one, and a terminal's Ctrl-C
    reaches only the launcher, which stops the job in order), death with the parent,
    and exit at once if the parent already died before the signal was armed."""
    def preexec() -> None:
        os.setpgid(0, 0)
        die_with_parent(signal.SIGKILL)
        if os.getppid() != parent_pid:
            os._exit(1)
    return preexec


def alive(pid: int) -> bool:
    """Whether process `pid` exists and is not a zombie."""
    try:
        with open(f"/proc/{pid}/stat") as f:
            return f.read().rsplit(")", 1)[1].split()[0] != "Z"
    except (FileNotFoundError, ProcessLookupError, IndexError):
        return False
    except OSError:
        try:
            os.kill(pid, 0)
            return True
        except ProcessLookupError:
            return False


def _signal_group(pid: int, sig: int) -> None:
    for send in (lambda: os.killpg(pid, sig), lambda: os.kill(pid, sig)):
        try:
            send()
        except (ProcessLookupError, PermissionError):
            pass


def stop_processes(pids: Sequence[int], grace_s: float = 5.0,
                   first: int | Iterable[int] = signal.SIGTERM,
                   reap: Callable[[int], None] | None = None) -> None:
    """Stop every process of `pids` (and its process group, when it leads one): `first`
    (one signal, or one per pid), up to `grace_s` for them to exit, then SIGKILL and
    SIGCONT (a stopped process is killed too). `reap(pid)` collects an exited child."""
    firsts = [first] * len(pids) if isinstance(first, int) else list(first)
    for pid, sig in zip(pids, firsts):
        _signal_group(pid, sig)
    deadline = time.monotonic() + grace_s
    while time.monotonic() < deadline:
        if reap is not None:
            for pid in pids:
                reap(pid)
        if not any(alive(p) for p in pids):
            return
        time.sleep(0.05)
    for pid in pids:
        _signal_group(pid, signal.SIGKILL)
        _signal_group(pid, signal.SIGCONT)
    if reap is not None:
        for pid in pids:
            reap(pid)
