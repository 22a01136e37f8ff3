"""experiments/wsp_freshness.py end to end, tiny settings."""

import re

from tests.benchmarks.binaries import run_binary, run_main


def test_wsp_freshness_prints_the_table_tiny():
    proc = run_main("experiments.wsp_freshness", "--epochs=2", "--examples=240",
                      "--distances=0,8", "--optimizers=sgd", "--batch_size=16",
                      "--repeats=1")
    assert proc.returncode == 0, proc.stderr[-2000:]
    assert "N_m=2, compensation none." in proc.stdout   # the paper's rules by default
    # setting, accuracy (mean, min, max), seconds[, fresh pulls, max clock spread, wait,
    # clocks]
    rows = {m.group(1).strip(): m.groups()[1:] for m in re.finditer(
        r"^(plain Keras \(1 device\)|D=\d+ (?:before|after))\s+([\d.]+)\s+[\d.]+\s+[\d.]+"
        r"\s+\d+(?:\s+(\d+)\s+(\d+)\s+[\d.]+\s+([\d,]+))?\s*$", proc.stdout, re.M)}
    assert set(rows) == {"plain Keras (1 device)", "D=0 before", "D=0 after",
                         "D=8 before", "D=8 after"}, proc.stdout
    assert all(0.0 <= float(r[0]) <= 1.0 for r in rows.values())
    # 192 training examples / 16 = 12 minibatches per epoch, N_m = 2: about 3 waves per VW
    # per epoch, so at D = 8 every wave end of the 2 epochs has c < D: only fresh pulls
    # exchange weights inside an epoch, and the clocks stay within D + 1.
    assert int(rows["D=8 before"][1]) == 0 and int(rows["D=8 after"][1]) > 0
    assert all(int(rows[k][2]) <= d + 1 for k, d in (("D=0 before", 0), ("D=8 before", 8),
                                                      ("D=8 after", 8)))
    assert int(rows["D=0 after"][1]) == 0   # D = 0: every wave end pulls anyway


def test_wsp_freshness_rejects_an_unknown_optimizer():
    proc = run_binary("experiments.wsp_freshness", "--optimizers=sgd,rmsprop")
    assert proc.returncode != 0 and "--optimizers must name at least one of" in proc.stderr
    assert "Traceback" not in proc.stderr
