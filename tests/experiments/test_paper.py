"""simulate_scenario and the paper-reproduction helpers on a tiny synthetic profile."""

import pytest

from hetpipe_tf.cluster.spec import paper_cluster
from hetpipe_tf.partitioner.profile import LayerCost, ModelProfile
from experiments import paper
from hetpipe_tf.sim.scenario import ScenarioResult, simulate_scenario, single_device_samples_per_s

SPEED = {"TITAN_V": 1.0, "TITAN_RTX": 0.9, "RTX_2060": 2.3, "QUADRO_P4000": 2.8}
MB = 1_000_000


def tiny_profile(num_layers=8, batch_size=32):
    layers = tuple(
        LayerCost(name=f"l{i}", time_s={t: (2 + i % 3) * 1e-3 * s for t, s in SPEED.items()},
                  flops=0, bytes_accessed=3 * ((1 + i % 4) * MB + 2 * MB),
                  param_bytes=(1 + i % 4) * MB,
                  trainable_param_bytes=(1 + i % 4) * MB, activation_bytes=MB)
        for i in range(num_layers))
    return ModelProfile(model_name="tiny", batch_size=batch_size, layers=layers,
                        cut_bytes=(MB,) * (num_layers - 1),
                        time_source={t: "estimated" for t in SPEED})


def test_scenario_ed_local_runs_and_moves_no_parameters_across_hosts():
    profile = tiny_profile()
    r = simulate_scenario(profile, paper_cluster(), "ED", "ed_local", n_m=2, num_waves=3)
    assert isinstance(r, ScenarioResult)
    assert r.samples_per_s > 0
    assert r.compositions == ("VRGQ",) * 4
    assert r.distinct_plans == 1                      # identical VWs share one plan
    assert r.sim.param_bytes_inter_host == 0          # ED-local: every PS is local
    assert r.sim.param_bytes_intra_host > 0
    assert r.horovod.samples_per_s > 0
    assert len(r.utilisation) == 4 and all(len(u) == 4 for u in r.utilisation)
    assert all(0 < u <= 1 for vw in r.utilisation for u in vw)
    assert len(r.waiting_s) == 4 and len(r.idle_s[0]) == 4
    # each VW's plan is on its own devices
    for plan, vw in zip(r.plans, [tuple(h.devices[i] for h in paper_cluster().hosts)
                                  for i in range(4)]):
        assert set(plan.devices) == {d.name for d in vw}
    assert "HetPipe" in r.table() and "Horovod" in r.table()

    default = simulate_scenario(profile, paper_cluster(), "ED", "default", n_m=2, num_waves=3)
    assert default.sim.param_bytes_inter_host > 0


def test_scenario_on_one_host_moves_nothing_across_hosts_and_picks_max_n_m():
    profile = tiny_profile()
    cluster = paper.subcluster("V")
    r = simulate_scenario(profile, cluster, "ED", "ed_local", num_virtual_workers=1,
                          num_waves=2, limit=6)
    assert r.n_m == 6                                  # largest that fits (capped by limit)
    assert r.bytes_across_hosts_per_minibatch == 0
    assert r.samples_per_s > 0


def test_batch_size_rescales_the_profile():
    r = simulate_scenario(tiny_profile(), paper.subcluster("V", 2), "NP", n_m=1, num_waves=2,
                          batch_size=64)
    assert r.plans[0].batch_size == 64


def test_calibration_sets_one_titan_v_to_the_single_gpu_figure_exactly():
    profile = tiny_profile()
    calibrated, factor = paper.calibrate(profile, 159.0)
    assert single_device_samples_per_s(calibrated, "TITAN_V") == pytest.approx(159.0, rel=1e-9)
    # one factor for every type: relative speeds untouched
    for a, b in zip(profile.layers, calibrated.layers):
        for t in SPEED:
            assert b.time_s[t] == pytest.approx(a.time_s[t] * factor)
    # Through the whole scenario path (one VW of one TITAN V) the VW also pushes to and
    # pulls from its parameter server after every wave, which a single GPU does not do.
    r = simulate_scenario(calibrated, paper.subcluster("V", 1), "NP", n_m=1, num_waves=3)
    assert 0.95 * 159.0 < r.samples_per_s <= 159.0


def test_blocked_ed_plans_once_for_many_identical_vws():
    cluster = paper.mixed_cluster(8)                  # 32 GPUs, hosts V R G Q V R G Q
    vws = paper.blocked_ed(cluster)
    assert len(vws) == 8 and all(len(vw) == 4 for vw in vws)
    r = simulate_scenario(tiny_profile(), cluster, "ED", "default", n_m=2, num_waves=2,
                          virtual_workers=vws)
    assert r.distinct_plans == 1
    assert len({p.devices for p in r.plans}) == 8


