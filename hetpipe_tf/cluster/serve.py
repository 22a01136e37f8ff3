r"""Serve one task of a TF cluster: a `tf.distribute.Server` for a worker or ps task.

In a TF_CONFIG-driven job every process runs the same program; the chief drives training
(it owns the parameter-server variables and every virtual worker) and the other tasks only
serve TensorFlow's gRPC runtime:

  TF_CONFIG='{"cluster": {...}, "task": {"type": "ps", "index": 0}}' \
      python -m hetpipe_tf.cluster.serve

`start_local_servers` starts such processes on 127.0.0.1 with free ports (tests, and
trying a cluster layout on one machine) and stops them by their process ids.
"""

from __future__ import annotations

import contextlib
import dataclasses
import json
import os
import signal
import socket
import subprocess
import sys
from typing import Iterator, Mapping, Sequence

from hetpipe_tf.cluster.lifetime import child_preexec


def serve(cluster: Mapping[str, Sequence[str]], job: str, task: int) -> None:
    """Run the server of task (job, task) of `cluster` until the process is stopped (what
    `HetPipeStrategy(...)` does in a worker or ps process, hetpipe_tf/cluster/roles.py)."""
    from hetpipe_tf.cluster.roles import Role, Task, serve_forever

    role = Role.PS if job == "ps" else Role.WORKER
    serve_forever(Task(role, job, task, {j: list(a) for j, a in cluster.items()}))


def free_ports(n: int) -> list[int]:
    """n distinct free TCP ports on 127.0.0.1 (bound once, then released)."""
    socks, ports = [], []
    try:
        for _ in range(n):
            s = socket.socket()
            s.bind(("127.0.0.1", 0))
            socks.append(s)
            ports.append(s.getsockname()[1])
    finally:
        for s in socks:
            s.close()
    return ports


@dataclasses.dataclass(frozen=True)
class LocalServers:
    """A cluster of server processes on 127.0.0.1: the cluster dict and their pids."""

    cluster: dict[str, list[str]]
    pids: tuple[int, ...]


@contextlib.contextmanager
def start_local_servers(jobs: Mapping[str, int], client_job: str = "chief"
                        ) -> Iterator[LocalServers]:
    """Start a server process per task of `jobs` (e.g. {"worker": 2, "ps": 1}) on
    127.0.0.1. The cluster also names one `client_job` task (the calling process connects
    as it). Every process is stopped on exit, also on error."""
    counts = {client_job: 1, **dict(jobs)}
    ports = iter(free_ports(sum(counts.values())))
    cluster = {job: [f"127.0.0.1:{next(ports)}" for _ in range(n)] for job, n in counts.items()}
    procs: list[subprocess.Popen] = []
    try:
        for job, n in jobs.items():
            for i in range(n):
                env = {**os.environ, "TF_CPP_MIN_LOG_LEVEL": "3", "TF_CONFIG": json.dumps(
                    {"cluster": cluster, "task": {"type": job, "index": i}})}
                # No inherited stdout: a pipe held open by a server would outlive the test.
                # The kernel kills the server if this process dies without cleaning up.
                procs.append(subprocess.Popen(
                    [sys.executable, "-m", "hetpipe_tf.cluster.serve"], env=env,
                    stdin=subprocess.DEVNULL, stdout=subprocess.DEVNULL,
                    stderr=subprocess.DEVNULL, preexec_fn=child_preexec(os.getpid())))
        yield LocalServers(cluster, tuple(p.pid for p in procs))
    finally:
        for p in procs:
            p.kill()
            p.send_signal(signal.SIGCONT)   # a stopped (SIGSTOP) server is killed too
        for p in procs:
            p.wait(timeout=30)


def main() -> None:
    config = os.environ.get("TF_CONFIG")
    if not config:
        raise SystemExit("hetpipe_tf.cluster.serve needs TF_CONFIG with 'cluster' and 'task'. "
                         "Received: TF_CONFIG unset; set it as for any TF cluster job.")
    spec = json.loads(config)
    task = spec.get("task", {})
    if task.get("type") in (None, "chief", "master"):
        raise SystemExit("The chief drives training and is not served by this module. "
                         f"Received: task={task!r}; run the training program for the chief.")
    serve(spec["cluster"], task["type"], int(task.get("index", 0)))


if __name__ == "__main__":
    main()
