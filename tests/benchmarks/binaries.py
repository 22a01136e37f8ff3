"""Runs a program of benchmarks/ or experiments/ as a user does (`run_binary`: a subprocess
from the repository root), or its main in this process (`run_main`: no second TensorFlow
start-up; for tests that need no exit code, no usage error printed by absl and no signal).
"""

import contextlib
import dataclasses
import importlib
import io
import os
import subprocess
import sys

from absl import flags

ROOT = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))


def run_binary(*args: str) -> subprocess.CompletedProcess:
    env = {**os.environ, "TF_CPP_MIN_LOG_LEVEL": "3"}
    return subprocess.run([sys.executable, "-m", *args], cwd=ROOT, env=env,
                          capture_output=True, text=True, timeout=300)


@dataclasses.dataclass(frozen=True)
class Ran:
    """What `run_main` saw: main's return value (None = 0), its stdout and stderr."""
    returncode: int
    stdout: str
    stderr: str


def run_main(module: str, *args: str) -> Ran:
    """`python -m <module> <args>` in this process: the module is imported afresh, so its
    flags are defined on absl's FLAGS for this call only (two programs may define flags
    of the same name), absl parses `args` into them (validators included) and `main(argv)`
    runs with stdout and stderr captured. An exception of main propagates, traceback
    and all. TensorFlow is started first, with the test process's logical devices, so that
    a program's thread-pool settings (`_cli.op_threads`) leave it as it is."""
    import tensorflow as tf

    tf.config.list_logical_devices("CPU")
    flag_values = flags.FLAGS
    before = set(flag_values)
    sys.modules.pop(module, None)
    try:
        program = importlib.import_module(module)
        argv = flag_values([module, *args])
        out, err = io.StringIO(), io.StringIO()
        with contextlib.redirect_stdout(out), contextlib.redirect_stderr(err):
            code = program.main(argv)
        return Ran(code or 0, out.getvalue(), err.getvalue())
    finally:
        for name in set(flag_values) - before:
            if name in flag_values:   # a short name goes with its flag
                delattr(flag_values, name)
        sys.modules.pop(module, None)


def table_rows(out: str) -> list[list[str]]:
    """The cells of every Markdown table row printed in `out` (separator lines left out)."""
    return [[c.strip() for c in line.strip().strip("|").split("|")]
            for line in out.splitlines() if line.startswith("| ") and "---" not in line]
