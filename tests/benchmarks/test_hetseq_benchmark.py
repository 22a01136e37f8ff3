"""benchmarks/hetseq_benchmark.py's bad input, and HetSeq beside HetPipe and Horovod in
hetpipe_benchmark's simulate mode."""

from tests.benchmarks.binaries import run_binary, run_main


def test_a_batch_the_devices_cannot_split_evenly_is_refused_by_name():
    proc = run_binary("benchmarks.hetseq_benchmark", "--batch_size=10")
    assert proc.returncode == 2, proc.stderr[-2000:]
    assert "Traceback" not in proc.stderr
    assert "Received: --batch_size=10 for 4 devices" in proc.stderr


def test_simulate_mode_prints_hetseq_beside_hetpipe_and_horovod():
    proc = run_main("benchmarks.hetpipe_benchmark", "--mode=simulate", "--model=mlp",
                      "--cluster=paper", "--allocation=ED", "--num_waves=1", "--nm=1")
    assert proc.returncode == 0, proc.stderr[-2000:]
    line = next(l for l in proc.stdout.splitlines() if l.startswith("HetSeq"))
    assert "global batch of 512 over 16 GPUs" in line and "x Horovod" in line
    assert "x HetPipe" in line
