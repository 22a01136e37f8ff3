"""Checks of a TensorFlow cluster spec before anything starts (no TensorFlow needed).

`validate_jobs` checks the {job: {task index: address}} form that `tf_cluster` parses every
cluster spec into: job names TensorFlow's strategies know, "host:port" addresses with a
port in 1..65535, no address given to two tasks, at most one chief. `validate_task` checks
a (job, index) against it (TF_CONFIG's "task", a ClusterResolver's task). `load_tf_config`
reads TF_CONFIG's JSON (an error names TF_CONFIG and where the JSON breaks) and the types
of its entries. Each error says the value received and how to fix it, before a server or a
connection is attempted.
"""

from __future__ import annotations

import ipaddress
import json
import re
from typing import Any, Mapping

from hetpipe_tf._args import check_int
from hetpipe_tf.cluster.errors import invalid as _bad

# The job names TensorFlow's multi-worker and parameter-server strategies use.
KNOWN_JOBS = ("chief", "master", "worker", "ps", "evaluator")
HETPIPE_ENTRIES = ("devices", "inter_bandwidth", "intra_bandwidth", "device_types")
_HOSTNAME = re.compile(r"^(?=.{1,253}$)[A-Za-z0-9_](?:[A-Za-z0-9_\-]{0,62})"
                       r"(?:\.[A-Za-z0-9_](?:[A-Za-z0-9_\-]{0,62}))*\.?$")


def _excerpt(raw: str, pos: int, width: int = 40) -> str:
    """`raw` (repr), or for a long one the part around `pos` with ... on the cut sides."""
    if len(raw) <= 2 * width + 20:
        return repr(raw)
    lo, hi = max(0, pos - width), min(len(raw), pos + width)
    return ("..." if lo else "") + repr(raw[lo:hi]) + ("..." if hi < len(raw) else "")


def load_tf_config(raw: str) -> dict[str, Any]:
    """TF_CONFIG's JSON as a dict whose "cluster", "task" and "hetpipe" entries (each
    optional here) are JSON objects; ValueError naming TF_CONFIG otherwise."""
    try:
        config = json.loads(raw)
    except json.JSONDecodeError as e:
        raise _bad(f"TF_CONFIG is not valid JSON: {e.msg} at line {e.lineno} column "
                   f"{e.colno} (char {e.pos})", f"TF_CONFIG={_excerpt(raw, e.pos)}",
                   'fix the JSON (double quotes around names and strings), e.g. '
                   '{"cluster": {"worker": ["host:2222"]}, "task": {"type": "worker", '
                   '"index": 0}}') from None
    if not isinstance(config, dict):
        raise _bad("TF_CONFIG must be a JSON object", f"TF_CONFIG={_excerpt(raw, 0)}",
                   'write e.g. {"cluster": {...}, "task": {"type": "worker", "index": 0}}')
    examples = {"cluster": '{"worker": ["host:2222"]}',
                "task": '{"type": "worker", "index": 0}', "hetpipe": '{"devices": {...}}'}
    for key, example in examples.items():
        if config.get(key) is not None and not isinstance(config[key], dict):
            raise _bad(f"TF_CONFIG's {key!r} entry must be a JSON object",
                       f"{key}={config[key]!r}", f'write e.g. "{key}": {example}')
    unknown = set(config.get("hetpipe") or {}) - set(HETPIPE_ENTRIES)
    if unknown:
        raise _bad("TF_CONFIG 'hetpipe' section has unknown entries",
                   f"hetpipe={config['hetpipe']!r}", f"use only {sorted(HETPIPE_ENTRIES)}")
    return config


def split_address(address: object, where: str = "address") -> tuple[str, int]:
    """(host, port) of "host:port" or "[ipv6]:port"; ValueError naming `where` else."""
    if not isinstance(address, str) or not address.strip():
        raise _bad(f"The address of {where} must be a 'host:port' string",
                   f"{where}={address!r}", "write e.g. '127.0.0.1:2222'")
    text = address.strip()
    if text.startswith("["):
        host, sep, port = text[1:].partition("]:")
        ok_host = _is_ipv6(host)
    else:
        host, sep, port = text.rpartition(":")
        ok_host = bool(host) and (_HOSTNAME.match(host) is not None or _is_ipv4(host))
    if not sep or not port:
        raise _bad(f"The address of {where} has no port", f"{where}={address!r}",
                   "write 'host:port', e.g. '127.0.0.1:2222'")
    if not ok_host:
        raise _bad(f"The address of {where} has an invalid host name",
                   f"{where}={address!r}, host={host!r}",
                   "use a host name, an IPv4 address or [an IPv6 address]")
    if not port.isdigit() or not 1 <= int(port) <= 65535:
        raise _bad(f"The port of {where} must be an integer in 1..65535",
                   f"{where}={address!r}, port={port!r}", "pick a free port, e.g. 2222")
    return host, int(port)


def _is_ipv4(host: str) -> bool:
    try:
        return isinstance(ipaddress.ip_address(host), ipaddress.IPv4Address)
    except ValueError:
        return False


def _is_ipv6(host: str) -> bool:
    try:
        return isinstance(ipaddress.ip_address(host), ipaddress.IPv6Address)
    except ValueError:
        return False


def _canonical(host: str, port: int) -> tuple[str, int]:
    """Addresses that reach the same socket compare equal (localhost = 127.0.0.1)."""
    h = host.lower().rstrip(".")
    return ("127.0.0.1" if h == "localhost" else h), port


def validate_jobs(jobs: Mapping[str, Mapping[int, str]]) -> None:
    """Raise ValueError for the first thing wrong with a parsed cluster spec."""
    seen: dict[tuple[str, int], str] = {}
    for job, tasks in jobs.items():
        if job not in KNOWN_JOBS:
            raise _bad("The cluster spec has a job TensorFlow's strategies do not know",
                       f"job={job!r}", f"name jobs from {list(KNOWN_JOBS)}")
        if job in ("chief", "master") and len(tasks) > 1:
            raise _bad(f"A cluster has at most one {job} task",
                       f"{job}={[tasks[i] for i in sorted(tasks)]!r}",
                       f"list one {job} address and make the others workers")
        for index, address in tasks.items():
            if isinstance(index, bool) or not isinstance(index, int) or index < 0:
                raise _bad(f"Task indices of job {job!r} must be ints >= 0",
                           f"index={index!r}", "number tasks 0, 1, ...")
            name = f"{job}:{index}"
            key = _canonical(*split_address(address, name))
            if key in seen:
                raise _bad("Two tasks of the cluster spec have the same address",
                           f"{seen[key]} and {name} at {address!r}",
                           "give every task its own host:port")
            seen[key] = name


def validate_task(jobs: Mapping[str, Mapping[int, str]], job: object, index: object) -> None:
    """Raise ValueError unless (job, index) names a task of `jobs`."""
    if not isinstance(job, str) or job not in jobs:
        raise _bad("The task's job is not in the cluster spec", f"task type={job!r}",
                   f"use one of {sorted(jobs)}")
    hint = "write the task index as a JSON number"
    if isinstance(index, str) and index.strip().isdigit():
        hint = f'write it without quotes: "index": {int(index)}'
    check_int("task index", index, minimum=0, hint=hint)
    if index not in jobs[job]:
        raise _bad(f"The task index is out of range for job {job!r}",
                   f"task index={index!r}, tasks of {job}={sorted(jobs[job])}",
                   "set the index of one of the listed tasks")
