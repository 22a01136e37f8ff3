"""benchmarks/hetpipe_benchmark.py end to end, tiny settings. The run mode runs in a
process of its own (MirroredStrategy's collectives; several VWs under WSP), the simulate
mode in this one."""

import json

from tests.benchmarks.binaries import run_binary, run_main


def test_run_mode_trains_and_reports():
    proc = run_binary("benchmarks.hetpipe_benchmark", "--mode=run", "--model=mlp", "--steps=3",
                      "--batch_size=16")
    assert proc.returncode == 0, proc.stderr[-2000:]
    for text in ("emulated", "images/s", "MirroredStrategy", "bytes across hosts",
                 "utilisation"):
        assert text in proc.stdout


def test_run_mode_trains_several_virtual_workers_under_wsp(tmp_path):
    proc = run_binary("benchmarks.hetpipe_benchmark", "--mode=run", "--model=mlp", "--steps=4",
                      "--batch_size=16", "--hosts=2", "--devices=LOCAL_CPU,LOCAL_CPU,LOCAL_CPU,"
                      "LOCAL_CPU", "--speed_factors=1,1,0.5,0.5", "--allocation=ED",
                      "--placement=ed_local", "--staleness=1", "--nm=2",
                      f"--trace_dir={tmp_path}")
    assert proc.returncode == 0, proc.stderr[-2000:]
    out = proc.stdout
    assert "2 virtual worker(s) by ED" in out
    # The paper's rules unless --compensation names another.
    assert "D=1, placement=ed_local, compensation=none:" in out
    # ED-local keeps parameter traffic on the node.
    assert "bytes across hosts per wave of every VW: 0 " in out
    assert "(bound D+1 = 2)" in out and "waited" in out
    trace = json.loads((tmp_path / "run_trace.json").read_text())
    vws = {e["pid"] for e in trace["traceEvents"] if e["ph"] == "X"}
    assert len(vws) == 2


def test_bad_flags():
    proc = run_binary("benchmarks.hetpipe_benchmark", "--allocation=XX")
    assert proc.returncode != 0 and "allocation" in proc.stderr
    proc = run_binary("benchmarks.hetpipe_benchmark", "--speed_factors=2")
    assert proc.returncode != 0 and "--speed_factors must be numbers" in proc.stderr
    proc = run_binary("benchmarks.hetpipe_benchmark", "--hosts=3")
    assert proc.returncode != 0 and "--hosts must divide" in proc.stderr


def test_simulate_mode_on_the_paper_cluster(tmp_path):
    proc = run_main("benchmarks.hetpipe_benchmark", "--mode=simulate", "--model=mlp",
                      "--cluster=paper", "--allocation=ED", "--placement=ed_local",
                      "--num_waves=2", "--nm=2", f"--trace_dir={tmp_path}")
    assert proc.returncode == 0, proc.stderr[-2000:]
    assert "TITAN_V" in proc.stdout and "Horovod" in proc.stdout
    assert "all-reduce on the CPU" in proc.stdout           # the paper setup's Horovod
    trace = json.loads((tmp_path / "simulate_trace.json").read_text())
    tasks = [e for e in trace["traceEvents"] if e["ph"] == "X"]
    # 4 virtual workers x 4 stages; 2 waves of N_m=2 minibatches; the last stage runs one
    # task per minibatch, the others a forward and a backward.
    assert len(tasks) == 4 * (3 * 2 + 1) * 4
    assert (tmp_path / "simulate_pipeline.png").read_bytes()[:8] == b"\x89PNG\r\n\x1a\n"


def test_paper_mode_prints_the_experiments_paper_report(monkeypatch):
    from experiments import paper, paper_goals
    seen = {}

    def fake_report(cache_dir=None):
        seen["cache_dir"] = cache_dir
        return "REPORT"
    monkeypatch.setattr(paper_goals, "report", fake_report)
    proc = run_main("benchmarks.hetpipe_benchmark", "--mode=paper")
    assert proc.returncode == 0 and proc.stdout.strip() == "REPORT"
    assert seen["cache_dir"] == paper.DEFAULT_CACHE_DIR
