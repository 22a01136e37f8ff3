"""Bad input to the binaries (issue 8 point 10): one line on stderr naming what is wrong,
a non-zero exit, no traceback and no --help text before it."""

import json
import subprocess
import sys

import pytest

from hetpipe_tf.cluster.spec import Cluster, Device, Host, paper_cluster
from tests.benchmarks.binaries import ROOT, run_binary, run_main

GIB = 2**30


def _assert_one_line_error(proc, *needles, code=None):
    assert proc.returncode != 0, proc.stdout[-2000:]
    if code is not None:
        assert proc.returncode == code, proc.stderr[-2000:]
    assert "Traceback" not in proc.stderr, proc.stderr[-3000:]
    errors = [line for line in proc.stderr.splitlines()
              if line.startswith(("error: ", "usage error: "))]
    assert len(errors) == 1, proc.stderr[-3000:]
    for needle in needles:
        assert needle in errors[0], errors[0]
    assert "Received:" in errors[0]
    # absl's usage text (the module doc and the flags) is not printed before the message.
    assert "python -m benchmarks" not in proc.stdout + proc.stderr
    assert "--helpfull" not in proc.stderr
    return errors[0]


def _write(tmp_path, cluster_dict, name="cluster.json") -> str:
    path = tmp_path / name
    path.write_text(json.dumps(cluster_dict))
    return str(path)


def _paper_with_custom_type(**overrides) -> dict:
    d = paper_cluster().to_dict()
    custom = {"name": "MY_GPU", "kind": "GPU", "cores": 2000, "boost_clock_mhz": 1500.0,
              "memory_bytes": 8 * GIB, "memory_bandwidth": 4e11, **overrides}
    d["device_types"] = [custom]
    for dev in d["hosts"][0]["devices"]:
        dev["type_name"] = "MY_GPU"
    return d


@pytest.mark.parametrize("binary", [("benchmarks.plan",),
                                    ("benchmarks.hetpipe_benchmark", "--mode=simulate")])
def test_cluster_file_that_does_not_exist(binary):
    proc = run_binary(*binary, "--cluster=papr")
    _assert_one_line_error(proc, "--cluster=papr (no such file)", "'paper'", code=2)


@pytest.mark.parametrize("field,value", [("memory_bytes", 0), ("memory_bandwidth", -1e11)])
def test_custom_device_type_with_zero_memory_or_negative_bandwidth(tmp_path, field, value):
    path = _write(tmp_path, _paper_with_custom_type(**{field: value}))
    for binary in (("benchmarks.plan", "--devices=MY_GPU"),
                   ("benchmarks.hetpipe_benchmark", "--mode=simulate")):
        proc = run_binary(*binary, f"--cluster={path}")
        _assert_one_line_error(proc, path, f"{field}={value!r}", code=1)


def test_a_valid_custom_device_type_of_the_cluster_file_can_be_planned(tmp_path):
    # --devices is checked after the file registered its types, not at flag parsing.
    path = _write(tmp_path, _paper_with_custom_type())
    proc = run_main("benchmarks.plan", f"--cluster={path}", "--devices=MY_GPU,TITAN_RTX",
                      "--model=mlp", "--batch_size=8", "--num_classes=10")
    assert proc.returncode == 0, proc.stderr[-2000:]
    assert "MY_GPU" in proc.stdout and "bottleneck stage" in proc.stdout


def test_ed_on_hosts_with_unequal_device_counts(tmp_path):
    d = paper_cluster().to_dict()
    d["hosts"][0]["devices"] = d["hosts"][0]["devices"][:3]     # 3, 4, 4, 4: no common ED
    proc = run_binary("benchmarks.hetpipe_benchmark", "--mode=simulate", "--model=mlp",
                      "--allocation=ED", f"--cluster={_write(tmp_path, d)}")
    _assert_one_line_error(proc, "ED needs every host", "'host0': 3", code=1)


def test_ed_local_placement_without_ed_is_refused_before_profiling():
    for mode in ("--mode=simulate", "--mode=run"):
        proc = run_binary("benchmarks.hetpipe_benchmark", mode, "--model=resnet152",
                          "--cluster=paper" if mode == "--mode=simulate" else "--cluster=local",
                          "--allocation=NP", "--placement=ed_local")
        _assert_one_line_error(proc, "--placement=ed_local --allocation=NP", code=2)
        assert "Simulated" not in proc.stdout and "virtual worker(s)" not in proc.stdout


def test_ed_virtual_workers_with_more_devices_than_layers_on_1024_gpus(tmp_path):
    hosts = tuple(
        Host(f"host{i}", tuple(Device(f"host{i}/gpu{k}", "TITAN_V", f"host{i}",
                                      f"/job:worker/replica:0/task:{i}/device:GPU:{k}")
                               for k in range(4)), 15.75e9, task=("worker", i))
        for i in range(256))
    path = _write(tmp_path, Cluster(hosts, 7e9).to_dict())
    proc = run_binary("benchmarks.hetpipe_benchmark", "--mode=simulate", "--model=vgg19",
                      "--allocation=ED", f"--cluster={path}")
    _assert_one_line_error(proc, "virtual workers of up to 256 devices", "vgg19 has 25 layers",
                           "--allocation=NP", code=1)


def test_usage_errors_print_the_message_not_the_help():
    proc = run_binary("benchmarks.hetpipe_benchmark", "--mode=run", "--cluster=paper")
    _assert_one_line_error(proc, "--mode=run trains on the devices at hand", code=2)
    proc = run_binary("benchmarks.hetpipe_benchmark", "--mode=run", "--model=mlp",
                      "--devices=LOCAL_CPU,LOCAL_CPU,LOCAL_CPU", "--speed_factors=1,1,1")
    _assert_one_line_error(proc, "--batch_size=32 for 3 devices", code=2)
    for binary in ("benchmarks.planner_benchmark", "benchmarks.pipeline_benchmark"):
        _assert_one_line_error(run_binary(binary, "extra"), "['extra']", code=2)


def test_the_compensation_flag_lists_every_compensation_name():
    """--help lists the presets from their one home, which loads no TensorFlow."""
    code = ("import sys; from absl import flags; from benchmarks import _cli; "
            "_cli.compensation_flag('none'); print(flags.FLAGS['compensation'].help); "
            "print([m for m in ('tensorflow', 'keras') if m in sys.modules])")
    proc = subprocess.run([sys.executable, "-c", code], cwd=ROOT, capture_output=True,
                          text=True, timeout=120)
    assert proc.returncode == 0, proc.stderr[-3000:]
    help_text, loaded = proc.stdout.strip().rsplit("\n", 1)
    assert loaded == "[]", proc.stdout
    from hetpipe_tf.pipeline.compensation import PRESET_NAMES, Compensation

    assert f"({', '.join(PRESET_NAMES)};" in help_text, help_text
    assert PRESET_NAMES == ("none", "predict", "momentum", "both", "average", "all",
                            "both_dc", "both_ga")
    assert all(Compensation.parse(n).value == n for n in PRESET_NAMES)
