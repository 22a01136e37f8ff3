"""Lost tasks of a cluster job: found within a bound, named, and what the job does then.

`TaskMonitor` is a thread of the chief that probes every remote task of the virtual
workers' plans and parameter servers (`hetpipe_tf.cluster.probe`: TensorFlow's own
`WorkerService/GetStatus` RPC with a gRPC deadline) every `interval_s`. A task is LOST
when nothing listens at its address any more (two refused probes in a row: the process
died) or when it has not answered for `timeout_s` (frozen: SIGSTOP, a hung host, a
partition). Then `on_lost(TaskLostError)` is called once per task, from the monitor's
thread, whatever the chief's threads are doing (a push, a pull, a stage task, a drain).

`TaskLostError` names the task, its address, what the probes saw, and the stages and
virtual workers (VWs) that ran on it (every VW for a parameter server: each pushes to
and pulls from it). `FaultPolicy` says what the job does: STOP raises it from `fit`;
CONTINUE drops the VWs that lost a task and goes on with the others
(`hetpipe_tf.ps.coordinator.Coordinator.drop_lost`), raising only when none is left or a
parameter server is lost (w_global lives there). Every thread that works for a VW runs its
eager ops in an executor of its own, so a lost task blocks only its VWs' threads
(docs/cluster_jobs.md, "Going on without a lost VW").
"""

from __future__ import annotations

import dataclasses
import enum
import math
import os
import threading
import time
from typing import Callable, Mapping, Sequence

from hetpipe_tf._args import parse_enum
from hetpipe_tf.cluster.probe import Health, probe
from hetpipe_tf.ps.call_workers import Call, CallWorkers

DEFAULT_TIMEOUT_S = 30.0


class FaultPolicy(enum.Enum):
    STOP = "stop"
    CONTINUE = "continue"

    @classmethod
    def parse(cls, value: "FaultPolicy | str") -> "FaultPolicy":
        """The policy for `on_fault`: a FaultPolicy, "stop" or "continue" (any case)."""
        return parse_enum(cls, value, arg="on_fault", what="fault policy")


@dataclasses.dataclass(frozen=True)
class FaultOptions:
    timeout_s: float = DEFAULT_TIMEOUT_S
    policy: FaultPolicy = FaultPolicy.STOP

    @classmethod
    def parse(cls, timeout_s: float, policy: FaultPolicy | str) -> "FaultOptions":
        if (isinstance(timeout_s, bool) or not isinstance(timeout_s, (int, float))
                or not math.isfinite(timeout_s) or timeout_s <= 0):
            raise ValueError(f"fault_timeout_s must be a number of seconds > 0. Received: "
                             f"fault_timeout_s={timeout_s!r}; pass e.g. {DEFAULT_TIMEOUT_S}.")
        policy = FaultPolicy.parse(policy)
        return cls(float(timeout_s), policy)


@dataclasses.dataclass(frozen=True)
class TaskUse:
    """What a task holds for the job: (VW, stage index, device) triples, and whether it is
    a parameter server."""

    stages: tuple[tuple[int, int, str], ...] = ()
    parameter_server: bool = False

    @property
    def virtual_workers(self) -> tuple[int, ...]:
        return tuple(sorted({vw for vw, _, _ in self.stages}))


class TaskLostError(RuntimeError):
    """A worker or parameter-server task of the job died or stopped answering."""

    def __init__(self, task: str, address: str, health: Health, silent_s: float,
                 use: TaskUse, num_virtual_workers: int, reason: str | None = None):
        self.task, self.address, self.health, self.silent_s = task, address, health, silent_s
        self.use = use
        self.stages = use.stages
        self.reason = reason or ("Received: on_fault='stop'; restart the job from the last "
                                 "checkpoint (e.g. keras.callbacks.BackupAndRestore).")
        self.virtual_workers = (tuple(range(num_virtual_workers)) if use.parameter_server
                                else use.virtual_workers)
        self.seen = seen = ("nothing listens at its address any more (the process is gone)"
                if health is Health.REFUSED
                else f"it has not answered for {silent_s:.1f} s (frozen or cut off)")
        held = [f"stage {s} of VW {vw} on {d}" for vw, s, d in use.stages]
        if use.parameter_server:
            held.append("parameter-server variables of every VW")
        super().__init__(
            f"Task {task} at {address} is lost: {seen}. It held: "
            f"{'; '.join(held) or 'nothing of this job'} (VWs {list(self.virtual_workers)}). "
            + self.reason)


