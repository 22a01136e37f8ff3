"""TensorFlow clusters: a `Cluster` from a ClusterSpec, a ClusterResolver or TF_CONFIG.

The hosts of `Cluster.from_tf_cluster_spec` and the reading of TF_CONFIG for
`Cluster.from_tf_config` (both in `spec.py`), and the parsing they need. A TF cluster lists tasks, not devices: a chief cannot
know the GPUs of a remote task before connecting to it, so every task's devices are
declared by type name ("worker:0": ["TITAN_V", ...]), or reported by the tasks' servers
once the chief reached them (`hetpipe_tf.cluster.reports`); a declaration wins. The
result has one `Host` per TF task, ordered chief, master, worker, other jobs by name,
then ps.
"""

from __future__ import annotations

import logging
import os
import re
from typing import Any, Mapping, Sequence

from hetpipe_tf.cluster.catalog import DeviceType, get_device_type, register_device_type
from hetpipe_tf.cluster.devices import (
    _JOB_ORDER,
    _PS_JOB,
    INFINIBAND_56G_BANDWIDTH,
    PCIE3_X16_BANDWIDTH,
    Device,
    Host,
    TaskKey,
)
from hetpipe_tf.cluster.errors import invalid as _bad
from hetpipe_tf.cluster.tf_validation import load_tf_config, validate_jobs, validate_task


logger = logging.getLogger(__name__)


def default_declarations(cluster_spec: Any) -> dict[TaskKey, list[str]]:
    """Without declarations: the devices every "worker" task reported to the chief
    (`reports.collect`, at the chief's start), else one LOCAL_CPU device (its CPU:0) a
    worker, a worker on a machine like this one."""
    from hetpipe_tf.cluster import reports

    jobs = _cluster_spec_as_dict(cluster_spec)
    reported = reports.known_declarations(jobs)
    if reported is not None:
        logger.info("hetpipe_tf: the cluster's devices as the hosts reported them: %s",
                    reported)
        return {k: list(v) for k, v in reported.items()}
    logger.info("hetpipe_tf: no device declared or reported: one LOCAL_CPU a worker task")
    return {("worker", i): ["LOCAL_CPU"] for i in jobs.get("worker", {})}


def hosts_of_tf_cluster(
    cluster_spec: Any,
    device_declarations: Mapping[TaskKey, Sequence[str]],
    *,
    intra_bandwidth: float = PCIE3_X16_BANDWIDTH,
) -> tuple[Host, ...]:
    """The hosts of `Cluster.from_tf_cluster_spec` (arguments as there)."""
    jobs = _cluster_spec_as_dict(cluster_spec)
    declared = _normalise_declarations(device_declarations, jobs)
    order = sorted(jobs, key=lambda j: (_JOB_ORDER.get(j, 3 if j != _PS_JOB else 4), j))
    hosts = []
    for job in order:
        for index in sorted(jobs[job]):
            host_name = f"{job}{index}"
            counters: dict[str, int] = {}
            devices = []
            for type_name in declared.get((job, index), ()):
                kind = get_device_type(type_name).kind.value
                k = counters.get(kind, 0)
                counters[kind] = k + 1
                devices.append(Device(
                    name=f"{host_name}/{kind.lower()}{k}",
                    type_name=type_name,
                    host=host_name,
                    tf_device=f"/job:{job}/replica:0/task:{index}/device:{kind}:{k}",
                ))
            hosts.append(Host(name=host_name, devices=tuple(devices),
                              intra_bandwidth=intra_bandwidth, task=(job, index),
                              address=jobs[job][index]))
    return tuple(hosts)


def read_tf_config(
    env: Mapping[str, str] | None = None,
    device_declarations: Mapping[TaskKey, Sequence[str]] | None = None,
) -> tuple[Any, Mapping[TaskKey, Sequence[str]], dict[str, float]]:
    """What `Cluster.from_tf_config` (see there) hands to `Cluster.from_tf_cluster_spec`:
    TF_CONFIG's cluster, the device declarations and the bandwidths, checked."""
    env = os.environ if env is None else env
    raw = env.get("TF_CONFIG")
    if not raw:
        raise _bad("TF_CONFIG is not set", "TF_CONFIG=None",
                   "set it to JSON with a 'cluster' entry, or use from_tf_cluster_spec")
    config = load_tf_config(raw)
    if not config.get("cluster"):
        raise _bad("TF_CONFIG has no 'cluster' entry", f"TF_CONFIG={raw!r}",
                   "add 'cluster': {job: [addresses]}")
    task = config.get("task")
    if task:
        jobs = _cluster_spec_as_dict(config["cluster"])
        validate_task(jobs, task.get("type"), task.get("index", 0))
    section = config.get("hetpipe") or {}
    for t in section.get("device_types") or ():
        register_device_type(DeviceType.from_dict(t))
    declarations = device_declarations
    if declarations is None:
        declarations = section.get("devices")
        if declarations is not None:
            logger.info("hetpipe_tf: the cluster's devices as TF_CONFIG declares them "
                        "(reports of the hosts not used): %s", declarations)
    if declarations is None:
        declarations = default_declarations(config["cluster"])
    return config["cluster"], declarations, {
        "inter_bandwidth": section.get("inter_bandwidth", INFINIBAND_56G_BANDWIDTH),
        "intra_bandwidth": section.get("intra_bandwidth", PCIE3_X16_BANDWIDTH)}


