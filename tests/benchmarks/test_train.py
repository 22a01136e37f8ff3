"""benchmarks/train.py (the README's main job) end to end, tiny settings."""

from tests.benchmarks.binaries import run_binary


def test_train_main_job_tiny():
    proc = run_binary("benchmarks.train", "--epochs=1", "--examples=512", "--min_accuracy=0")
    assert proc.returncode == 0, proc.stderr[-2000:]
    assert "emulated" in proc.stdout and "Final validation accuracy" in proc.stdout
    assert "bottleneck stage" in proc.stdout          # the planner's plan is printed


def test_train_rejects_bad_speed_factors():
    proc = run_binary("benchmarks.train", "--speed_factors=1.0,2")
    assert proc.returncode != 0 and "--speed_factors must be numbers in (0, 1]" in proc.stderr
