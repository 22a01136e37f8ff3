"""benchmarks/process_cpu.py: a command's processes by kind, its exit status kept."""

import sys

import pytest
from absl import app

from tests.benchmarks.binaries import run_main, table_rows

_PARENT = ("import subprocess, sys; subprocess.run([sys.executable, '-m', 'timeit', '-n', '1', "
           "'import time; time.sleep(0.3)'], capture_output=True); sys.exit(3)")


def test_each_process_of_the_command_counts_in_its_kind_and_the_exit_status_is_kept():
    ran = run_main("benchmarks.process_cpu", "--interval_s=0.02", "--", sys.executable,
                   "-c", _PARENT)
    assert ran.returncode == 3, ran.stderr
    rows = {r[0]: r for r in table_rows(ran.stdout)[1:]}
    assert set(rows) == {"python -c ...", "python -m timeit"}, ran.stdout
    assert rows["python -c ..."][1] == "1" and rows["python -m timeit"][1] == "1"
    assert "2 processes" in ran.stdout and "(exit status 3)" in ran.stdout


def test_a_missing_command_is_a_usage_error():
    with pytest.raises(app.UsageError, match="Received: no command"):
        run_main("benchmarks.process_cpu")