def test_text_tables_run_on_a_stand_in_profile(monkeypatch):
    monkeypatch.setattr(paper, "paper_profile",
                        lambda m, cache_dir=None, **kw: paper.calibrate(tiny_profile(),
                                                                        paper.SINGLE_GPU[m]))
    t4 = paper.table4(models=("vgg19",), num_waves=2)
    assert "Horovod" in t4 and "HetPipe" in t4 and "Single GPU [V]" in t4
    assert "Within 25%" in t4 and "TF_GRPC_BANDWIDTH" in t4 and "CUDA_CONTEXT_BYTES" in t4
    f5 = paper.figure5(models=("resnet152",), num_waves=2, max_n_m=3)
    assert "ED-local" in f5 and "ordering" in f5
    sc = paper.scaling(gpus=(16,), num_waves=2)
    assert "samples/s" in sc


# ---------------------------------------------------------------- setup facts
import dataclasses  # noqa: E402

from hetpipe_tf.cluster.catalog import get_device_type  # noqa: E402
from hetpipe_tf.partitioner.layer_graph import TensorRef  # noqa: E402

MIB = 2**20


def test_tf112_memory_limit_follows_gpu_device_cc():
    # 12 GiB - 400 MiB context = 11888 MiB available; reserve max(300 MiB, 5%) = 5%.
    assert paper.tf112_gpu_memory_limit(12 * 2**30, 400 * MIB) == int(11888 * MIB) - int(
        11888 * MIB * 0.05)
    # 2 GiB - 400 MiB = 1648 MiB < 2 GiB: reserve 225 MiB.
    assert paper.tf112_gpu_memory_limit(2 * 2**30, 400 * MIB) == (1648 - 225) * MIB
    # 4 GiB - 400 MiB = 3696 MiB: 5% = 184.8 MiB < 300 MiB, so 300 MiB.
    assert paper.tf112_gpu_memory_limit(4 * 2**30, 400 * MIB) == (3696 - 300) * MIB
    with pytest.raises(ValueError):
        paper.tf112_gpu_memory_limit(100 * MIB, 400 * MIB)


@dataclasses.dataclass
class FakeNode:
    index: int
    class_name: str
    inputs: tuple
    nbytes: int

    @property
    def output_shapes(self):
        return ((self.nbytes,),)

    def output_bytes(self, k):
        return self.nbytes


def test_backward_keeps_only_the_tensors_gradients_read():
    r = TensorRef
    nodes = [FakeNode(0, "Conv2D", (r(-1),), 10),            # read by BN's gradient: kept
             FakeNode(1, "BatchNormalization", (r(0),), 20),  # read by nobody: dropped
             FakeNode(2, "Activation", (r(1),), 30),          # relu reads its output: kept
             FakeNode(3, "Conv2D", (r(2),), 40),              # feeds Add only: dropped
             FakeNode(4, "Add", (r(3), r(2)), 50),            # feeds global pooling: dropped
             FakeNode(5, "GlobalAveragePooling2D", (r(4),), 60),  # Dense reads it: kept
             FakeNode(6, "Dense", (r(5),), 70),               # softmax reads its output
             FakeNode(7, "Lambda", (r(6),), 80)]              # unknown class: kept
    acts = ["linear", None, "relu", "linear", None, None, "softmax", None]
    assert paper.backward_kept_bytes(nodes, acts) == [10, 0, 30, 0, 0, 60, 70, 80]
    # A linear Dense feeding nothing that reads it keeps nothing; MaxPool keeps in and out.
    nodes2 = [FakeNode(0, "Dense", (r(-1),), 5), FakeNode(1, "MaxPooling2D", (r(0),), 7)]
    assert paper.backward_kept_bytes(nodes2, ["linear", None]) == [5, 7]
    prof = paper.with_kept_activations(tiny_profile(num_layers=2), [3, 4])
    assert [l.activation_bytes for l in prof.layers] == [3 * 32, 4 * 32]


