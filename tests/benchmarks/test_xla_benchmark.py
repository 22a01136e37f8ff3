"""benchmarks/xla_benchmark.py end to end in this process, tiny settings (structure and
finite figures; never a timing assertion)."""

import math

import pytest
from absl import app

from tests.benchmarks.binaries import run_main, table_rows


def test_xla_benchmark_tiny():
    ran = run_main("benchmarks.xla_benchmark", "--depth=2", "--width=16", "--batch=8",
                   "--steps=2", "--repeats=1", "--warmup_steps=1")
    assert ran.returncode == 0, ran.stderr[-2000:]
    rows = table_rows(ran.stdout)
    assert rows[0] == ["jit_compile", "samples/s", "ms/minibatch", "CPU ms/minibatch"]
    assert [r[0] for r in rows[1:]] == ["False", "True"]
    for row in rows[1:]:
        assert all(float(v) > 0 for v in row[1:]), row
    assert "XLA on / off: throughput" in ran.stdout
    dw = float(ran.stdout.rsplit("minibatches: ", 1)[1].split()[0])
    assert math.isfinite(dw) and dw < 1e-4   # the same training, within float tolerance


def test_xla_benchmark_refuses_more_stages_than_layers():
    with pytest.raises(app.UsageError, match="Each stage needs a layer"):
        run_main("benchmarks.xla_benchmark", "--depth=1", "--stages=3")