def task_uses(plans: Sequence, ps_devices: Sequence[str]) -> dict[str, TaskUse]:
    """{"worker:0": TaskUse, ...}: the remote tasks the plans' stages and the parameter
    servers' variables are on (devices named '/job:<job>/.../task:<i>/...')."""
    stages: dict[str, list] = {}
    ps: set[str] = set()
    for vw, plan in enumerate(plans):
        for s, stage in enumerate(plan.stages):
            t = _task_of_device(stage.tf_device)
            if t is not None:
                stages.setdefault(t, []).append((vw, s, stage.tf_device))
    for d in ps_devices:
        t = _task_of_device(d)
        if t is not None:
            ps.add(t)
    return {t: TaskUse(tuple(stages.get(t, ())), t in ps) for t in sorted({*stages, *ps})}


def _task_of_device(device: str) -> str | None:
    job = task = None
    for part in device.split("/"):
        if part.startswith("job:"):
            job = part[4:]
        elif part.startswith("task:"):
            task = part[5:]
    if job is None or job == "localhost":
        return None
    return f"{job}:{task or 0}"


class TaskMonitor:
    """Probes `addresses` ({"worker:0": "127.0.0.1:2222", ...}) on a thread; calls
    `on_lost(task, health, silent_s)` once for each task found lost (module docstring).
    A context manager: leaving it stops and joins the thread."""

    def __init__(self, addresses: Mapping[str, str], timeout_s: float,
                 on_lost: Callable[[str, Health, float], None],
                 interval_s: float | None = None):
        self.addresses = dict(addresses)
        self.timeout_s = timeout_s
        self.interval_s = interval_s if interval_s is not None else min(1.0, timeout_s / 5)
        self._on_lost = on_lost
        self._stop = threading.Event()
        self.lost: dict[str, float] = {}   # task -> seconds after its last answer
        self.last_ok = {t: time.monotonic() for t in self.addresses}   # task -> its last answer
        self._thread = threading.Thread(target=self._run, daemon=True,
                                        name="hetpipe-task-monitor")
        self._thread.start()

    def is_lost(self, task: str, refused_in_a_row: int, now: float) -> float | None:
        """The seconds `task` has been silent if that makes it lost (two refused probes in
        a row, or no answer for about `timeout_s`), else None."""
        silent = now - self.last_ok[task]
        if refused_in_a_row >= 2 or silent + self.interval_s >= self.timeout_s:
            return silent
        return None

    def _run(self) -> None:
        refused = {t: 0 for t in self.addresses}
        while not self._stop.is_set():
            for task, address in self.addresses.items():
                if task in self.lost or self._stop.is_set():
                    continue
                # The probe's deadline keeps one round within interval_s per task.
                h = probe(address, self.interval_s)
                now = time.monotonic()
                if h is Health.OK:
                    self.last_ok[task], refused[task] = now, 0
                    continue
                refused[task] = refused[task] + 1 if h is Health.REFUSED else 0
                silent = self.is_lost(task, refused[task], now)
                if silent is not None:
                    self.lost[task] = silent
                    try:
                        self._on_lost(task, h, silent)
                    except Exception:   # noqa: BLE001 - the monitor must keep watching
                        pass
            self._stop.wait(self.interval_s)

    def close(self) -> None:
        self._stop.set()
        self._thread.join(timeout=self.interval_s * (len(self.addresses) + 2) + 5)

    def __enter__(self) -> "TaskMonitor":
        return self

    def __exit__(self, *exc) -> None:
        self.close()


