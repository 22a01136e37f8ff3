"""Ctrl-C for real: SIGINT reaches a child process in the middle of `fit` (1 and 2 virtual
workers); afterwards nothing moves, the counters agree, and a resumed fit trains."""

import json
import os
import signal
import subprocess
import sys
import time

import pytest

ROOT = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))


def _default_sigint() -> None:
    # A test run started in the background of a shell without job control ignores SIGINT,
    # and a child would inherit that (Python then installs no KeyboardInterrupt handler).
    signal.signal(signal.SIGINT, signal.SIG_DFL)


@pytest.mark.parametrize("vws", [1, 2])
def test_sigint_in_fit_aborts_cleanly_and_training_resumes(vws):
    child = subprocess.Popen([sys.executable, "-m", "tests.strategy.interrupt_child", str(vws)],
                             cwd=ROOT, stdout=subprocess.PIPE, stderr=subprocess.DEVNULL,
                             text=True, preexec_fn=_default_sigint)
    try:
        deadline = time.monotonic() + 180
        line = ""
        while "training" not in line and time.monotonic() < deadline:
            line = child.stdout.readline()
            assert line or child.poll() is None, "the child ended before training"
        assert "training" in line
        child.send_signal(signal.SIGINT)
        out, _ = child.communicate(timeout=180)
    finally:
        if child.poll() is None:
            child.kill()
            child.wait()
    assert child.returncode == 0
    result = json.loads(out.strip().splitlines()[-1])
    assert result["interrupted"]
    assert not result["moved_after_raise"]
    assert result["in_flight"] == 0
    assert result["iterations"] == result["completed"] >= 10
    assert result["iterations_after_resume"] == result["iterations"] + 256 // 8
    assert result["resumed_loss"] == result["resumed_loss"]   # finite, not NaN
    assert result["threads_left"] == []
