"""experiments/time_to_accuracy.py --mode=recurrent end to end, tiny settings (the table's
structure and finite figures; no accuracy assertion): what the default compensation is
compared with on recurrent models (docs/convergence.md "The defaults")."""

import math

from tests.benchmarks.binaries import run_main, table_rows


def test_recurrent_mode_prints_plain_default_and_none():
    proc = run_main("experiments.time_to_accuracy", "--mode=recurrent",
                    "--recurrent_workloads=tagger", "--recurrent_optimizers=rmsprop",
                    "--recurrent_settings=plain,default,none", "--recurrent_examples=64",
                    "--epochs=2")
    assert proc.returncode == 0, proc.stderr[-2000:]
    rows = table_rows(proc.stdout)
    assert rows[0] == ["workload", "optimizer", "setting", "loss per epoch", "last vs none"]
    assert [r[2] for r in rows[1:]] == ["plain", "default (both)", "none"]
    for r in rows[1:]:
        per_epoch = [float(v) for v in r[3].split(" / ")]
        assert len(per_epoch) == 2 and all(math.isfinite(v) for v in per_epoch), r
    assert rows[3][4] == "+0.000"
