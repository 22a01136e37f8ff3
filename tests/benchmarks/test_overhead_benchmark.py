"""benchmarks/overhead_benchmark.py end to end, tiny settings (structure and finite positive
figures; never a timing assertion). A process of its own: its MirroredStrategy rows clash
with another MirroredStrategy's collectives run earlier in the same process."""

import math
import re

from tests.benchmarks.binaries import run_binary


def _figures(line: str) -> list[float]:
    return [float(v) for v in re.findall(r"-?\d+\.\d+", line)]


def test_overhead_benchmark_tiny():
    proc = run_binary("benchmarks.overhead_benchmark", "--steps=2", "--repeats=1",
                      "--warmup_steps=1", "--small_width=8", "--small_batch=8",
                      "--large_depth=2", "--large_width=16", "--large_batch=8",
                      "--large_nm=2", "--large_splits=1")
    assert proc.returncode == 0, proc.stderr[-2000:]
    out = proc.stdout
    for k in (1, 2, 4):
        line = next(l for l in out.splitlines() if l.strip().startswith(f"{k} stage(s), N_m={k}"))
        ms, _lo, _hi, overhead, ratio = _figures(line)
        assert ms > 0 and ratio > 0 and math.isfinite(overhead), line
    goals = [l for l in out.splitlines() if "GOAL" in l]
    assert len(goals) == 4, out
    for line in goals:
        figures = _figures(line)
        assert figures and all(math.isfinite(f) and f > 0 for f in figures), line
    assert "ceiling" in out and "MirroredStrategy" in out
    assert "compensation none in every HetPipe setting" in out   # the paper's rules


def test_overhead_benchmark_rejects_bad_parts():
    proc = run_binary("benchmarks.overhead_benchmark", "--parts=huge")
    assert proc.returncode != 0
    assert "--parts" in proc.stderr