def _cluster_spec_as_dict(cluster_spec: Any) -> dict[str, dict[int, str]]:
    """job -> {task index: address} from a dict, ClusterSpec or ClusterResolver."""
    spec = cluster_spec
    if callable(getattr(spec, "cluster_spec", None)):  # a ClusterResolver
        spec = spec.cluster_spec()
    if callable(getattr(spec, "as_dict", None)):  # a tf.train.ClusterSpec
        spec = spec.as_dict()
    if not isinstance(spec, Mapping) or not spec:
        raise _bad("The cluster spec must be a non-empty dict, tf.train.ClusterSpec or "
                   "ClusterResolver", f"cluster_spec={cluster_spec!r}",
                   "pass e.g. {'worker': ['localhost:2222']}")
    jobs: dict[str, dict[int, str]] = {}
    for job, tasks in spec.items():
        if isinstance(tasks, Mapping):
            entries = {int(k): v for k, v in tasks.items()}
        elif isinstance(tasks, (list, tuple)):
            entries = dict(enumerate(tasks))
        else:
            raise _bad(f"Tasks of job {job!r} must be a list or a dict of addresses",
                       f"{job}={tasks!r}", "pass e.g. ['host:2222', 'host:2223']")
        if not isinstance(job, str) or not job:
            raise _bad("Job names must be non-empty strings", f"job={job!r}",
                       "use e.g. 'worker'")
        jobs[job] = dict(entries.items())
    validate_jobs(jobs)
    return jobs


_TASK_PATTERNS = (
    re.compile(r"^/?job:(?P<job>[\w\-]+)(?:/replica:\d+)?/task:(?P<index>\d+)$"),
    re.compile(r"^(?P<job>[\w\-]+):(?P<index>\d+)$"),
)


def _parse_task_key(key: TaskKey) -> tuple[str, int]:
    if isinstance(key, tuple) and len(key) == 2 and isinstance(key[0], str):
        try:
            return key[0], int(key[1])
        except (TypeError, ValueError):
            pass
    if isinstance(key, str):
        for pattern in _TASK_PATTERNS:
            m = pattern.match(key.strip())
            if m:
                return m.group("job"), int(m.group("index"))
    raise _bad("Cannot read a task from a device declaration key", f"key={key!r}",
               "use 'worker:0', '/job:worker/task:0' or ('worker', 0)")


def _normalise_declarations(
    declarations: Mapping[TaskKey, Sequence[str]],
    jobs: Mapping[str, Mapping[int, str]],
) -> dict[tuple[str, int], tuple[str, ...]]:
    if not isinstance(declarations, Mapping):
        raise _bad("Device declarations must be a mapping from task to type names",
                   f"device_declarations={declarations!r}",
                   "pass e.g. {'worker:0': ['TITAN_V', 'TITAN_V']}")
    out: dict[tuple[str, int], tuple[str, ...]] = {}
    for key, types in declarations.items():
        job, index = _parse_task_key(key)
        if job not in jobs or index not in jobs[job]:
            known = [f"{j}:{i}" for j in sorted(jobs) for i in sorted(jobs[j])]
            raise _bad("A device declaration names a task that is not in the cluster spec",
                       f"task={job}:{index}", f"declare devices for one of {known}")
        if (job, index) in out:
            raise _bad("A task is declared twice", f"task={job}:{index}",
                       "declare each task once")
        if isinstance(types, str) or not isinstance(types, Sequence):
            raise _bad(f"Devices of {job}:{index} must be a list of type names",
                       f"devices={types!r}", "pass e.g. ['TITAN_V', 'TITAN_V']")
        if job == _PS_JOB and types:
            raise _bad("Parameter-server tasks carry no compute devices",
                       f"task={job}:{index}, devices={list(types)!r}",
                       "declare devices for worker or chief tasks only")
        out[(job, index)] = tuple(get_device_type(t).name for t in types)
    return out
