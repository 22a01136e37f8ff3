"""experiments/paper_time_to_accuracy.py: its decisions (the row set, epochs to target, the
synchronous rows' virtual time, the parameter placement the virtual clock is given), the
refusal of bad flags, and one tiny run end to end (the table's structure and the
arithmetic between its columns; no accuracy assertion)."""

import pytest

from experiments import _paper_tta as tta
from experiments._study import to_target
from experiments._tta_estimate import estimate_rows, sooner
from hetpipe_tf.sim import VirtualClock
from tests.benchmarks.binaries import run_binary, run_main, table_rows


def test_row_set_has_every_configuration_once_in_order():
    rows = tta.row_set(["NP", "ED-local"], [0, 4], ["none", "default"], ["gpipe", "1f1b"])
    kinds = [r.kind for r in rows]
    assert kinds[:4] == [tta.Kind.HOROVOD, tta.Kind.HETSEQ, tta.Kind.GPIPE,
                         tta.Kind.ONE_F_ONE_B]
    hetpipe = rows[4:]
    assert len(hetpipe) == 2 * 2 * 2 and all(r.kind is tta.Kind.HETPIPE for r in hetpipe)
    assert len({r.label for r in rows}) == len(rows)
    assert hetpipe[0].label == "HetPipe NP, D=0, none"
    assert hetpipe[-1].label == "HetPipe ED-local, D=4, default"
    assert [r.kind for r in tta.row_set([], [0], ["none"], [])] == [tta.Kind.HOROVOD,
                                                                     tta.Kind.HETSEQ]
    assert [r.kind.synchronous for r in rows] == [True] * 4 + [False] * 8


def test_the_pick_row_names_its_choice():
    row = tta.Row(tta.Kind.HETPIPE, "ED-local", 4, "default", n_m=3, picked=True)
    assert row.label == "HetPipe pick: ED-local, N_m=3, D=4, default"
    assert not row.kind.synchronous


def test_the_pick_simulates_every_candidate_on_the_paper_cluster():
    """tta.pick: one candidate per policy x N_m 1..k x D, each with the virtual clock's
    simulated time for that policy's plans and placement; the least predicted time wins."""
    from hetpipe_tf.cluster.spec import paper_cluster
    from hetpipe_tf.models import skip_net
    from hetpipe_tf.sim import VirtualClock, stage_param_bytes

    cluster = paper_cluster()
    task = tta.Task("skip", None, None, None, None, lambda: skip_net(0), "")
    profile = tta.task_profile(task, 8)
    got = tta.pick(profile, cluster, ["ED-local"], [0, 4], "both", 3.0, 100, num_waves=4)
    k = max(p.num_stages for p in tta.hetpipe_plans(profile, cluster, "ED-local")[0])
    assert [(c.candidate.n_m, c.candidate.clock_distance) for c in got.predictions] == [
        (n, d) for n in range(1, k + 1) for d in (0, 4)]
    assert got.best.seconds == min(p.seconds for p in got.predictions)
    plans, shares = tta.hetpipe_plans(profile, cluster, "ED-local", 2)
    layer_bytes = [la.trainable_param_bytes for la in profile.layers]
    r = VirtualClock(cluster, placement=shares).simulate(
        plans, 2, 4, [stage_param_bytes(p, layer_bytes) for p in plans], 4)
    (two,) = [p for p in got.predictions if p.candidate.n_m == 2
              and p.candidate.clock_distance == 4]
    assert two.candidate.seconds_per_minibatch == pytest.approx(1 / r.minibatches_per_s)


def test_epochs_to_target_is_the_first_epoch_at_or_above_it():
    hist = [(1.0, 0.5), (2.0, 0.95), (3.0, 0.99), (4.0, 0.9)]
    assert to_target(hist, 0.95) == (2.0, 2)
    assert to_target(hist, 0.96) == (3.0, 3)
    assert to_target(hist, 0.999) == (None, None)
    assert to_target([], 0.1) == (None, None)


def test_synchronous_rows_time_is_steps_times_the_step():
    hist = tta.sync_history([0.3, 0.96, 0.97], steps_per_epoch=11, step_s=0.005)
    assert [a for _, a in hist] == [0.3, 0.96, 0.97]
    assert to_target(hist, 0.95) == (pytest.approx(2 * 11 * 0.005), 2)
    assert tta.global_batch(tta.Row(tta.Kind.HOROVOD), 8, 4, 16) == 128
    assert tta.global_batch(tta.Row(tta.Kind.HETSEQ), 8, 4, 16) == 128
    assert tta.global_batch(tta.Row(tta.Kind.GPIPE, "ED"), 8, 4, 16) == 32
    with pytest.raises(ValueError, match="HetPipe"):
        tta.global_batch(tta.Row(tta.Kind.HETPIPE, "NP"), 8, 4, 16)
    assert tta.scaled(("SGD", {"learning_rate": 0.01, "momentum": 0.9}), 16) == (
        "SGD", {"learning_rate": 0.16, "momentum": 0.9})


