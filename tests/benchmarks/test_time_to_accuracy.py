"""benchmarks/time_to_accuracy.py end to end, tiny settings (the table's structure and
finite figures; never a timing or accuracy assertion). The spirals task needs no
scikit-learn."""

import re

import pytest

from tests.benchmarks.binaries import run_binary


def _rows(out: str) -> list[list[str]]:
    return [[c.strip() for c in line.strip().strip("|").split("|")]
            for line in out.splitlines() if line.startswith("| ") and "---" not in line]


def test_cost_mode_prints_every_compensation():
    proc = run_binary("benchmarks.time_to_accuracy", "--mode=cost", "--cost_width=16",
                      "--cost_layers=1")
    assert proc.returncode == 0, proc.stderr[-2000:]
    rows = _rows(proc.stdout)
    assert [r[0] for r in rows] == ["compensation", "none", "predict", "momentum", "both"]
    assert all(float(r[1]) > 0 for r in rows[1:])


@pytest.mark.slow
def test_time_mode_tiny_table():
    proc = run_binary("benchmarks.time_to_accuracy", "--tasks=spirals", "--optimizers=adam",
                      "--compensations=none,both", "--distances=0", "--epochs=1",
                      "--spiral_examples=256", "--width=1", "--nm1_rows=false",
                      "--target=0.01")
    assert proc.returncode == 0, proc.stderr[-2000:]
    rows = _rows(proc.stdout)
    assert rows[0][:3] == ["setting", "N_m", "s to target"]
    labels = [r[0] for r in rows[1:]]
    assert labels[0].startswith("plain Keras") and labels[1].startswith("sync DP")
    assert [l.split(", ")[-1] for l in labels[2:]] == ["none", "both"]
    for r in rows[1:]:
        assert "FAILED" not in r[1], r
        assert 0.0 <= float(r[4]) <= 1.0 and re.fullmatch(r"\d+\.\d", r[2]), r
    assert "EMULATED at 0.5x" in proc.stdout


def test_bad_compensation_is_a_usage_error():
    proc = run_binary("benchmarks.time_to_accuracy", "--compensations=magic")
    assert proc.returncode != 0
    assert "--compensations" in proc.stderr
