"""benchmarks/pipeline_benchmark.py end to end, tiny settings."""

from tests.benchmarks.binaries import run_main


def test_pipeline_benchmark_tiny():
    proc = run_main("benchmarks.pipeline_benchmark", "--steps=2", "--repeats=1", "--warmup_steps=1",
                      "--depth=4", "--width=32", "--batch_size=16", "--nm=1,2")
    assert proc.returncode == 0, proc.stderr[-2000:]
    for text in ("2 devices give at most", "N_m=2:", "x plain", "planner's plan:",
                 "compensation none."):   # the paper's rules unless --compensation says
        assert text in proc.stdout
