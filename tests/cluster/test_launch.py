"""hetpipe_tf.launch: TF_CONFIG per process, logs with a task prefix, the exit status
(128 + N for a chief killed by signal N), Ctrl-C to the chief first, and no process left
after the job ends by success, error, SIGINT/SIGTERM/SIGKILL of the chief or of the
launcher. The program run is tests/cluster/launch_child.py (no TensorFlow: quick); every
process is looked up by pid and killed by pid in `finally`, also on failure."""

import json
import os
import re
import signal
import subprocess
import sys
import threading
import time

import pytest

from hetpipe_tf import launch
from hetpipe_tf.cluster.lifetime import alive
from tests.benchmarks.binaries import ROOT

CHILD = [sys.executable, "-m", "tests.cluster.launch_child"]


class Launched:
    """The launcher as a subprocess, its output collected line by line."""

    def __init__(self, action: str, workers: int = 2, ps: int = 1, extra=()):
        self.proc = subprocess.Popen(
            [sys.executable, "-m", "hetpipe_tf.launch", f"--workers={workers}", f"--ps={ps}",
             "--grace_s=3", *extra, "--", *CHILD, action],
            cwd=ROOT, stdin=subprocess.DEVNULL, stdout=subprocess.PIPE,
            stderr=subprocess.STDOUT, text=True)
        self.lines: list[str] = []
        self.tasks = 1 + workers + ps
        self._reader = threading.Thread(target=self._read, daemon=True)
        self._reader.start()

    def _read(self):
        for line in self.proc.stdout:
            self.lines.append(line.rstrip("\n"))

    def wait_for(self, pattern: str, count: int = 1, timeout: float = 60) -> list[str]:
        deadline = time.monotonic() + timeout
        while time.monotonic() < deadline:
            hits = [ln for ln in list(self.lines) if re.search(pattern, ln)]
            if len(hits) >= count:
                return hits
            if self.proc.poll() is not None and not self._reader.is_alive():
                break
            time.sleep(0.05)
        raise AssertionError(f"no {count} lines matching {pattern!r}:\n" + "\n".join(self.lines))

    def pids(self) -> dict[str, int]:
        out = {}
        for ln in self.lines:
            m = re.match(r"\[launch\] (\w+:\d+) pid=(\d+)", ln)
            if m:
                out[m.group(1)] = int(m.group(2))
        return out

    def ready(self):
        self.wait_for(r"\] (serving|sleeping)$", self.tasks)
        return self.pids()

    def cleanup(self, extra_pids=()):
        for pid in [*self.pids().values(), *extra_pids, self.proc.pid]:
            try:
                os.kill(pid, signal.SIGKILL)
            except ProcessLookupError:
                pass
        self.proc.wait(timeout=30)
        self._reader.join(timeout=10)


def _all_gone(pids, timeout=20.0):
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        if not any(alive(p) for p in pids):
            return True
        time.sleep(0.05)
    return [p for p in pids if alive(p)]


def test_job_tasks_tf_config():
    tasks = launch.job_tasks(2, 1, devices_per_worker=3, ports=[10, 11, 12, 13])
    assert [t.name for t in tasks] == ["chief:0", "worker:0", "worker:1", "ps:0"]
    config = json.loads(tasks[2].tf_config)
    assert config == {
        "cluster": {"chief": ["127.0.0.1:10"], "worker": ["127.0.0.1:11", "127.0.0.1:12"],
                    "ps": ["127.0.0.1:13"]},
        "task": {"type": "worker", "index": 1},
        "hetpipe": {"devices": {"worker:0": ["LOCAL_CPU"] * 3,
                                "worker:1": ["LOCAL_CPU"] * 3}}}
    assert "ps" not in json.loads(launch.job_tasks(1, 0, ports=[1, 2])[0].tf_config)["cluster"]
    with pytest.raises(ValueError, match="Received: workers=0"):
        launch.job_tasks(0, 1)


def test_exposure_warning_names_the_ports():
    tasks = launch.job_tasks(1, 1, ports=[4000, 4001, 4002])
    assert launch.exposure_warning(tasks, []) is None
    text = launch.exposure_warning(tasks, ["eth0"])
    assert "ports 4000, 4001, 4002" in text and "eth0" in text and "\n" not in text


def test_exit_status_and_the_line_naming_it():
    assert [launch.exit_status(c) for c in (0, 3, -9, -2, -15)] == [0, 3, 137, 130, 143]
    assert launch.describe_exit("the chief", 12, -9) == "the chief (pid 12) was killed by SIGKILL"
    assert launch.describe_exit("worker:1", 13, 3) == "worker:1 (pid 13) exited with code 3"


