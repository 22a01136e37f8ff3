"""benchmarks/chief_traffic.py end to end on real server processes, small settings: the
data path of one pipelined VW stays off the chief (no timing assertions; the figures come
from one run of the binary, docs/state.md)."""

import re

from tests.benchmarks.binaries import run_binary


def _figures(stdout):
    m = re.search(r"chief per minibatch: sent ([\d,]+) bytes \(([\d.]+) model sizes\), "
                  r"received ([\d,]+) bytes \(([\d.]+) model sizes\)", stdout)
    assert m, stdout
    return float(m.group(2)), float(m.group(4))


def test_one_vw_sends_no_model_sized_traffic_through_the_chief():
    proc = run_binary("benchmarks.chief_traffic", "--minibatches=6", "--params=400000")
    assert proc.returncode == 0, proc.stderr[-2000:]
    sent, received = _figures(proc.stdout)
    # Before the stages applied their own updates, about 1 model size went each way per
    # minibatch; what remains is the input batch (the chief reads the dataset).
    assert sent < 0.2 and received < 0.2, proc.stdout
    assert "chief per run:" in proc.stdout and "input batch:" in proc.stdout
    assert "Adam, compensation none;" in proc.stdout   # the paper's rules by default


def test_bad_flags_end_with_one_line():
    proc = run_binary("benchmarks.chief_traffic", "--virtual_workers=3")
    assert proc.returncode != 0
    assert "Traceback" not in proc.stderr