class FaultGuard:
    """The chief's side of fault handling for one executor (the coordinator of the VWs).

    `call(fn, *args)` runs a call of the executor (submit, drain, abort, close) on a
    long-lived worker thread (hetpipe_tf/ps/call_workers.py) while the caller waits for it
    OR for a lost task, so a call stuck in a remote op (a frozen task never answers, and
    TensorFlow has no deadline on eager remote ops) still returns: with a TaskLostError
    under `FaultPolicy.STOP`; its worker stays behind and later calls go to another. An
    error of the call that a lost task explains (TensorFlow's UnavailableError from a dead
    task) is raised as the TaskLostError, the original as its cause. `lost(task, health,
    silent_s)` is the monitor's callback.

    Under `FaultPolicy.CONTINUE`, `on_lost(error)` (the coordinator's `drop_lost`, which it
    sets) decides: True, the job goes on without the task's VWs and no call fails; else
    (a parameter server, the last VW, or no `on_lost`) the error is fatal as under STOP,
    its message saying why the job could not go on (the string `on_lost` returned).
    """

    def __init__(self, options: FaultOptions, uses: Mapping[str, TaskUse],
                 addresses: Mapping[str, str], num_virtual_workers: int,
                 on_lost: Callable[[TaskLostError], None] | None = None):
        self.options = options
        self.uses = dict(uses)
        self.addresses = {t: addresses[t] for t in self.uses if t in addresses}
        self.num_virtual_workers = num_virtual_workers
        self.errors: list[TaskLostError] = []   # every task found lost, in order
        self.fatal: TaskLostError | None = None  # the one the job stops on
        self.on_lost = on_lost
        self._handled: set[str] = set()   # tasks already reported (monitor and confirm race)
        self._event = threading.Event()
        self._local = threading.local()
        self._lock = threading.Lock()
        self.monitor = TaskMonitor(self.addresses, options.timeout_s, self.lost)
        # The job outlives a lost task under CONTINUE: a call's failed ops must not block
        # the chief's later calls in a shared executor, so each runs in one of its own.
        self._workers = CallWorkers(
            "hetpipe-guarded-call", on_start=self._mark_inside,
            around=_own_executor if options.policy is FaultPolicy.CONTINUE else None)

    def _mark_inside(self) -> None:
        self._local.inside = True

    def lost(self, task: str, health: Health, silent_s: float) -> None:
        with self._lock:
            if task in self._handled:
                return
            self._handled.add(task)
        use = self.uses.get(task, TaskUse())
        args = (task, self.addresses[task], health, silent_s, use, self.num_virtual_workers)
        cont = self.options.policy is FaultPolicy.CONTINUE
        error = TaskLostError(*args, reason=(
            "Received: on_fault='continue': the job goes on without its VWs." if cont
            else None))
        with self._lock:
            self.errors.append(error)
        verdict = None
        if cont and self.on_lost is not None and not use.parameter_server:
            try:
                verdict = self.on_lost(error)
            except Exception as e:  # noqa: BLE001 - the job then stops with the named error
                verdict = f"going on without its VWs failed ({type(e).__name__}: {e})"
        if verdict is not True:
            if cont:
                why = (verdict if isinstance(verdict, str) else
                       "w_global lives on the parameter servers" if use.parameter_server
                       else "this executor cannot go on without a virtual worker")
                error = TaskLostError(*args, reason=(
                    f"Received: on_fault='continue', but the job cannot go on: {why}; "
                    "restart it from the last checkpoint (e.g. "
                    "keras.callbacks.BackupAndRestore)."))
            with self._lock:
                if self.fatal is None:
                    self.fatal = error
            self._event.set()

    def inside(self) -> bool:
        """True on a guarded call's worker thread (the call itself runs there)."""
        return getattr(self._local, "inside", False)

    def confirm(self, timeout_s: float) -> TaskLostError | None:
        """Probe every task now (an error from a remote op came first); the fatal error if
        a task is lost, within `timeout_s`."""
        deadline = time.monotonic() + timeout_s
        for task, address in self.addresses.items():
            if task in self.monitor.lost:
                continue
            left = max(0.05, min(self.monitor.interval_s, deadline - time.monotonic()))
            h = probe(address, left)
            if h is Health.REFUSED:
                h = probe(address, left)   # twice, as the monitor does
            if h is not Health.OK:
                self.monitor.lost[task] = 0.0
                self.lost(task, h, 0.0)
        return self.fatal

    def check_alive(self) -> None:
        """Return once every task answered a probe sent now; raise the fatal TaskLostError
        if a task is lost first (found as the monitor finds it: at most about `timeout_s`
        after its last answer). The end of `fit` (strategy/guards.py): a task that froze
        or died after its last work of the fit (the last epoch's end, the final drain) ends
        that fit with the error, not the next call. Under CONTINUE a lost worker's VWs are
        dropped (`on_lost`) and only a fatal loss raises."""
        pending = [t for t in self.addresses if t not in self.monitor.lost]
        refused = dict.fromkeys(pending, 0)
        while pending and self.fatal is None:
            for task in list(pending):
                h = probe(self.addresses[task], self.monitor.interval_s)
                now = time.monotonic()
                if h is Health.OK:
                    self.monitor.last_ok[task] = now
                    pending.remove(task)
                    continue
                refused[task] = refused[task] + 1 if h is Health.REFUSED else 0
                silent = self.monitor.is_lost(task, refused[task], now)
                if task in self.monitor.lost or silent is not None:
                    if task not in self.monitor.lost:
                        self.monitor.lost[task] = silent
                    self.lost(task, h, self.monitor.lost[task])
                    pending.remove(task)
        if self.fatal is not None:
            raise self.fatal

    def call(self, fn: Callable, *args):
        if self.fatal is not None:
            raise self.fatal
        call = Call(fn, args)
        self._workers.start(call)
        while not call.done.wait(0.05):
            if self._event.is_set():
                raise self.fatal   # the call stays behind on its (daemon) worker
        error = call.error
        if error is None:
            return call.value
        if self.fatal is None and remote_failure(error):
            self.confirm(self.options.timeout_s)
        if self.fatal is not None and error is not self.fatal:
            raise self.fatal from error
        raise error

    def call_or_abandon(self, fn: Callable, abandon: Callable[[], None]) -> None:
        """`call(fn)`, or `abandon()` once a task is lost (an abort must not raise)."""
        if self.fatal is None:
            try:
                return self.call(fn)
            except TaskLostError:
                pass
        abandon()

    def close(self) -> None:
        """Stop the monitor and the idle call workers (a call after this runs on a worker
        that ends with it; one stuck in a lost task's op stays behind as a daemon)."""
        self.monitor.close()
        self._workers.close()


