"""benchmarks/plan.py end to end."""

from hetpipe_tf.partitioner.plan import Plan
from tests.benchmarks.binaries import run_binary, run_main


def test_plan_prints_table_and_writes_json(tmp_path):
    out = tmp_path / "plan.json"
    proc = run_main("benchmarks.plan", "--model=small_resnet", "--devices=TITAN_V,RTX_2060",
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
    proc = run_binary("benchmarks.plan", "--devices=TITAN_V,NO_SUCH_GPU")
    assert proc.returncode != 0 and "--devices must name" in proc.stderr
    assert "TITAN_V" in proc.stderr                   # lists the known types
    proc = run_binary("benchmarks.plan", "--batch_size=0")
    assert proc.returncode != 0 and "batch_size" in proc.stderr


def test_plan_on_the_paper_cluster_reports_a_too_small_cluster():
    proc = run_binary("benchmarks.plan", "--cluster=paper", "--model=mlp",
                      "--devices=TITAN_V,TITAN_V,TITAN_V,TITAN_V,TITAN_V")
    assert proc.returncode != 0 and "no (further) device of type TITAN_V" in proc.stderr


def test_plan_cuts_inside_a_nested_backbone_and_names_the_inner_layers(tmp_path):
    out = tmp_path / "plan.json"
    proc = run_main("benchmarks.plan", "--model=gpt_decoder", "--input_size=16",
                      "--num_classes=64", "--devices=TITAN_V,TITAN_RTX,RTX_2060,QUADRO_P4000",
                      "--batch_size=8", f"--output_json={out}")
    assert proc.returncode == 0, proc.stderr[-2000:]
    plan = Plan.load(str(out))
    assert plan.num_stages == 4
    # Every stage but the last ends inside the backbone, at an inner layer named by its path.
    ends = [s.layer_names[-1] for s in plan.stages[:-1]]
    assert all(e.startswith("gpt_backbone/") for e in ends)
    assert "cuts after: " + " | ".join(ends) in proc.stdout
