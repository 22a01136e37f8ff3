"""Is a TensorFlow server task answering? One RPC of TensorFlow's own worker service with
a deadline.

A TCP connect is not enough: the kernel of a frozen process (SIGSTOP, a host whose
runtime hangs) still accepts connections, and `tf.distribute.Server`s' eager
`context.check_alive(task)` blocks (holding the GIL) until the task answers, which a
frozen task never does. `probe(address, deadline_s)` calls
`/tensorflow.WorkerService/GetStatus` (an empty request; the server's gRPC threads answer it
whatever its devices are doing) through grpcio (a dependency of TensorFlow's pip package)
with a gRPC deadline, so it returns within the deadline whatever the task's state:

- `Health.OK`: the task answered;
- `Health.REFUSED`: nothing listens at the address (the process is gone or not started);
- `Health.SILENT`: no answer within the deadline (the process is frozen or overloaded).

`wait_until_reachable(tasks, timeout_s)` first resolves every task's host
(`socket.getaddrinfo`: a host name that does not resolve is named at once,
`Health.UNRESOLVED`), then probes every task until each answered (servers take seconds to
import TensorFlow) and raises `TaskUnreachableError` naming the task and its address once
`timeout_s` passed.
"""

from __future__ import annotations

import enum
import socket
import time
from typing import Mapping

from hetpipe_tf.cluster.tf_validation import split_address

_METHOD = "/tensorflow.WorkerService/GetStatus"


class Health(enum.Enum):
    OK = "ok"
    REFUSED = "refused"
    SILENT = "silent"
    UNRESOLVED = "unresolved"   # the host name does not resolve (never probed)


class TaskUnreachableError(ConnectionError):
    """A task of the cluster did not answer before training (nothing listens there, or it
    does not answer TensorFlow's RPCs)."""

    def __init__(self, task: str, address: str, health: Health, waited_s: float,
                 detail: str = ""):
        self.task, self.address, self.health, self.waited_s = task, address, health, waited_s
        if health is Health.UNRESOLVED:
            host = split_address(address, task)[0]
            super().__init__(
                f"Task {task} at {address} cannot be reached: its host {host!r} does not "
                f"resolve ({detail or 'getaddrinfo failed'}). Received: {task}={address!r}; "
                "fix the host name (DNS or /etc/hosts of this machine) or give an IP address.")
            return
        why = ("nothing listens there" if health is Health.REFUSED
               else "it accepts connections but does not answer TensorFlow's RPCs")
        super().__init__(
            f"Task {task} at {address} did not answer within {waited_s:.1f} s: {why}. "
            f"Received: {task}={address!r}; start its server (every process of the job runs "
            "the same program, e.g. with python -m hetpipe_tf.launch), fix the address, or "
            "raise fault_timeout_s if servers start slowly.")


def check_resolvable(tasks: Mapping[str, str]) -> None:
    """TaskUnreachableError (`Health.UNRESOLVED`) for the first task ({"worker:0":
    "host:2222", ...}) whose host name does not resolve; IP addresses always pass."""
    for name, address in tasks.items():
        host, port = split_address(address, name)
        try:
            socket.getaddrinfo(host, port, type=socket.SOCK_STREAM)
        except socket.gaierror as e:
            raise TaskUnreachableError(name, address, Health.UNRESOLVED, 0.0,
                                       e.strerror or str(e)) from None


def probe(address: str, deadline_s: float) -> Health:
    """One GetStatus RPC to the TF server at `address`, answered within `deadline_s`?"""
    import grpc

    channel = grpc.insecure_channel(address, options=[("grpc.enable_retries", 0)])
    try:
        call = channel.unary_unary(_METHOD, request_serializer=None,
                                   response_deserializer=None)
        call(b"", timeout=deadline_s)
        return Health.OK
    except grpc.RpcError as e:
        return Health.SILENT if e.code() == grpc.StatusCode.DEADLINE_EXCEEDED else Health.REFUSED
    finally:
        channel.close()


def wait_until_reachable(tasks: Mapping[str, str], timeout_s: float,
                         interval_s: float = 0.25) -> None:
    """Probe every task ({"worker:0": "127.0.0.1:2222", ...}) until each answered once;
    TaskUnreachableError at once for a host that does not resolve, else for the first
    task still silent after `timeout_s`."""
    check_resolvable(tasks)
    start = time.monotonic()
    pending = dict(tasks)
    last: dict[str, Health] = {}
    while pending:
        for name, address in list(pending.items()):
            left = timeout_s - (time.monotonic() - start)
            h = probe(address, max(0.05, min(2.0, left)))
            last[name] = h
            if h is Health.OK:
                del pending[name]
        if not pending:
            return
        if time.monotonic() - start >= timeout_s:
            name = next(iter(pending))
            raise TaskUnreachableError(name, pending[name], last[name],
                                       time.monotonic() - start)
        time.sleep(interval_s)
