r"""Serve one task of a TF cluster: a `tf.distribute.Server` for a worker or ps task.

In a TF_CONFIG-driven job every process runs the same program; the chief drives training
(it owns the parameter-server variables and every virtual worker) and the other tasks only
serve TensorFlow's gRPC runtime:

  TF_CONFIG='{"cluster": {...}, "task": {"type": "ps", "index": 0}}' \
      python -m hetpipe_tf.cluster.serve

With task names as arguments (`python -m hetpipe_tf.cluster.serve worker:0 ps:0`), one
process serves each named task of TF_CONFIG's cluster (TF_CONFIG's "task" is then unused):
one TensorFlow start-up for several tasks.

`start_local_servers` starts such processes on 127.0.0.1 with free ports (tests, and
trying a cluster layout on one machine) and stops them by their process ids. By default
every task has a process of its own; `own_process` names the tasks that need one (those a
test kills or freezes) and the others share a single process. They are forks of one
process that imported TensorFlow once (`hetpipe_tf.cluster.forked`): a server starts in
about 0.1 CPU-second instead of a TensorFlow start's 7.
"""

from __future__ import annotations

import contextlib
import dataclasses
import json
import os
import signal
import socket
import sys
import threading
from typing import Collection, Iterator, Mapping, Sequence

from hetpipe_tf.cluster import forked
from hetpipe_tf.cluster.lifetime import stop_processes


def serve(cluster: Mapping[str, Sequence[str]], job: str, task: int) -> None:
    """Run the server of task (job, task) of `cluster` until the process is stopped (what
    `HetPipeStrategy(...)` does in a worker or ps process, hetpipe_tf/cluster/roles.py)."""
    from hetpipe_tf.cluster.roles import Role, Task, serve_forever

    role = Role.PS if job == "ps" else Role.WORKER
    serve_forever(Task(role, job, task, {j: list(a) for j, a in cluster.items()}))


def serve_several(cluster: Mapping[str, Sequence[str]], tasks: Sequence[tuple[str, int]]
                  ) -> None:
    """Run a server for each (job, task) of `tasks` in this process until it is stopped:
    each its own `tf.distribute.Server` (its own gRPC port, devices and thread pools)."""
    import tensorflow  # noqa: F401  (imported once, before the serving threads)

    for job, index in tasks:
        threading.Thread(target=serve, args=(cluster, job, index), daemon=True,
                         name=f"serve-{job}:{index}").start()
    threading.Event().wait()   # until a signal ends the process


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
    # The serving process of each task, in the order of `jobs` and then task index (e.g.
    # worker 0, worker 1, ps 0); tasks that share a process repeat its pid.
    pids: tuple[int, ...]
    tasks: tuple[str, ...] = ()   # the served tasks ("worker:0", ...), in the order of pids

    def pid_of(self, task: str) -> int:
        """The pid of the process serving `task` ("worker:1")."""
        return self.pids[self.tasks.index(task)]


@contextlib.contextmanager
def start_local_servers(jobs: Mapping[str, int], client_job: str = "chief", *,
                        own_process: Collection[str] | None = None
                        ) -> Iterator[LocalServers]:
    """Start server processes for the tasks of `jobs` (e.g. {"worker": 2, "ps": 1}) on
    127.0.0.1. The cluster also names one `client_job` task (the calling process connects
    as it). `own_process`: None gives every task a process of its own; a collection of task
    names ("worker:1") gives those a process each and serves all other tasks in one shared
    process. Every process is stopped on exit, also on error."""
    counts = {client_job: 1, **dict(jobs)}
    ports = iter(free_ports(sum(counts.values())))
    cluster = {job: [f"127.0.0.1:{next(ports)}" for _ in range(n)] for job, n in counts.items()}
    names = [f"{job}:{i}" for job, n in jobs.items() for i in range(n)]
    alone = set(names if own_process is None else own_process)
    if not alone <= set(names):
        raise ValueError(f"own_process names tasks that are not in the cluster. Received: "
                         f"own_process={sorted(alone - set(names))}; tasks are {names}.")
    shared = [name for name in names if name not in alone]
    groups = [[name] for name in names if name in alone] + ([shared] if shared else [])
    pids: dict[str, int] = {}
    try:
        for group in groups:
            pid = forked.start(cluster, group)
            pids.update({name: pid for name in group})
        yield LocalServers(cluster, tuple(pids[name] for name in names), tuple(names))
    finally:
        distinct = sorted(set(pids.values()))
        stop_processes(distinct, grace_s=30, first=signal.SIGKILL)   # stopped ones too
        for pid in distinct:   # reaped by the kernel, not only exited
            forked.wait_gone(pid)


def without_scikit_learn() -> None:
    """`import tensorflow` loads Keras, which imports scikit-learn when it is installed
    (for its scikit-learn wrappers): about a quarter of a TensorFlow start's CPU (`python
    -X importtime -c "import tensorflow"`). A server never uses Keras, so its process
    keeps scikit-learn out; Keras goes on as without it (its import is optional there).
    A scikit-learn already imported stays."""
    sys.modules.setdefault("sklearn", None)   # None: `import sklearn` raises ImportError


def main(argv: Sequence[str] = ()) -> None:
    without_scikit_learn()
    config = os.environ.get("TF_CONFIG")
    if not config:
        raise SystemExit("hetpipe_tf.cluster.serve needs TF_CONFIG with 'cluster' and 'task'. "
                         "Received: TF_CONFIG unset; set it as for any TF cluster job.")
    spec = json.loads(config)
    if argv:   # several tasks of the cluster, named "job:index"
        tasks = []
        for name in argv:
            job, _, index = name.partition(":")
            if job in ("chief", "master") or job not in spec["cluster"] or not index.isdigit() \
                    or int(index) >= len(spec["cluster"][job]):
                raise SystemExit(f"Each argument names a worker or ps task of TF_CONFIG's "
                                 f"cluster as job:index. Received: {name!r}; the cluster is "
                                 f"{spec['cluster']!r}.")
            tasks.append((job, int(index)))
        serve_several(spec["cluster"], tasks)
        return
    task = spec.get("task", {})
    if task.get("type") in (None, "chief", "master"):
        raise SystemExit("The chief drives training and is not served by this module. "
                         f"Received: task={task!r}; run the training program for the chief.")
    serve(spec["cluster"], task["type"], int(task.get("index", 0)))


if __name__ == "__main__":
    main(sys.argv[1:])
