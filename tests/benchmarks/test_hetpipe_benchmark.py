"""benchmarks/hetpipe_benchmark.py end to end, tiny settings."""

from tests.benchmarks.binaries import run_binary


def test_run_mode_trains_and_reports():
    proc = run_binary("benchmarks.hetpipe_benchmark", "--mode=run", "--model=mlp", "--steps=3",
                      "--batch_size=16")
    assert proc.returncode == 0, proc.stderr[-2000:]
    for text in ("emulated", "images/s", "MirroredStrategy", "bytes across hosts",
                 "utilisation"):
        assert text in proc.stdout


def test_run_mode_refuses_several_virtual_workers():
    proc = run_binary("benchmarks.hetpipe_benchmark", "--mode=run", "--model=mlp",
                      "--allocation=NP")
    assert proc.returncode != 0
    assert "gives 2 virtual workers" in proc.stderr and "--mode=simulate" in proc.stderr


def test_bad_flags():
    proc = run_binary("benchmarks.hetpipe_benchmark", "--allocation=XX")
    assert proc.returncode != 0 and "allocation" in proc.stderr
    proc = run_binary("benchmarks.hetpipe_benchmark", "--speed_factors=2")
    assert proc.returncode != 0 and "--speed_factors must be numbers" in proc.stderr


def test_simulate_mode_on_the_paper_cluster():
    proc = run_binary("benchmarks.hetpipe_benchmark", "--mode=simulate", "--model=mlp",
                      "--cluster=paper", "--allocation=ED", "--placement=ed_local",
                      "--num_waves=2", "--nm=2")
    assert proc.returncode == 0, proc.stderr[-2000:]
    assert "TITAN_V" in proc.stdout and "Horovod" in proc.stdout
