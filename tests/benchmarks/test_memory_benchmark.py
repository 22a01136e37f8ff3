"""benchmarks/memory_benchmark.py end to end with tiny flags: the table's structure, one
row per stage and setting, finite positive ratios (no memory assertions: the figures come
from the binary, docs/memory.md). Each run is a process of its own: the figures read
TensorFlow's process-wide CPU allocator statistics."""

import math
import re

from tests.benchmarks.binaries import run_binary


def _rows(stdout):
    lines = [l for l in stdout.splitlines() if l.startswith("| ")]
    header = [c.strip() for c in lines[0].strip("|").split("|")]
    return header, [dict(zip(header, (c.strip() for c in l.strip("|").split("|"))))
                    for l in lines[2:]]


def test_memory_benchmark_prints_each_stage_against_the_prediction():
    proc = run_binary("benchmarks.memory_benchmark", "--stages=2,3", "--nm=2",
                      "--optimizers=sgd,adam", "--depth=3", "--width=32", "--batch_size=8",
                      "--steps=4")
    assert proc.returncode == 0, proc.stderr[-3000:]
    assert "measured = an ACCOUNTING of the buffers each stage holds" in proc.stdout
    header, rows = _rows(proc.stdout)
    assert header[:3] == ["stages", "N_m", "optimizer"] and "ratio" in header
    settings = {(r["stages"], r["N_m"], r["optimizer"]) for r in rows}
    assert settings == {(k, "2", o) for k in ("2", "3") for o in ("sgd", "adam")}
    for k, n, o in settings:   # one row per stage, in order
        stages = [r["stage"] for r in rows if (r["stages"], r["N_m"], r["optimizer"]) == (k, n, o)]
        assert stages == [str(j) for j in range(int(k))]
    for r in rows:
        measured, predicted, ratio = (float(r[c]) for c in
                                      ("measured MiB", "predicted MiB", "ratio"))
        assert math.isfinite(ratio) and ratio > 0, r
        assert measured > 0 and predicted > 0
        # the ratio is printed from bytes; the MiB columns are rounded
        assert abs(ratio - measured / predicted) < 0.05 + 0.01 / predicted, r
        # the model's held count: N_m on every stage but the last, which holds 1
        held_model = int(r["held seen/model"].split("/")[1])
        assert held_model == (1 if int(r["stage"]) == int(r["stages"]) - 1 else int(r["N_m"]))
        # --compensation defaults to none: no prediction buffers modelled or seen
        assert r["copies model: versions / prediction"] == f"{int(r['N_m']) - 1} / 0", r
        assert r["most copies seen: versions / prediction"].endswith("/ 0.00"), r
    # the process-wide allocator line, once per setting
    assert len(re.findall(r"process \(TF CPU allocator.*peak above its pre-run level "
                          r"[\d.]+ MiB", proc.stdout)) == len(settings)


def test_memory_benchmark_counts_weight_prediction_buffers():
    """--compensation=both: the predictor's d's are sampled as their own term and the
    model charges them (PredictionMemory: N_m copies of the stage's trainable weights)."""
    proc = run_binary("benchmarks.memory_benchmark", "--stages=2", "--nm=2",
                      "--optimizers=sgd", "--depth=3", "--width=32", "--batch_size=8",
                      "--steps=4", "--compensation=both")
    assert proc.returncode == 0, proc.stderr[-3000:]
    assert "compensation=both" in proc.stdout
    _, rows = _rows(proc.stdout)
    assert [r["stage"] for r in rows] == ["0", "1"]
    for r in rows:
        assert r["copies model: versions / prediction"] == "1 / 2", r
        seen = float(r["most copies seen: versions / prediction"].split("/")[1])
        # At least the zero d of the run's start; at most 2 copies and the gate's
        # scalars (one per tensor: 0.01 of this tiny model's copy, as printed).
        assert 0 < seen <= 2.0 + 0.05, r
        assert math.isfinite(float(r["ratio"])) and float(r["ratio"]) > 0, r


def test_memory_benchmark_rejects_more_stages_than_layers():
    proc = run_binary("benchmarks.memory_benchmark", "--stages=6", "--depth=2")
    assert proc.returncode != 0
    assert "--stages must not exceed the model's layers" in proc.stderr, proc.stderr
    assert "Traceback" not in proc.stderr
