"""The role of this process in a cluster job, and what each role does at start.

Every process of a job runs the user's program (TensorFlow's own convention); its role
comes from TF_CONFIG's "task" or from a ClusterResolver's task_type/task_id:

- worker, ps: `serve_forever` starts a `tf.distribute.Server` with the devices the task
  declares (K CPU-kind devices, e.g. LOCAL_CPU standing in for GPUs, -> K CPU devices of
  the server) and blocks until the process is stopped; it never returns.
- chief (or master): `connect_chief` probes every other task within `timeout_s`
  (`probe.wait_until_reachable`: a task nobody serves is named before training), asks
  the worker tasks for their devices unless TF_CONFIG declares them
  (`reports.collect`: the cluster's description is built from what they report), then
  connects this process to the cluster (`tf.config.experimental_connect_to_cluster`,
  job "chief"), unless it already is.
- no task (a local job, or a cluster value that names no task): nothing to do.

`find_task(cluster)` reads the role; `dispatch(cluster, timeout_s)` does the above.
"""

from __future__ import annotations

import dataclasses
import enum
import os
import sys
from typing import Any, Mapping

from hetpipe_tf.cluster.lifetime import LAUNCHED_ENV, die_with_parent
from hetpipe_tf.cluster.tf_validation import load_tf_config, validate_jobs, validate_task

# Servers of an in-process cluster hang unless each has more inter-op threads than the
# stages that run on it at once (DESIGN.md); 8 covers small jobs.
INTER_OP_THREADS = 8


class Role(enum.Enum):
    CHIEF = "chief"
    WORKER = "worker"
    PS = "ps"
    LOCAL = "local"


@dataclasses.dataclass(frozen=True)
class Task:
    """This process's task in `cluster` ({job: [address, ...]}) and what it declares."""

    role: Role
    job: str
    index: int
    cluster: dict[str, list[str]]
    declared_devices: tuple[str, ...] = ()
    declares_devices: bool = False   # TF_CONFIG's "hetpipe" section declares any task's

    @property
    def name(self) -> str:
        return f"{self.job}:{self.index}"

    def others(self) -> dict[str, str]:
        """{"worker:0": address, ...} of every other task."""
        return {f"{j}:{i}": a for j, tasks in self.cluster.items()
                for i, a in enumerate(tasks) if (j, i) != (self.job, self.index)}


_ROLES = {"chief": Role.CHIEF, "master": Role.CHIEF, "worker": Role.WORKER, "ps": Role.PS}


def _as_lists(spec: Mapping[str, Any]) -> dict[str, list[str]]:
    out = {}
    for job, tasks in spec.items():
        if isinstance(tasks, Mapping):
            tasks = [tasks[k] for k in sorted(tasks, key=int)]
        out[job] = list(tasks)
    return out


def find_task(cluster: Any = None, env: Mapping[str, str] | None = None) -> Task | None:
    """This process's task: from a ClusterResolver that names one, else from TF_CONFIG's
    "task" when `cluster` is None or a TF cluster value; None for a local job."""
    env = os.environ if env is None else env
    if callable(getattr(cluster, "cluster_spec", None)) and getattr(cluster, "task_type", None):
        spec = _as_lists(cluster.cluster_spec().as_dict())
        job, index, declared = cluster.task_type, int(cluster.task_id or 0), {}
    else:
        raw = env.get("TF_CONFIG")
        if not raw or not (cluster is None or _is_tf_cluster(cluster)):
            return None
        config = load_tf_config(raw)
        task = config.get("task") or {}
        if not task.get("type"):
            return None
        spec = _as_lists(config.get("cluster") or {})
        job, index = task["type"], task.get("index", 0)
        declared = (config.get("hetpipe") or {}).get("devices") or {}
    jobs = {j: dict(enumerate(t)) for j, t in spec.items()}
    validate_jobs(jobs)
    validate_task(jobs, job, index)
    if job not in _ROLES:
        return None   # e.g. an evaluator: the program decides
    devices = ()
    for key, types in declared.items():
        if key in (f"{job}:{index}", f"/job:{job}/task:{index}",
                   f"/job:{job}/replica:0/task:{index}"):
            devices = tuple(types)
    return Task(_ROLES[job], job, index, spec, devices, declares_devices=bool(declared))