def test_setups_shape_the_cluster():
    c = paper.subcluster("VQ", 2)
    assert c.inter_bandwidth == paper.TF_GRPC_BANDWIDTH
    assert c.memory_of("host1/gpu0") == paper.tf112_gpu_memory_limit(
        get_device_type("QUADRO_P4000").memory_bytes)
    n = paper.subcluster("VQ", 2, setup=paper.NOMINAL_SETUP)
    assert n.inter_bandwidth == 7e9
    assert n.memory_of("host1/gpu0") == get_device_type("QUADRO_P4000").memory_bytes
    assert paper.subcluster("V", 1, inter_bandwidth=1e9).inter_bandwidth == 1e9
    text = "\n".join(paper.PAPER_SETUP.describe())
    assert "0.80 GB/s" in text and "0.888 GB/s" in text and "on the CPU" in text
    text = "\n".join(paper.NCCL_SETUP.describe())
    assert "0.80 GB/s" in text and "6.56 GB/s" in text and "64 MiB" in text


# ---------------------------------------------------------------- the report (paper_goals)
from experiments import paper_goals  # noqa: E402


def test_goals_report_parts_run_on_a_stand_in_profile(monkeypatch):
    monkeypatch.setattr(paper, "paper_profile",
                        lambda m, cache_dir=None, **kw: paper.calibrate(tiny_profile(),
                                                                        paper.SINGLE_GPU[m]))
    cells = paper_goals.headline_cells(num_waves=2)
    assert len(cells) == 15                            # 7 Horovod + 8 HetPipe cells
    text = paper_goals.table4_text(cells)
    assert "Within 10%:" in text and "within 25%:" in text and "HetPipe above Horovod" in text
    assert "stated order" in paper_goals.figure5_text(num_waves=2, max_n_m=2)
    assert "waiting(D=4)/waiting(D=0)" in paper_goals.clock_distance_text(num_waves=6)
    rows = paper_goals.scaling_rows(hosts=(1, 2), num_waves=2)
    assert [h for h, *_ in rows] == [1, 2] and all(hv > 0 and hp > 0 for _, hv, hp, _ in rows)
    text = paper_goals.causes_text()
    assert "implied ring link" in text and "PS over one TF gRPC stream" in text


def test_implied_ring_link_rate_is_the_gradient_bytes_over_the_paper_steps_spare_time(
        monkeypatch):
    monkeypatch.setattr(paper, "paper_profile",
                        lambda m, cache_dir=None, **kw: paper.calibrate(tiny_profile(),
                                                                        paper.SINGLE_GPU[m]))
    rows = paper_goals.horovod_implied_rows()
    assert len(rows) == 7                              # Table 4's Horovod cells
    grads = sum(l.trainable_param_bytes for l in tiny_profile().layers)
    for m, col, n, ours, theirs, compute, rate in rows:
        assert theirs == pytest.approx(n * 32 / paper.TABLE4[m]["Horovod"][
            paper.TABLE4_COLUMNS.index(col)])
        if theirs > compute:
            assert rate == pytest.approx(2 * (n - 1) / n * grads / (theirs - compute) / 1e9)


def test_main_prints_the_report(monkeypatch, capsys):
    monkeypatch.setattr(paper_goals, "report", lambda cache_dir=None: "REPORT")
    paper.main(["experiments.paper"])
    assert capsys.readouterr().out.strip() == "REPORT"


def test_calibration_with_update_costs_scales_only_the_layer_times():
    from hetpipe_tf.sim.calibration import with_update_costs
    profile = with_update_costs(tiny_profile())
    calibrated, factor = paper.calibrate(profile, 159.0)
    # one TITAN V alone: factor x layer times + the plain SGD step = 32 / 159 s
    assert single_device_samples_per_s(calibrated, "TITAN_V") == pytest.approx(159.0, rel=1e-9)
    for a, b in zip(profile.layers, calibrated.layers):
        assert b.update_s == a.update_s
        for t in SPEED:
            assert b.time_s[t] == pytest.approx(a.time_s[t] * factor)


def test_scaling_bounds_are_the_slowest_stage_and_the_pipeline_fill():
    r = simulate_scenario(tiny_profile(), paper.subcluster("VV", 1), "ED", "ed_local", n_m=2,
                          num_waves=2)
    layers, compute, receive, update, bound, fill = paper_goals.slowest_stage(r)
    stages = r.plans[0].stages
    totals = [s.compute_s + s.recv_forward_s + s.recv_backward_s + s.update_s for s in stages]
    k = totals.index(max(totals))
    assert layers == f"{stages[k].first}-{stages[k].last}"
    assert compute + receive + update == pytest.approx(totals[k])
    assert bound == pytest.approx(1 * 32 / totals[k])           # one VW of batch 32
    assert fill == pytest.approx(2 * 32 / sum(totals))          # N_m = 2 in flight
    assert r.samples_per_s <= min(bound, fill) * (1 + 1e-9)