def test_python_means_the_launchers_interpreter():
    args, command = launch.parse_args(["--workers=3", "--chief_grace_s=5", "--", "python",
                                       "train.py", "--", "x"], executable="/venv/bin/python")
    assert (args.workers, args.ps, args.chief_grace_s) == (3, 1, 5.0)
    assert command == ["/venv/bin/python", "train.py", "--", "x"]
    assert launch.resolve_command(["python3", "-c", "1"], "/e") == ["/e", "-c", "1"]
    for first in ("/usr/bin/python", "python3.11", "bash"):   # an explicit choice stays
        assert launch.resolve_command([first], "/e") == [first]
    assert "own interpreter" in " ".join(
        subprocess.run([sys.executable, "-m", "hetpipe_tf.launch", "--help"], cwd=ROOT,
                       capture_output=True, text=True, timeout=60).stdout.split())


@pytest.mark.parametrize("argv", [["--workers=1"], ["--workers=1", "--"],
                                  ["--workers=1", "--", ""]])
def test_command_is_required(argv):
    proc = subprocess.run([sys.executable, "-m", "hetpipe_tf.launch", *argv],
                          cwd=ROOT, capture_output=True, text=True, timeout=60)
    assert proc.returncode == 2 and "no command after '--'" in proc.stderr
    assert len(proc.stderr.strip().splitlines()) == 1 and "Traceback" not in proc.stderr


def test_a_command_that_does_not_exist_is_one_line():
    proc = subprocess.run([sys.executable, "-m", "hetpipe_tf.launch", "--workers=1", "--ps=0",
                           "--", "/nonexistent/program"],
                          cwd=ROOT, capture_output=True, text=True, timeout=60)
    assert proc.returncode == 127 and "Traceback" not in proc.stdout + proc.stderr
    assert "[launch] cannot start '/nonexistent/program'" in proc.stdout


@pytest.mark.parametrize("action, code", [("exit0", 0), ("exit3", 3)])
def test_chief_exit_ends_the_job(action, code):
    job = Launched(action)
    try:
        assert job.proc.wait(timeout=90) == code
        job._reader.join(timeout=10)
        pids = job.pids()
        assert sorted(pids) == ["chief:0", "ps:0", "worker:0", "worker:1"]
        assert _all_gone(pids.values()) is True
        text = "\n".join(job.lines)
        # The chief may exit before the others print: only its own lines are certain.
        assert re.search(r"^\[chief:0\] task chief:0 pid=\d+ devices=", text, re.M)
        assert ("[chief:0] done" if code == 0 else "[chief:0] failing") in text
    finally:
        job.cleanup()


@pytest.mark.parametrize("sig", [signal.SIGINT, signal.SIGTERM])
def test_signal_to_the_launcher_stops_every_process(sig):
    job = Launched("grandchild", workers=1)
    grand = []
    try:
        pids = job.ready()
        grand = [int(job.wait_for(r"grandchild pid=")[0].rsplit("=", 1)[1])]
        os.kill(job.proc.pid, sig)
        assert job.proc.wait(timeout=60) == 128 + sig
        assert _all_gone([*pids.values(), *grand]) is True
    finally:
        job.cleanup(grand)


def test_sigkill_of_the_launcher_kills_its_children():
    job = Launched("sleep")
    try:
        pids = job.ready()
        os.kill(job.proc.pid, signal.SIGKILL)
        job.proc.wait(timeout=30)
        assert _all_gone(pids.values()) is True   # PR_SET_PDEATHSIG, no cleanup code ran
    finally:
        job.cleanup()


@pytest.mark.parametrize("sig", [signal.SIGINT, signal.SIGTERM, signal.SIGKILL])
def test_chief_killed_ends_the_job(sig):
    job = Launched("sleep")
    try:
        pids = job.ready()
        os.kill(pids["chief:0"], sig)
        assert job.proc.wait(timeout=60) == 128 + sig
        name = signal.Signals(sig).name
        job.wait_for(rf"^\[launch\] the chief \(pid {pids['chief:0']}\) was killed by {name}$")
        assert _all_gone(pids.values()) is True
    finally:
        job.cleanup()


def _time_of(job, pattern):
    return float(job.wait_for(pattern)[0].rsplit(" ", 1)[1])


def test_sigint_goes_to_the_chief_first_and_the_others_after_it_exits():
    """The chief alone gets Ctrl-C; the worker and ps get SIGTERM only after the chief,
    busy 1 s after its SIGINT (a minibatch boundary), exited."""
    job = Launched("trap", workers=1, extra=["--chief_grace_s=30"])
    try:
        pids = job.ready()
        os.kill(job.proc.pid, signal.SIGINT)
        assert job.proc.wait(timeout=60) == 128 + signal.SIGINT
        chief_exit = _time_of(job, r"^\[chief:0\] exits at ")
        for task in ("worker:0", "ps:0"):
            assert _time_of(job, rf"^\[{task}\] SIGTERM at ") >= chief_exit
        job.wait_for(r"^\[launch\] the chief \(pid \d+\) exited with code 0; stopping")
        assert _all_gone(pids.values()) is True
    finally:
        job.cleanup()


