r"""Run one program as a local cluster job: a chief, N workers and M parameter servers.

  python -m hetpipe_tf.launch --workers=2 --ps=1 [--devices_per_worker=K] \
      -- python examples/train_mlp.py --epochs=2

Every process runs the same command on 127.0.0.1 with its own TF_CONFIG (free ports; the
chief trains, the workers and parameter servers serve from `HetPipeStrategy(...)`, which
never returns in them, docs/cluster_jobs.md). The word `python` or `python3` as the
command's first word means the launcher's own interpreter (`sys.executable`), not the
first `python` on PATH. `--devices_per_worker=K` declares K LOCAL_CPU devices per worker in
TF_CONFIG's "hetpipe" section (each worker's server then has K CPU devices). Each line a
process prints is streamed with its task as a prefix ("[worker:1] ...").

How the job ends:
- the chief exits: the other processes are stopped by pid (SIGTERM, SIGKILL after
  `--grace_s`) and the launcher exits with the chief's status, 128 + N for a chief killed
  by signal N (137 for SIGKILL), after a line naming how the chief ended;
- Ctrl-C (SIGINT) or SIGTERM to the launcher: the chief alone gets the signal first (Keras'
  `fit` raises KeyboardInterrupt at a minibatch boundary while the workers and ps still
  serve); the others are stopped once the chief exited, or after `--chief_grace_s`, or at
  a second Ctrl-C; the launcher exits with 128 + the signal;
- the launcher itself is killed (SIGKILL): the kernel kills its children
  (PR_SET_PDEATHSIG, `hetpipe_tf/cluster/lifetime.py`).

TensorFlow's gRPC server listens on every interface (the IPv6 wildcard, dual stack),
whatever address the cluster names; on a machine with a non-loopback interface the
launcher prints a warning naming the ports it opened (docs/cluster_jobs.md, "Security").
"""

from __future__ import annotations

import argparse
import dataclasses
import json
import os
import signal
import subprocess
import sys
import threading
import time
from typing import Mapping, Sequence, TextIO

from hetpipe_tf._args import check_int, check_number
from hetpipe_tf.cluster.lifetime import LAUNCHED_ENV, child_preexec, stop_processes

GRACE_S = 10.0        # seconds a process gets after SIGTERM before SIGKILL
# Seconds the chief gets after Ctrl-C / SIGTERM of the launcher to stop (Keras raises at a
# minibatch boundary, the runtimes drain against live workers) before the workers and ps
# are stopped too; a second Ctrl-C stops everything at once.
CHIEF_GRACE_S = 30.0
PYTHON_WORDS = ("python", "python3")   # run as the launcher's own interpreter


@dataclasses.dataclass(frozen=True)
class Task:
    job: str
    index: int
    address: str
    tf_config: str

    @property
    def name(self) -> str:
        return f"{self.job}:{self.index}"


def exit_status(returncode: int) -> int:
    """The shell's exit status for a child's `Popen.returncode`: 128 + N for a child killed
    by signal N (Popen reports -N), else the code itself."""
    return 128 - returncode if returncode < 0 else returncode


def describe_exit(who: str, pid: int, returncode: int) -> str:
    """How a process ended, e.g. "the chief (pid 12) was killed by SIGKILL" or
    "worker:1 (pid 13) exited with code 3"."""
    if returncode < 0:
        try:
            name = signal.Signals(-returncode).name
        except ValueError:
            name = f"signal {-returncode}"
        return f"{who} (pid {pid}) was killed by {name}"
    return f"{who} (pid {pid}) exited with code {returncode}"


def resolve_command(command: Sequence[str], executable: str = sys.executable) -> list[str]:
    """`command` with a first word `python` / `python3` replaced by `executable` (the
    launcher's interpreter, so the job runs in the launcher's environment)."""
    command = list(command)
    if command and command[0] in PYTHON_WORDS:
        command[0] = executable
    return command


def free_ports(n: int) -> list[int]:
    from hetpipe_tf.cluster.serve import free_ports as _free_ports   # no TF imported
    return _free_ports(n)


def job_tasks(workers: int, ps: int, devices_per_worker: int = 1,
              ports: Sequence[int] | None = None) -> list[Task]:
    """The tasks of a local job, the chief first: TF_CONFIG of each on 127.0.0.1."""
    for name, value, low in (("workers", workers, 1), ("ps", ps, 0),
                             ("devices_per_worker", devices_per_worker, 1)):
        check_int(name, value, minimum=low, hint=f"pass e.g. --{name}={max(low, 1)}")
    counts = {"chief": 1, "worker": workers, **({"ps": ps} if ps else {})}
    ports = list(ports) if ports is not None else free_ports(sum(counts.values()))
    it = iter(ports)
    cluster = {job: [f"127.0.0.1:{next(it)}" for _ in range(n)] for job, n in counts.items()}
    hetpipe = {"devices": {f"worker:{i}": ["LOCAL_CPU"] * devices_per_worker
                           for i in range(workers)}}
    return [Task(job, i, cluster[job][i], json.dumps(
                {"cluster": cluster, "task": {"type": job, "index": i}, "hetpipe": hetpipe}))
            for job in counts for i in range(counts[job])]