def test_estimate_is_epochs_times_the_time_per_epoch_against_horovod():
    hv, hp = tta.Row(tta.Kind.HOROVOD), tta.Row(tta.Kind.HETPIPE, "ED-local", 0, "none")
    never = tta.Row(tta.Kind.HETPIPE, "NP", 0, "none")
    rows = estimate_rows({hv: 4, hp: 6, never: None},
                         {"vgg19": {hv: 200.0, hp: 600.0, never: 500.0}})
    assert rows[0][:2] == ("configuration", "epochs (small task)")
    hours = lambda e, rate: e * tta.IMAGENET_TRAIN_IMAGES / rate / 3600  # noqa: E731
    assert rows[1][3] == f"{hours(4, 200):.1f}" and rows[1][4] == ""
    assert rows[2][3] == f"{hours(6, 600):.1f}" and rows[2][4] == "50% sooner"
    assert rows[3][1] == "-" and rows[3][3] == "-" and rows[3][4] == ""
    assert sooner(3.0, 2.0) == "50% later"


def test_placement_ed_local_keeps_each_stage_on_its_host():
    from hetpipe_tf.cluster.spec import paper_cluster
    from hetpipe_tf.models import skip_net

    cluster = paper_cluster()
    task = tta.Task("skip", None, None, None, None, lambda: skip_net(0), "")
    profile = tta.task_profile(task, 8)
    plans, shares = tta.hetpipe_plans(profile, cluster, "ED-local")
    assert len(plans) == 4 and all(p.n_m == max(q.num_stages for q in plans) for p in plans)
    for p, per_stage in zip(plans, shares):
        for s, st in zip(p.stages, per_stage):
            assert [h for h, _ in st] in ([cluster.device(s.device).host], [])
            assert sum(f for _, f in st) == pytest.approx(1.0) or not st
    _, default = tta.hetpipe_plans(profile, cluster, "ED", n_m=2)
    hosts = {h for vw in default for st in vw for h, _ in st}
    assert len(hosts) > 1   # DEFAULT: layers round-robin over one PS per host
    clock = VirtualClock(cluster, placement=shares)
    vws = clock.virtual_workers(plans, [[1000] * p.num_stages for p in plans])
    assert [[sh.host for sh in s.shards] for s in vws[0].stages] == [
        [h for h, _ in st] for st in shares[0]]


def test_bad_flags_are_refused_before_training():
    for flag in ("--policies=XY", "--compensations=magic", "--tasks=imagenet",
                 "--distances=-1"):
        proc = run_binary("experiments.paper_time_to_accuracy", flag)
        assert proc.returncode != 0, flag
        assert flag.split("=")[0] in proc.stderr, (flag, proc.stderr[-500:])
        assert "done:" not in proc.stdout


def test_tiny_run_prints_the_rows_with_consistent_times():
    proc = run_main("experiments.paper_time_to_accuracy", "--tiny", "--target=0.01")
    assert proc.returncode == 0, proc.stderr[-2000:]
    rows = table_rows(proc.stdout)
    header = ["configuration", "N_m", "samples / step", "virtual us / sample",
              "virtual ms to target", "epochs to target", "final acc"]
    candidates, rows = rows[:rows.index(header)], rows[rows.index(header):]
    # The defaults' pick first: NP's and ED-local's N_m 1..4 at D = 0 and 4, one picked
    # (allocation, N_m and D jointly), then trained as a row.
    assert candidates[0][:3] == ["candidate", "N_m", "D"]
    assert [(r[0], r[1], r[2]) for r in candidates[1:]] == [
        (p, str(n), d) for p in ("NP", "ED-local") for n in range(1, 5) for d in ("0", "4")]
    (best,) = [r for r in candidates[1:] if r[-1] == "picked"]
    assert min(float(r[5]) for r in candidates[1:]) == float(best[5])
    assert (f"Picked: allocation {best[0]}, N_m = {best[1]}, D = {best[2]}: the least "
            "predicted virtual time to target of 16 candidates") in proc.stdout
    picked = f"HetPipe pick: {best[0]}, N_m={best[1]}, D={best[2]}, default (both)"
    assert [r[0] for r in rows[1:]] == ["Horovod 16 GPUs, equal batches",
                                        "HetSeq 16 GPUs, shares by speed", picked,
                                        "HetPipe NP, D=0, none"]
    assert rows[3][1] == best[1]
    assert f"{picked[:-7]}: predicted {best[5]} ms" in proc.stdout
    assert "x sooner" in proc.stdout   # measured, against Horovod's
    rows = rows[:3] + rows[4:]
    for r in rows[1:]:
        assert r[5] == "1" and 0 <= float(r[6]) <= 1 and float(r[3]) > 0, r
    # A synchronous row: epochs x (256 // G) steps x (G x s/sample).
    g = int(rows[1][2])
    assert float(rows[1][4]) == pytest.approx((256 // g) * g * float(rows[1][3]) / 1e3,
                                              rel=1e-2)
    assert rows[3][1] == "4" and float(rows[3][4]) > 0   # HetPipe: N_m = its 4 stages
    assert "virtual clock" in proc.stdout and "ESTIMATE" not in proc.stdout
