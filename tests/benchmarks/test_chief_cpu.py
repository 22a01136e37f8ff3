"""benchmarks/chief_cpu.py end to end on real server processes, tiny setting (1 VW, 2
minibatches): one table row with HetPipe's chief CPU and calls per minibatch beside
ParameterServerStrategy's, and the cluster-against-one-process ratios. main runs in this
process; it starts the measuring chiefs and the servers as processes of their own (a
chief's TensorFlow context is connected to its cluster for good). No timing assertions
(the figures come from one run of the binary)."""

import re

import pytest
from absl import flags

from tests.benchmarks.binaries import run_main

_ROW = re.compile(r"^\s*(\d+)" + r"\s+([\d.]+)" * 11 + r"$")


def test_one_row_per_vw_count_with_pss_beside():
    ran = run_main("benchmarks.chief_cpu", "--virtual_workers=1", "--minibatches=2",
                   "--params=2000", "--batch_size=4", "--steps_per_function=2",
                   "--steps_per_execution=2", "--breakdown")
    lines = ran.stdout.strip().splitlines()
    assert lines[0].startswith("setting: V VWs x 1 stage") and "K=2" in lines[0], ran.stdout
    assert "Keras steps_per_execution 2" in lines[0], lines[0]
    assert "chief CPU ms/mb" in lines[1] and "PSS K" in lines[1] and "wall eff" in lines[1]
    row = _ROW.match(lines[2])
    assert row, ran.stdout
    v, chief, pss1, pssk, calls, pss1_calls, pssk_calls, cluster, local, cpu_eff, wall_eff, \
        pss_cluster = (float(g) for g in row.groups())
    assert v == 1 and chief > 0 and cluster >= chief and local > 0, ran.stdout
    assert pss1 > 0 and pss_cluster > 0 and cpu_eff > 0 and wall_eff > 0, ran.stdout
    # Every HetPipe minibatch makes at least its stage's call and its update's (one VW),
    # and Keras' step a call per 2 minibatches; PSS makes one scheduled call a
    # minibatch, one per K = 2 in the K column.
    assert calls >= 2 and pss1_calls == 1.0 and pssk_calls == 0.5, ran.stdout
    # --breakdown: the chief's hand-offs (a stage's call waits for its reply at least),
    # PSS's beside; its CPU by thread.
    switches = re.search(r"chief voluntary context switches per minibatch: (\d+) \(PSS 1 "
                         r"(\d+), PSS K ([\d.]+)\)", ran.stdout)
    assert switches and int(switches[1]) >= 1, ran.stdout
    assert "); by live thread: " in ran.stdout, ran.stdout
    assert "chief CPU ms per minibatch by thread: " in ran.stdout, ran.stdout


def test_bad_vw_counts_are_refused_by_absl():
    with pytest.raises(flags.IllegalFlagValueError, match="--virtual_workers must list"):
        run_main("benchmarks.chief_cpu", "--virtual_workers=0")


def _per_minibatch_calls(vws: int, minibatches: int, n_m: int = 1) -> dict[str, float]:
    """The calls a minibatch of the chief of a cluster job (`vws` one-stage VWs on
    `tf.distribute.Server`s, N_m = `n_m`, D = 1) by op and calling function (the calling
    line's number left out), from benchmarks/chief_cpu.py's hetpipe measurement. Every
    task is served by one process (one TensorFlow start-up): what the chief calls does not
    depend on how the tasks are grouped into processes."""
    import json
    import subprocess
    import sys

    from hetpipe_tf.cluster.serve import start_local_servers
    from tests.benchmarks.binaries import ROOT

    with start_local_servers({"worker": vws, "ps": 1}, own_process=()) as servers:
        info = {"cluster": servers.cluster, "pids": list(set(servers.pids))}
        proc = subprocess.run(
            [sys.executable, "-m", "benchmarks.chief_cpu", "--mode=hetpipe",
             f"--virtual_workers={vws}", f"--minibatches={minibatches}", "--params=2000",
             f"--n_m={n_m}",
             "--batch_size=4", "--breakdown", json.dumps(info)],
            cwd=ROOT, capture_output=True, text=True, timeout=600)
    assert proc.returncode == 0, proc.stderr[-3000:]
    by_op = json.loads(proc.stdout.strip().splitlines()[-1])["by_op"]
    out: dict[str, float] = {}
    for op, c in by_op.items():
        key = re.sub(r"\.py:\d+ ", ".py ", op)
        out[key] = out.get(key, 0.0) + c
    return out


def test_the_chiefs_calls_every_minibatch_of_two_vws():
    """Calls, not time: what the chief asks TensorFlow to run each minibatch of 2 one-stage
    VWs (docs/cluster_jobs.md "What keeps the chief on the per-minibatch path"). Each VW's
    stage applies its update and updates its own metric state inside its task's call
    (strategy/vw_metrics.py), whose one reply (the state) is the minibatch's only read; a
    call made every minibatch that is not listed here fails this test."""
    calls = _per_minibatch_calls(2, 8)
    every = {op: c for op, c in calls.items() if c >= 0.5}   # run boundaries: 1/16 each
    expected_once = [
        "compiled __inference_multi_step_on_iterator @ guards.py train_function",
        "eager op OptionalHasValue @ guards.py train_function",
        "eager op OptionalGetValue @ guards.py train_function",
        "compiled __inference_function @ weights.py apply_in_task",
        "host read numpy @ runtime.py _run_queued_in_one_call",   # the VW's metric state
        "compiled __inference_function @ server.py push",
    ]
    at_most_once = [   # the pull's rebase and w_global's snapshot: not after every push
        "compiled __inference_function @ weights.py rebase",
        "compiled __inference_function @ server.py __call__",
    ]
    for op in expected_once:
        assert calls.get(op) == 1.0, (op, every)
    assert set(every) <= set(expected_once) | set(at_most_once), every
    # server.py's __call__ also counts the runs' starts and ends (w_global copied to and
    # from the model, pulled by each VW): a few calls a run of 16 minibatches.
    assert all(calls.get(op, 0.0) <= 1.5 for op in at_most_once), every
    # No update of its own: it runs inside the stage's task.
    assert not [op for op in calls if op.endswith("weights.py apply")], calls
    # No metrics update or logs read of their own: the logs of this model (its loss alone)
    # are computed from the VWs' states on the host, without a call.
    assert not [op for op in calls if "update_metrics" in op or "transport.py" in op
                or "vw_metrics.py logs" in op], calls


def test_a_wave_of_a_vw_among_two_is_one_call_and_one_read_on_servers():
    """N_m = 4: each VW's stage waits for its wave and runs it in one call, whose reply (the
    VW's metric state) is read once (pipeline/runtime.py `_wave_rest`). Of a timed fit of
    32 minibatches split between the 2 VWs as they take them, whole waves make 1/4 call a
    minibatch and a run's short last wave one a minibatch: at most 12 calls (VWs of 15 and
    17 minibatches: 3 + 3 + 4 + 1 = 11; 13 and 19: 3 + 1 + 4 + 3 = 11), 0.375 a minibatch.
    A stage that ran what was queued made about 0.86 of each in chief_cpu's runs."""
    calls = _per_minibatch_calls(2, 16, n_m=4)
    for op in ("compiled __inference_function @ weights.py apply_in_task",
               "host read numpy @ runtime.py _run_queued_in_one_call"):
        assert 0.25 <= calls.get(op, 0.0) <= 0.375, (op, calls)