def test_a_chief_that_ignores_sigint_is_stopped_after_the_grace_period():
    job = Launched("deaf", workers=1, extra=["--chief_grace_s=1.5"])
    try:
        pids = job.ready()
        sent = time.time()
        os.kill(job.proc.pid, signal.SIGINT)
        assert job.proc.wait(timeout=60) == 128 + signal.SIGINT
        assert _time_of(job, r"^\[worker:0\] SIGTERM at ") >= sent + 1.4
        job.wait_for(r"did not exit within 1.5 s: stopping every process")
        assert _all_gone(pids.values()) is True
    finally:
        job.cleanup()


@pytest.mark.slow   # 4 TensorFlow processes, twice: about a minute on 2 cores
def test_example_job_killed_worker_named_then_resumed(tmp_path):
    """The example under the launcher with --devices_per_worker=2 (each worker's server
    has 2 CPU devices, so the 2 VWs, one per worker, are 2-stage pipelines whose stages sit
    on /job:worker/.../CPU:0 and CPU:1): a worker SIGKILLed after the first epoch ends the
    job with TaskLostError and no process left; the same job started again resumes from
    BackupAndRestore's last epoch and finishes."""
    backup = str(tmp_path / "backup")
    # fault_timeout_s bounds the chief's start-up check too: servers slow to start on a
    # loaded machine are not the fault here (a SIGKILLed worker is found in well under 1 s).
    flags = ["--epochs=3", "--samples=128", "--fault_timeout_s=60", f"--backup_dir={backup}"]
    launcher = [sys.executable, "-m", "hetpipe_tf.launch", "--workers=2", "--ps=1",
                "--devices_per_worker=2"]
    first = Launched.__new__(Launched)
    first.proc = subprocess.Popen(
        [*launcher, "--grace_s=3", "--", sys.executable, "examples/train_mlp.py", *flags],
        cwd=ROOT, stdin=subprocess.DEVNULL, stdout=subprocess.PIPE,
        stderr=subprocess.STDOUT, text=True)
    first.lines, first.tasks = [], 4
    first._reader = threading.Thread(target=first._read, daemon=True)
    first._reader.start()
    try:
        first.wait_for(r"^\[chief:0\] Epoch 2/3", timeout=240)
        pids = first.pids()
        os.kill(pids["worker:1"], signal.SIGKILL)
        assert first.proc.wait(timeout=120) != 0
        first._reader.join(timeout=10)
        text = "\n".join(first.lines)
        assert "TaskLostError: Task worker:1 at 127.0.0.1:" in text, text[-3000:]
        assert _all_gone(pids.values()) is True
        second = subprocess.run(
            [*launcher, "--", sys.executable, "examples/train_mlp.py", *flags],
            cwd=ROOT, capture_output=True, text=True, timeout=300)
        assert second.returncode == 0, second.stdout[-3000:]
        assert "[chief:0] Epoch 1/3" not in second.stdout   # resumed after epoch 1
        assert "[chief:0] final loss" in second.stdout
    finally:
        first.cleanup()


@pytest.mark.slow   # 3 TensorFlow processes: about 30 s on 2 cores
def test_ctrl_c_of_the_example_job_raises_keyboard_interrupt_in_fit():
    """Ctrl-C to the launcher reaches the chief alone: `fit` raises KeyboardInterrupt (not
    UnavailableError from a worker stopped under it), the worker and ps are stopped after
    the chief exited, nothing is left. `-- python` runs the launcher's own interpreter.
    One worker: a second would show nothing more (the killed-worker job has 2)."""
    job = Launched.__new__(Launched)
    job.proc = subprocess.Popen(
        [sys.executable, "-m", "hetpipe_tf.launch", "--workers=1", "--ps=1", "--grace_s=3",
         "--chief_grace_s=120", "--", "python", "examples/train_mlp.py", "--epochs=200",
         "--samples=64"],
        cwd=ROOT, stdin=subprocess.DEVNULL, stdout=subprocess.PIPE,
        stderr=subprocess.STDOUT, text=True)
    job.lines, job.tasks = [], 3
    job._reader = threading.Thread(target=job._read, daemon=True)
    job._reader.start()
    try:
        job.wait_for(r"^\[chief:0\] Epoch 2/200", timeout=300)
        pids = job.pids()
        os.kill(job.proc.pid, signal.SIGINT)
        assert job.proc.wait(timeout=180) == 128 + signal.SIGINT
        job._reader.join(timeout=10)
        chief = "\n".join(ln for ln in job.lines if ln.startswith("[chief:0]"))
        assert "KeyboardInterrupt" in chief and "UnavailableError" not in chief, chief[-3000:]
        job.wait_for(r"^\[launch\] the chief \(pid \d+\) (was killed by SIGINT|exited with "
                     r"code \d+); stopping the workers and ps$")
        assert _all_gone(pids.values()) is True
    finally:
        job.cleanup()
