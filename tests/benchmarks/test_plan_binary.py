"""The planner binaries end to end, as a user runs them (a subprocess each)."""

import os
import subprocess
import sys

from hetpipe_tf.partitioner.plan import Plan

ROOT = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))


def _run(*args: str) -> subprocess.CompletedProcess:
    env = {**os.environ, "TF_CPP_MIN_LOG_LEVEL": "3"}
    return subprocess.run([sys.executable, "-m", *args], cwd=ROOT, env=env,
                          capture_output=True, text=True, timeout=300)


def test_plan_prints_table_and_writes_json(tmp_path):
    out = tmp_path / "plan.json"
    proc = _run("benchmarks.plan", "--model=small_resnet", "--devices=TITAN_V,RTX_2060",
                "--batch_size=8", "--num_classes=10", f"--output_json={out}")
    assert proc.returncode == 0, proc.stderr[-2000:]
    assert "emulated" in proc.stdout                  # local devices are labelled as such
    assert "bottleneck stage" in proc.stdout and "memory GiB used/avail" in proc.stdout
    plan = Plan.load(str(out))
    assert plan.model_name == "small_resnet" and plan.batch_size == 8
    assert sorted(s.device_type for s in plan.stages) == ["RTX_2060", "TITAN_V"]
    for s in plan.stages:
        assert s.device in proc.stdout


def test_plan_rejects_bad_flags_before_work():
    proc = _run("benchmarks.plan", "--devices=TITAN_V,NO_SUCH_GPU")
    assert proc.returncode != 0 and "--devices must name" in proc.stderr
    assert "TITAN_V" in proc.stderr                   # lists the known types
    proc = _run("benchmarks.plan", "--batch_size=0")
    assert proc.returncode != 0 and "batch_size" in proc.stderr


def test_plan_on_the_paper_cluster_reports_a_too_small_cluster():
    proc = _run("benchmarks.plan", "--cluster=paper", "--model=mlp",
                "--devices=TITAN_V,TITAN_V,TITAN_V,TITAN_V,TITAN_V")
    assert proc.returncode != 0 and "no (further) device of type TITAN_V" in proc.stderr


def test_planner_benchmark_tiny():
    proc = _run("benchmarks.planner_benchmark", "--models=", "--layers=20,40",
                "--stages=2,3", "--time_limit=30")
    assert proc.returncode == 0, proc.stderr[-2000:]
    lines = [l for l in proc.stdout.splitlines() if l.strip().startswith(("20 ", "40 "))]
    assert len(lines) == 2 and all(len(l.split()) == 3 for l in lines)