def non_loopback_interfaces() -> list[str]:
    """Network interfaces of this machine other than loopback that are not down."""
    out = []
    try:
        names = sorted(os.listdir("/sys/class/net"))
    except OSError:
        import socket
        names = sorted(n for _, n in socket.if_nameindex())
    for name in names:
        if name == "lo":
            continue
        try:
            with open(f"/sys/class/net/{name}/operstate") as f:
                if f.read().strip() == "down":
                    continue
        except OSError:
            pass
        out.append(name)
    return out


def exposure_warning(tasks: Sequence[Task], interfaces: Sequence[str]) -> str | None:
    """The one-line warning printed when TensorFlow's servers are reachable from outside."""
    if not interfaces:
        return None
    ports = ", ".join(t.address.rsplit(":", 1)[1] for t in tasks)
    return (f"[launch] warning: TensorFlow's gRPC servers listen on every interface, not only "
            f"127.0.0.1: ports {ports} are open on {', '.join(interfaces)} for this job, "
            "unauthenticated; fence them (docs/cluster_jobs.md, 'Security').")


def _stream(task: Task, pipe: TextIO, out: TextIO, lock: threading.Lock) -> None:
    for line in iter(pipe.readline, ""):
        with lock:
            out.write(f"[{task.name}] {line if line.endswith(chr(10)) else line + chr(10)}")
            out.flush()
    pipe.close()


class Job:
    """The processes of one launched job; `run()` returns the launcher's exit status."""

    def __init__(self, command: Sequence[str], tasks: Sequence[Task],
                 env: Mapping[str, str] | None = None, out: TextIO = sys.stdout,
                 grace_s: float = GRACE_S, chief_grace_s: float = CHIEF_GRACE_S):
        if not command:
            raise ValueError("The launcher needs a command to run after '--'. Received: "
                             "command=[]; e.g. -- python examples/train_mlp.py")
        self.command = list(command)
        self.tasks = list(tasks)
        self.env = dict(os.environ if env is None else env)
        self.out = out
        self.grace_s = grace_s
        self.chief_grace_s = chief_grace_s
        self.procs: list[subprocess.Popen] = []
        self._lock = threading.Lock()
        self._readers: list[threading.Thread] = []
        self._signals: list[int] = []
        self._wake = threading.Event()

    def _say(self, text: str) -> None:
        with self._lock:
            self.out.write(text + "\n")
            self.out.flush()

    def _start(self) -> None:
        me = os.getpid()
        for task in self.tasks:
            env = {**self.env, "TF_CONFIG": task.tf_config, LAUNCHED_ENV: str(me),
                   "PYTHONUNBUFFERED": "1"}
            p = subprocess.Popen(self.command, env=env, stdin=subprocess.DEVNULL,
                                 stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True,
                                 errors="replace", preexec_fn=child_preexec(me))
            self.procs.append(p)
            self._say(f"[launch] {task.name} pid={p.pid} at {task.address}")
            t = threading.Thread(target=_stream, args=(task, p.stdout, self.out, self._lock),
                                 daemon=True, name=f"launch-log-{task.name}")
            t.start()
            self._readers.append(t)

    def _on_signal(self, signum, frame) -> None:
        self._signals.append(signum)
        self._wake.set()

    def _reap(self, pid: int) -> None:
        for p in self.procs:
            if p.pid == pid:
                p.poll()

    def run(self) -> int:
        handlers = {s: signal.signal(s, self._on_signal) for s in (signal.SIGINT, signal.SIGTERM)}
        try:
            try:
                self._start()
            except OSError as e:   # no such program, not executable
                self._say(f"[launch] cannot start {self.command[0]!r}: {e.strerror or e}. "
                          "Received: command=" + " ".join(self.command)
                          + "; give a program on PATH or its path after '--'.")
                return 127 if isinstance(e, FileNotFoundError) else 126
            chief, reported = self.procs[0], set()
            while not self._signals and chief.poll() is None:
                for task, p in zip(self.tasks[1:], self.procs[1:]):
                    if p.poll() is not None and task.name not in reported:
                        reported.add(task.name)
                        self._say(f"[launch] {describe_exit(task.name, p.pid, p.returncode)}")
                self._wake.wait(0.1)
            if self._signals:
                return self._interrupt(self._signals[0])
            self._say(f"[launch] {describe_exit('the chief', chief.pid, chief.returncode)}")
            self.stop()
            return exit_status(chief.returncode)
        finally:
            self.stop()
            for s, h in handlers.items():
                signal.signal(s, h)
            for t in self._readers:
                t.join(timeout=2)

    def _interrupt(self, sig: int) -> int:
        """The launcher got `sig`: the chief first, the others once it exited (or after
        `chief_grace_s`, or at a second signal); returns 128 + sig."""
        chief = self.procs[0]
        name = signal.Signals(sig).name
        self._say(f"[launch] {name}: sent to the chief (pid {chief.pid}); the workers and ps "
                  f"are stopped once it exits (at most {self.chief_grace_s:g} s; Ctrl-C "
                  "again stops every process now)")
        signal_process_group(chief.pid, sig)
        deadline = time.monotonic() + self.chief_grace_s
        self._wake.clear()
        while (chief.poll() is None and len(self._signals) < 2
               and time.monotonic() < deadline):
            self._wake.wait(0.05)
            self._wake.clear()
        if chief.returncode is not None:
            self._say(f"[launch] {describe_exit('the chief', chief.pid, chief.returncode)}"
                      "; stopping the workers and ps")
        elif len(self._signals) >= 2:
            self._say(f"[launch] {signal.Signals(self._signals[1]).name} again: stopping "
                      "every process now")
        else:
            self._say(f"[launch] the chief (pid {chief.pid}) did not exit within "
                      f"{self.chief_grace_s:g} s: stopping every process")
        self.stop()
        return 128 + sig

    def stop(self, firsts: Sequence[int] | int = signal.SIGTERM) -> None:
        """Stop every process by pid (its process group too), then reap them."""
        pids = [p.pid for p in self.procs]
        if pids:
            stop_processes(pids, self.grace_s, firsts, reap=self._reap)
        for p in self.procs:
            try:
                p.wait(timeout=self.grace_s)
            except subprocess.TimeoutExpired:
                pass


