"""experiments/time_to_accuracy.py end to end, tiny settings (the table's structure and
finite figures; never a timing or accuracy assertion). The spirals task needs no
scikit-learn."""

import re

import pytest

from tests.benchmarks.binaries import run_binary, run_main, table_rows


def test_cost_mode_prints_every_compensation():
    proc = run_main("experiments.time_to_accuracy", "--mode=cost", "--cost_width=16",
                      "--cost_layers=1", "--cost_rounds=20")
    assert proc.returncode == 0, proc.stderr[-2000:]
    rows = table_rows(proc.stdout)
    assert [r[0] for r in rows] == ["compensation", "none", "predict", "momentum", "both",
                                    "average", "all", "both_dc", "both_ga"]
    assert all(float(r[1]) > 0 for r in rows[1:])


@pytest.mark.slow
def test_time_mode_tiny_table():
    proc = run_main("experiments.time_to_accuracy", "--tasks=spirals", "--optimizers=adam",
                      "--compensations=all", "--distances=0", "--epochs=1",
                      "--spiral_examples=128", "--width=1", "--nm1_rows=false",
                      "--schedules=1f1b", "--target=0.01")
    assert proc.returncode == 0, proc.stderr[-2000:]
    rows = [r for r in table_rows(proc.stdout) if len(r) == 7]   # not HetSeq's shares table
    assert rows[0][:3] == ["setting", "N_m", "s to target"] and rows[0][6] == "D"
    labels = [r[0] for r in rows[1:]]
    assert labels[0].startswith("plain Keras") and labels[1].startswith("sync DP")
    # Sync DP summed (the linear scaling rule) and averaged (MirroredStrategy's step).
    assert labels[2] == "sync DP 4 VWs x 1 stage, N_m=1, D=0, averaged", labels
    # The defaults row names what the strategy chose; then the compensation, 1F1B, HetSeq.
    assert labels[3] == "HetPipe NP 2 VWs (planner), defaults (both)", labels
    assert labels[4].endswith("D=0, all")
    assert labels[5].startswith("1F1B") and labels[6].startswith("HetSeq")
    # The defaults: N_m within min(Max_m, k) = 2 as the time-to-accuracy rule picks, D = 0.
    assert rows[4][1] in ("1", "2") and rows[4][6] == "0"
    assert rows[3][1] == "1" and rows[6][1] == "1" and rows[7][1] == "1"   # synchronous: N_m = 1
    for r in rows[1:]:
        assert "FAILED" not in r[1], r
        assert 0.0 <= float(r[4]) <= 1.0 and re.fullmatch(r"\d+\.\d", r[2]), r
    assert "EMULATED at 0.5x" in proc.stdout


def test_bad_compensation_is_a_usage_error():
    proc = run_binary("experiments.time_to_accuracy", "--compensations=magic")
    assert proc.returncode != 0
    assert "--compensations" in proc.stderr
