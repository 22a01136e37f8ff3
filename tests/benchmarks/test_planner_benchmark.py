"""benchmarks/planner_benchmark.py end to end, tiny settings."""

from tests.benchmarks.binaries import run_binary


def test_planner_benchmark_tiny():
    proc = run_binary("benchmarks.planner_benchmark", "--models=", "--layers=20,40",
                      "--stages=2,3", "--time_limit=30")
    assert proc.returncode == 0, proc.stderr[-2000:]
    lines = [l for l in proc.stdout.splitlines() if l.strip().startswith(("20 ", "40 "))]
    assert len(lines) == 2 and all(len(l.split()) == 3 for l in lines)