def _own_executor():
    """`tf_executors.own_executor()` (hetpipe_tf/_shim), imported when first needed."""
    from hetpipe_tf._shim import tf_executors

    return tf_executors.own_executor()


def remote_failure(error: BaseException) -> bool:
    """An error TensorFlow may raise when a remote task is gone: any OpError (a dead task
    shows as UnavailableError, but also e.g. as InvalidArgumentError 'Primary device is
    not remote' from a function call); the probes then decide."""
    import tensorflow as tf

    return isinstance(error, tf.errors.OpError)


def fault_guard(options: FaultOptions | None, plans: Sequence, ps_devices: Sequence[str],
                cluster, on_lost: Callable[[TaskLostError], None] | None = None
                ) -> FaultGuard | None:
    """The guard of a job whose stages or parameter servers are on remote tasks with known
    addresses (`cluster`'s hosts), else None (a local job has nothing to lose)."""
    if options is None or cluster is None:
        return None
    uses = task_uses(plans, ps_devices)
    addresses = {f"{h.task[0]}:{h.task[1]}": h.address for h in cluster.hosts
                 if h.task is not None and h.address}
    uses = {t: u for t, u in uses.items() if t in addresses}
    if not uses:
        return None
    # Remote tasks: Keras' epoch-end async_wait() would wait for a lost one forever; our
    # executors drain explicitly, so it is made a no-op as ParameterServerStrategyV2 does
    # (also set by hetpipe_tf.cluster.roles.connect_chief; docs/cluster_jobs.md).
    os.environ["TF_PS_DISABLE_ASYNC_EXECUTOR_GLOBALLY"] = "True"
    return FaultGuard(options, uses, addresses, len(plans), on_lost)
