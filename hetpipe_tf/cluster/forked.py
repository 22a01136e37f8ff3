"""Server processes forked from one that imported TensorFlow once (`start_local_servers`).

A TensorFlow start costs about 7 CPU-seconds (`import tensorflow`, Keras with it), and a
server needs nothing that import does not load; started by `python -m ...`, each server
pays it. Here one helper process per client (`python -m hetpipe_tf.cluster.forked`, the
"zygote") imports TensorFlow once, without scikit-learn (`serve.without_scikit_learn`),
and forks each server on request: the import does not initialise TensorFlow's runtime
(no context, devices or thread pools), so the child starts its own as a fresh process
does, in about 0.1 CPU-second.

The zygote reads requests from a pipe of its client and exits when that pipe ends: the
client exited or was killed (the kernel closes the client's end, also after SIGKILL),
whichever of its threads started the zygote. Every server dies with the zygote
(parent-death signal). The zygote and each server lead process groups of their own (a
terminal's Ctrl-C reaches only the client, which stops them). A server is found, frozen
and killed by its pid (`os.kill`); `wait_gone` waits until it is reaped. `stop()` ends
the zygote by its pid (also at the client's exit). The multiprocessing module's
"forkserver" does the same but imports the client's `__main__` module again in every
child.
"""

from __future__ import annotations

import atexit
import json
import os
import signal
import subprocess
import sys
import threading
import time

from hetpipe_tf.cluster.lifetime import die_with_parent

_lock = threading.Lock()
_zygote: subprocess.Popen | None = None


def start(cluster: dict, tasks: list[str]) -> int:
    """Fork a process serving `tasks` ("worker:0", ...) of `cluster`; its pid."""
    global _zygote
    with _lock:
        if _zygote is None or _zygote.poll() is not None:
            _zygote = subprocess.Popen(
                [sys.executable, "-m", "hetpipe_tf.cluster.forked"],
                env={**os.environ, "TF_CPP_MIN_LOG_LEVEL": "3"}, stdin=subprocess.PIPE,
                stdout=subprocess.PIPE, stderr=subprocess.DEVNULL, text=True,
                process_group=0)   # not a parent-death signal: it follows the thread
        _zygote.stdin.write(json.dumps({"cluster": cluster, "tasks": tasks}) + "\n")
        _zygote.stdin.flush()
        line = _zygote.stdout.readline()
    if not line.strip().isdigit():
        raise RuntimeError(f"The server zygote (hetpipe_tf.cluster.forked) did not fork a "
                           f"server. Received: {line!r} for tasks={tasks}; its errors show "
                           f"with `python -m hetpipe_tf.cluster.forked < /dev/null`.")
    return int(line)


def wait_gone(pid: int, timeout_s: float = 30.0) -> bool:
    """Wait until process `pid` is gone, reaped (by the kernel: the zygote ignores SIGCHLD)
    and not only a zombie; True if it is."""
    deadline = time.monotonic() + timeout_s
    while time.monotonic() < deadline:
        try:
            os.kill(pid, 0)
        except ProcessLookupError:
            return True
        time.sleep(0.01)
    return False


def zygote_pid() -> int | None:
    """The pid of this process's zygote while it runs, else None."""
    z = _zygote
    return z.pid if z is not None and z.poll() is None else None


def stop() -> None:
    """End this process's zygote (by its pid) and reap it; its servers die with it."""
    global _zygote
    with _lock:
        z, _zygote = _zygote, None
    if z is not None and z.poll() is None:
        z.kill()
        z.wait(timeout=30)


atexit.register(stop)


def _serve_requests() -> None:
    """The zygote: TensorFlow imported once, then one fork per request line."""
    from hetpipe_tf.cluster import serve

    serve.without_scikit_learn()
    import tensorflow  # noqa: F401  (the point of this process)

    signal.signal(signal.SIGCHLD, signal.SIG_IGN)   # children are reaped by the kernel
    for line in sys.stdin:
        request = json.loads(line)
        pid = os.fork()
        if pid == 0:
            _child(request["cluster"], request["tasks"])
        print(pid, flush=True)


def _child(cluster: dict, tasks: list[str]) -> None:
    """A forked server: no inherited streams (a pipe held open by a server would outlive its
    reader), its own process group (a terminal's Ctrl-C reaches only the client), death
    with the zygote, then serve as `python -m hetpipe_tf.cluster.serve tasks...` does."""
    try:
        signal.signal(signal.SIGCHLD, signal.SIG_DFL)
        devnull = os.open(os.devnull, os.O_RDWR)
        for fd in (0, 1, 2):
            os.dup2(devnull, fd)
        os.setpgid(0, 0)
        die_with_parent(signal.SIGKILL)
        from hetpipe_tf.cluster import serve

        job, index = tasks[0].split(":")
        os.environ["TF_CONFIG"] = json.dumps({"cluster": cluster,
                                              "task": {"type": job, "index": int(index)}})
        serve.main(tasks if len(tasks) > 1 else ())
    finally:
        os._exit(1)   # never back into the zygote's loop


if __name__ == "__main__":
    _serve_requests()