def signal_process_group(pid: int, sig: int) -> None:
    """Send `sig` to the process group `pid` leads (the launcher's children each lead
    one), else to the process alone."""
    try:
        os.killpg(pid, sig)
    except (ProcessLookupError, PermissionError):
        try:
            os.kill(pid, sig)
        except ProcessLookupError:
            pass


class _Parser(argparse.ArgumentParser):
    """argparse with one-line errors (the usage is in --help)."""

    def error(self, message: str):
        self.exit(2, f"{self.prog}: error: {message} (see --help)\n")


def parse_args(argv: Sequence[str], executable: str = sys.executable
               ) -> tuple[argparse.Namespace, list[str]]:
    """The launcher's flags and the command after '--' (`python` resolved); a usage error
    (one line, exit status 2) without a command."""
    argv = list(argv)
    if "--" in argv:
        cut = argv.index("--")
        own, command = argv[:cut], argv[cut + 1:]
    else:
        own, command = argv, []
    parser = _Parser(
        prog="python -m hetpipe_tf.launch",
        description="Run a program as a local cluster job (chief, workers, ps) on 127.0.0.1. "
                    "The first word `python` or `python3` of the command runs the launcher's "
                    f"own interpreter ({executable}).",
        epilog="example: python -m hetpipe_tf.launch --workers=2 --ps=1 -- "
               "python examples/train_mlp.py")
    parser.add_argument("--workers", type=int, default=2, help="worker tasks (>= 1)")
    parser.add_argument("--ps", type=int, default=1, help="parameter-server tasks (>= 0)")
    parser.add_argument("--devices_per_worker", type=int, default=1,
                        help="LOCAL_CPU devices declared for each worker (>= 1)")
    parser.add_argument("--grace_s", type=float, default=GRACE_S,
                        help="seconds a process gets to exit after SIGTERM before SIGKILL")
    parser.add_argument("--chief_grace_s", type=float, default=CHIEF_GRACE_S,
                        help="after Ctrl-C/SIGTERM of the launcher: seconds the chief (which "
                             "gets the signal alone) has to exit before the workers and ps "
                             "are stopped")
    args = parser.parse_args(own)
    if not command or not command[0].strip():
        parser.error("no command after '--': put the program there, e.g. "
                     "-- python examples/train_mlp.py")
    return args, resolve_command(command, executable)


def main(argv: Sequence[str] | None = None) -> int:
    args, command = parse_args(sys.argv[1:] if argv is None else argv)
    try:
        tasks = job_tasks(args.workers, args.ps, args.devices_per_worker)
        for name in ("grace_s", "chief_grace_s"):
            check_number(name, getattr(args, name), minimum=0, hint=f"pass e.g. --{name}=10")
    except ValueError as e:
        print(f"hetpipe_tf.launch: {e}", file=sys.stderr)
        return 2
    job = Job(command, tasks, grace_s=args.grace_s, chief_grace_s=args.chief_grace_s)
    warning = exposure_warning(tasks, non_loopback_interfaces())
    if warning:
        job._say(warning)
    return job.run()


if __name__ == "__main__":
    sys.exit(main())
