"""benchmarks/schedule_benchmark.py end to end, tiny settings (a process of its own: its
memory part reads TensorFlow's process-wide CPU allocator statistics). One M (2): each part
runs and prints its table; the figures are the binary's."""

from tests.benchmarks.binaries import run_binary


def test_schedule_benchmark_tiny():
    proc = run_binary("benchmarks.schedule_benchmark", "--stages=2", "--micro_batches=2",
                      "--steps=2", "--repeats=1", "--warmup_steps=1", "--depth=2",
                      "--width=16", "--batch_size=8", "--memory_batch_size=8")
    assert proc.returncode == 0, proc.stderr[-2000:]
    for text in ("measured bubble", "| 2 | ONE_F_ONE_B | 2 ", "vs HETPIPE", "vs M=1",
                 "predicted MiB", "EMULATED",
                 "compensation none."):   # HETPIPE's rows by the paper's rules
        assert text in proc.stdout, text


def test_schedule_benchmark_refuses_a_micro_batch_count_that_does_not_divide():
    proc = run_binary("benchmarks.schedule_benchmark", "--micro_batches=3", "--batch_size=8")
    assert proc.returncode != 0 and "must divide --batch_size" in proc.stderr
