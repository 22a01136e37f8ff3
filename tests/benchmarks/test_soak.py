"""benchmarks/soak.py end to end, tiny settings (no memory or timing assertions: the
figures come from one run of the binary, docs/observe.md)."""

import re

from tests.benchmarks.binaries import run_binary, run_main


def _rows(stdout):
    return {m.group(1).strip(): (int(m.group(2).replace(",", "")), float(m.group(3)))
            for m in re.finditer(r"^(warm-up|middle|windows full \([\d,]+\)|end)\s+([\d,]+)"
                                 r"\s+([\d.]+)\s*$", stdout, re.M)}


def test_soak_prints_the_rss_figures_one_vw():
    proc = run_main("benchmarks.soak", "--minibatches=150", "--chunk=25", "--warmup=50")
    assert proc.returncode == 0, proc.stderr[-2000:]
    assert "1 VW(s) x 2 stages" in proc.stdout and "150 minibatches as 6 epochs of 25" \
        in proc.stdout
    assert "N_m=2, compensation none;" in proc.stdout   # the paper's rules by default
    rows = _rows(proc.stdout)
    assert set(rows) == {"warm-up", "middle", "end"}, proc.stdout
    assert rows["warm-up"][0] == 50 and rows["end"][0] == 150
    assert rows["warm-up"][0] < rows["middle"][0] < rows["end"][0]
    assert all(mib > 0 for _, mib in rows.values())
    assert re.search(r"growth per 1,000 minibatches, warm-up -> end: [+-][\d.]+ KiB",
                     proc.stdout), proc.stdout
    series = re.search(r"RSS \(MiB\) at every epoch end: ([\d. ]+)$", proc.stdout, re.M)
    assert series and len(series.group(1).split()) == 6
    assert "updates applied: 150;" in proc.stdout
    assert "ParameterServers.pushes" not in proc.stdout   # one VW: no parameter servers


def test_soak_prints_the_pushes_with_two_vws():
    proc = run_main("benchmarks.soak", "--minibatches=100", "--chunk=25", "--warmup=25",
                      "--virtual_workers=2")
    assert proc.returncode == 0, proc.stderr[-2000:]
    assert "2 VW(s) x 2 stages" in proc.stdout and "D=1" in proc.stdout
    assert set(_rows(proc.stdout)) == {"warm-up", "middle", "end"}, proc.stdout
    assert "updates applied: 100;" in proc.stdout
    pushes = re.search(r"ParameterServers.pushes: ([\d,]+) appended, ([\d,]+) kept",
                       proc.stdout)
    # 100 minibatches over 2 VWs at N_m = 2: about 25 waves per VW, plus final pushes.
    assert pushes and int(pushes.group(1).replace(",", "")) >= 45, proc.stdout


def test_soak_rejects_a_warmup_that_leaves_no_room():
    proc = run_binary("benchmarks.soak", "--minibatches=1000", "--chunk=500", "--warmup=800")
    assert proc.returncode != 0
    assert "--minibatches must be a multiple of --chunk" in proc.stderr, proc.stderr
    assert "Traceback" not in proc.stderr
