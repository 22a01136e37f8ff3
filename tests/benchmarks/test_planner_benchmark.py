"""benchmarks/planner_benchmark.py end to end, tiny settings: both methods on every case,
with the same bottleneck, and the DP's proof printed."""

import pytest

from tests.benchmarks.binaries import run_binary, run_main


def test_planner_benchmark_tiny():
    proc = run_main("benchmarks.planner_benchmark", "--models=", "--layers=20,40",
                      "--stages=2,3", "--methods=dp,milp", "--time_limit=30")
    assert proc.returncode == 0, proc.stderr[-2000:]
    rows = [l.split() for l in proc.stdout.splitlines()
            if l.strip().startswith(("20 ", "40 "))]
    # layers, stages, orders, method, seconds, proof..., bottleneck ms, solver...
    assert len(rows) == 8, proc.stdout
    by_case: dict[tuple[str, str], dict[str, list[str]]] = {}
    for row in rows:
        by_case.setdefault((row[0], row[1]), {})[row[3]] = row
    assert sorted(by_case) == [(l, k) for l in ("20", "40") for k in ("2", "3")]
    for case in by_case.values():
        dp, milp = case["dp"], case["milp"]
        assert dp[5] == "optimal" and dp[7] == "dp"
        assert milp[5].startswith("gap<=") and milp[7].startswith("milp")
        # the same bottleneck (ms), to the MILP's gap
        assert float(dp[6]) == pytest.approx(float(milp[6]), rel=1e-5) and float(dp[6]) > 0


def test_planner_benchmark_rejects_an_unknown_method():
    proc = run_binary("benchmarks.planner_benchmark", "--models=", "--methods=simplex")
    assert proc.returncode != 0 and "--methods" in proc.stderr
