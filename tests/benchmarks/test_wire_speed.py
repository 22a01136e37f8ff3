"""benchmarks/wire_speed.py end to end on real server processes, tiny setting: one table
row group per (model, N_m) with both throughputs and their ratio, and each worker's link
to the ps carrying at least what WSP needs (one push and one pull of the VW's parameters
a wave), and the calls per minibatch of the chief and of the one process. No timing
assertions (the figures come from one run of the binary)."""

import re

from tests.benchmarks.binaries import run_binary

_ROW = re.compile(r"^\s*([\d,]+)\s+(\d+)\s+([\d.]+)\s+([\d.]+)\s+([\d.]+)\s+([\d.]+)\s+"
                  r"([\d.]+)\s+(\S+)\s+([\d.]+)\s+([\d.]+)\s+(\S+)$")
_LINK = re.compile(r"^\s+(\S+-\S+)\s+([\d.]+)\s+([\d.]+)\s+(\S+)$")


def test_table_and_bytes_against_the_wsp_minimum():
    proc = run_binary("benchmarks.wire_speed", "--params=20000", "--n_m=2",
                      "--minibatches=4", "--batch_size=8")
    assert proc.returncode == 0, proc.stderr[-3000:]
    lines = proc.stdout.strip().splitlines()
    assert lines[0].startswith("setting: 2 VWs x 1 stage") and "D=1" in lines[0], proc.stdout
    assert "compensation none" in lines[0], lines[0]   # the paper's rules by default
    assert "ratio" in lines[1] and "WSP min MB" in lines[1] and "CPU ms" in lines[1]
    head = _ROW.match(lines[2])
    assert head, proc.stdout
    assert int(head.group(2)) == 2 and float(head.group(3)) > 0 and float(head.group(4)) > 0
    assert float(head.group(6)) > 0 and float(head.group(7)) > 0   # CPU ms per minibatch
    links = {head.group(8): (float(head.group(9)), float(head.group(10)))}
    by_task = [line for line in lines[3:] if "cluster CPU ms by task:" in line]
    assert len(by_task) == 1, proc.stdout
    for task in ("chief", "ps0", "worker0", "worker1"):
        assert re.search(rf"\b{task} [\d.]+", by_task[0]), by_task[0]
    calls = [line for line in lines[3:] if "calls per minibatch:" in line]
    assert [c.split(" calls")[0].strip() for c in calls] == ["chief", "one process"], calls
    for c in calls:
        m = re.search(r"calls per minibatch: ([\d.]+) \(compiled ([\d.]+), eager op "
                      r"([\d.]+), host read ([\d.]+)\); functions traced in the timed "
                      r"fit: (\d+)$", c)
        assert m, c
        # Every minibatch makes at least its stage's call and the Keras step's.
        assert float(m.group(2)) >= 2 and abs(float(m.group(1)) - sum(
            float(m.group(i)) for i in (2, 3, 4))) <= 0.3, c   # each figure rounded
    for line in lines[3:]:
        if line in by_task or line in calls:
            continue
        m = _LINK.match(line)
        assert m, line
        links[m.group(1)] = (float(m.group(2)), float(m.group(3)))
    for worker in ("worker0", "worker1"):
        got, minimum = links[f"ps0-{worker}"]
        # Printed in MB with 3 decimals: the 20k-parameter model's minimum is 0.04 MB.
        assert minimum > 0 and got >= minimum, proc.stdout
        assert f"chief-{worker}" in links


def test_bad_flags_end_with_one_line():
    proc = run_binary("benchmarks.wire_speed", "--n_m=0")
    assert proc.returncode != 0 and "Traceback" not in proc.stderr
    assert "--n_m must list positive integers" in proc.stderr


def test_bad_compensation_ends_with_one_line():
    proc = run_binary("benchmarks.wire_speed", "--compensation=magic")
    assert proc.returncode == 2 and "Traceback" not in proc.stderr
    assert "--compensation must name a hetpipe_tf Compensation" in proc.stderr
    assert "Received: --compensation=magic" in proc.stderr and "both_ga" in proc.stderr