def _is_tf_cluster(cluster: Any) -> bool:
    """A Cluster built from a TF cluster (its hosts name TF tasks), a dict or ClusterSpec."""
    hosts = getattr(cluster, "hosts", None)
    if hosts is not None:
        return any(getattr(h, "task", None) for h in hosts)
    return callable(getattr(cluster, "as_dict", None)) or (
        isinstance(cluster, Mapping) and "hosts" not in cluster)


def serve_forever(task: Task) -> None:
    """Serve `task` (a worker or ps) with TensorFlow's gRPC server; never returns."""
    if os.environ.get(LAUNCHED_ENV):
        die_with_parent()   # also when the program runs under a shell wrapper
    import tensorflow as tf

    config = tf.compat.v1.ConfigProto(inter_op_parallelism_threads=INTER_OP_THREADS)
    # The server makes its devices from its own ConfigProto (the Python context's
    # logical-device configuration does not reach it): K declared CPU devices -> K CPUs.
    cpus = sum(1 for t in task.declared_devices if _is_cpu_type(t))
    if cpus > 1:
        config.device_count["CPU"] = cpus
    server = tf.distribute.Server(tf.train.ClusterSpec(task.cluster), job_name=task.job,
                                  task_index=task.index, protocol="grpc", config=config,
                                  start=True)
    print(f"hetpipe_tf: {task.name} serving at {task.cluster[task.job][task.index]}",
          file=sys.stderr, flush=True)
    server.join()
    sys.exit(0)


def _is_cpu_type(type_name: str) -> bool:
    from hetpipe_tf.cluster.catalog import DeviceKind, get_device_type

    return get_device_type(type_name).kind is DeviceKind.CPU


def connected_to_cluster() -> bool:
    """Whether this process's TensorFlow context is connected to a cluster."""
    import tensorflow as tf

    # Unconnected, devices are named "/device:CPU:0"; connected, "/job:chief/.../CPU:0".
    return any(d.name.startswith("/job:") and not d.name.startswith("/job:localhost/")
               for d in tf.config.list_logical_devices())


def connect_chief(task: Task, timeout_s: float) -> None:
    """Probe every other task within `timeout_s`, ask the workers for their devices (none
    declared), then connect this process as the chief."""
    from hetpipe_tf.cluster.probe import wait_until_reachable

    if os.environ.get(LAUNCHED_ENV):
        die_with_parent()
    wait_until_reachable(task.others(), timeout_s)
    if not task.declares_devices:   # a declaration wins over the hosts' reports
        from hetpipe_tf.cluster.reports import collect

        collect(task.cluster, timeout_s)
    # Keras' epoch-end tf_sync() calls context.async_wait(), which syncs every remote task
    # and never returns once one is lost. Our runtimes drain their own work explicitly
    # before an epoch ends, so that sync is redundant: turn it into a no-op as TensorFlow's
    # ParameterServerStrategyV2 does for its cluster (docs/cluster_jobs.md).
    os.environ["TF_PS_DISABLE_ASYNC_EXECUTOR_GLOBALLY"] = "True"
    if connected_to_cluster():
        return
    import tensorflow as tf

    resolver = tf.distribute.cluster_resolver.SimpleClusterResolver(
        tf.train.ClusterSpec(task.cluster), task_type=task.job, task_id=task.index,
        rpc_layer="grpc")
    tf.config.experimental_connect_to_cluster(resolver, job_name=task.job,
                                              make_master_device_default=False)


def dispatch(cluster: Any, timeout_s: float, env: Mapping[str, str] | None = None
             ) -> Task | None:
    """Do what this process's role asks at start (module docstring); returns the task
    (None for a local job) in the chief, never returns in a worker or ps."""
    task = find_task(cluster, env)
    if task is None:
        return None
    if task.role in (Role.WORKER, Role.PS):
        serve_forever(task)
    connect_chief(task, timeout_s)
    return task
