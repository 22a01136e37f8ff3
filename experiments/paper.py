r"""The paper's experiments on the cluster model: Table 4, Figure 5, clock distance, scaling.

    python -m experiments.paper [--cache_dir=/tmp/hetpipe_profiles]

prints `experiments.paper_goals.report`: each Table 4 headline cell, paper vs model, the
counts within 10% / 25%, Figure 5's order, waiting(D=4)/waiting(D=0) and homogeneous
scaling. The model and every constant with its source: docs/cluster_model.md.

Calibration (the only one): layer times ESTIMATED from the device catalog (roofline), put
in the paper's measured speed order (`sim.calibration.in_measured_order`), then ONE factor
per model so that one TITAN V alone simulates Table 4's "Single GPU [V]" figure (VGG-19
159, ResNet-152 112 images/s). No multi-GPU cell is an input. The setup (TF 1.12 links and
GPU memory, Horovod) is `experiments.paper_setup.PaperSetup`; `NOMINAL_SETUP` is the model
without those facts, `WHAT_IF_SETUP` a labelled fit to the paper's Horovod cells (NOT the
reproduction). `tables(cache_dir)` gives the longer tables (Table 4 with the largest N_m
that fits, Figure 5 at both N_m, mixed 64-1024 GPU scaling).

Profiles (10-20 s per keras.applications model) are cached as JSON under `cache_dir`.
"""

from __future__ import annotations

import dataclasses
from typing import Any, Sequence

from hetpipe_tf.cluster.allocation import AllocationPolicy
from hetpipe_tf.cluster.catalog import get_device_type
from hetpipe_tf.cluster.spec import Cluster, Device, Host
from hetpipe_tf.partitioner.plan import PartitionError
from hetpipe_tf.partitioner.profile import ModelProfile
from hetpipe_tf.ps.placement import PlacementPolicy
from experiments.paper_setup import (  # noqa: F401  (re-exported: paper.calibrate, ...)
    calibrate, calibration_factor, estimated_profile, kept_activation_bytes, scale_times,
    BATCH_SIZE, CUDA_CONTEXT_BYTES, GIB, IB_FDR_ACHIEVED_BANDWIDTH, MIB, NCCL_SETUP,
    NOMINAL_SETUP, PAPER_SETUP, PAPER_TYPES, TF_GRPC_BANDWIDTH, WHAT_IF_SETUP, PaperSetup,
    backward_kept_bytes, tf112_gpu_memory_limit, with_kept_activations)
from hetpipe_tf.sim.calibration import in_measured_order, with_update_costs
from hetpipe_tf.sim.scenario import ScenarioResult, simulate_scenario, single_device_samples_per_s

LETTER_TYPE = {"V": "TITAN_V", "R": "TITAN_RTX", "G": "RTX_2060", "Q": "QUADRO_P4000"}
# The paper's measured speed order (Section 8.1), used for HD as in its Table 3.
PAPER_RANKING = ("TITAN_V", "TITAN_RTX", "RTX_2060", "QUADRO_P4000")

# Table 4 of the paper: single TITAN V, then Horovod and HetPipe (ED-local) on
# 4 [V], 8 [VR], 12 [VRQ], 16 [VRQG] GPUs; None = not runnable (X); (N_m totals).
SINGLE_GPU = {"vgg19": 159.0, "resnet152": 112.0}
TABLE4_COLUMNS = ("V", "VR", "VRQ", "VRQG")
TABLE4 = {
    "vgg19": {"Horovod": (164, 205, 265, 339), "HetPipe": (300, 530, 572, 606),
              "concurrent": (5, 16, 20, 20)},
    "resnet152": {"Horovod": (233, 353, 415, None), "HetPipe": (256, 516, 538, 580),
                  "concurrent": (5, 20, 24, 28)},
}
MODEL_TITLES = {"vgg19": "VGG-19", "resnet152": "ResNet-152"}
WITHIN = 0.25     # the reproduction's target: ours / paper in [0.75, 1.25]

# ------------------------------------------------------------------ profiles


def paper_profile(model_name: str, cache_dir: str | None = None, *,
                  kept_activations: bool = False) -> tuple[ModelProfile, float]:
    """The calibrated profile of "vgg19" or "resnet152" and its calibration factor; with
    `kept_activations`, activation memory by the backward-pass rule (times unchanged)."""
    profile, factor = calibrate(with_update_costs(in_measured_order(
        estimated_profile(model_name, cache_dir))), SINGLE_GPU[model_name])
    if kept_activations:
        profile = with_kept_activations(profile, kept_activation_bytes(model_name, cache_dir))
    return profile, factor


def _profiles(model_name: str, cache_dir: str | None, setup: PaperSetup
              ) -> tuple[ModelProfile, ModelProfile, float]:
    """(profile HetPipe plans with, profile Horovod is checked with, calibration factor)."""
    plan, factor = (paper_profile(model_name, cache_dir, kept_activations=True)
                    if setup.plan_kept_activations else paper_profile(model_name, cache_dir))
    if setup.horovod_kept_activations == setup.plan_kept_activations:
        return plan, plan, factor
    hv, _ = (paper_profile(model_name, cache_dir, kept_activations=True)
             if setup.horovod_kept_activations else paper_profile(model_name, cache_dir))
    return plan, hv, factor


# ------------------------------------------------------------------ clusters and runs


def subcluster(letters: str, gpus_per_host: int = 4, *, setup: PaperSetup = PAPER_SETUP,
               intra_bandwidth: float | None = None,
               inter_bandwidth: float | None = None) -> Cluster:
    """Hosts of the paper's cluster, one per letter ("VRQ" = TITAN V, TITAN RTX, Quadro
    P4000 hosts), each with `gpus_per_host` GPUs; links and GPU memory as `setup` models
    them (bandwidth arguments override the setup's, for what-if runs)."""
    intra = intra_bandwidth or setup.intra_bandwidth
    inter = inter_bandwidth or setup.inter_bandwidth
    hosts = []
    for i, letter in enumerate(letters):
        name = f"host{i}"
        type_name = LETTER_TYPE[letter]
        memory = (tf112_gpu_memory_limit(get_device_type(type_name).memory_bytes,
                                         setup.cuda_context_bytes)
                  if setup.tf_gpu_memory else None)
        devices = tuple(
            Device(name=f"{name}/gpu{k}", type_name=type_name, host=name,
                   tf_device=f"/job:worker/replica:0/task:{i}/device:GPU:{k}",
                   memory_bytes=memory)
            for k in range(gpus_per_host))
        hosts.append(Host(name=name, devices=devices, intra_bandwidth=intra,
                          task=("worker", i)))
    return Cluster(hosts=tuple(hosts), inter_bandwidth=inter)


def best_n_m(profile: ModelProfile, cluster: Cluster, policy: AllocationPolicy | str,
             placement: PlacementPolicy | str, *, max_n_m: int | None = None,
             **kwargs: Any) -> tuple[ScenarioResult, ScenarioResult]:
    """(run at the largest N_m every VW fits, run at the N_m in 1..that maximising
    simulated throughput): the paper's "N_m set such that performance is maximized"."""
    top = simulate_scenario(profile, cluster, policy, placement, **kwargs)
    best = top
    for n in range(1, min(top.n_m, max_n_m or top.n_m) + 1):
        if n == top.n_m:
            continue
        r = simulate_scenario(profile, cluster, policy, placement, n_m=n, **kwargs)
        if r.samples_per_s > best.samples_per_s:
            best = r
    return top, best


def _ratio(ours: float | None, theirs: float | None) -> str:
    if ours is None or theirs is None or not theirs:
        return "-"
    return f"{ours / theirs:.2f}"


def _cell(v: float | None) -> str:
    return "X" if v is None else f"{v:.0f}"


def _triple(ours: float | None, theirs: float | None, note: str = "") -> str:
    """"ours/paper=ratio", with "!" when the ratio is outside the 25% target."""
    r = _ratio(ours, theirs)
    flag = ""
    if ours is not None and theirs:
        flag = "" if abs(ours / theirs - 1) <= WITHIN else "!"
    return f"{_cell(ours)}{note}/{_cell(theirs)}={r}{flag}"


CALIBRATION_NOTE = (
    "Per-layer times are calibrated ONLY on Table 4's 'Single GPU [V]' figures: layer times "
    "ESTIMATED from the device catalog (roofline), then ONE factor per model scales every "
    "layer on every type so that one TITAN V alone simulates VGG-19 159 and ResNet-152 112 "
    "images/s (batch 32). No other cell of Table 4 and nothing of Figure 5 is used as input.")


def _header(setup: PaperSetup) -> list[str]:
    return [CALIBRATION_NOTE] + setup.describe() + [""]


def table4(cache_dir: str | None = None, models: Sequence[str] = ("vgg19", "resnet152"),
           num_waves: int = 10, setup: PaperSetup = PAPER_SETUP, **bandwidths: float) -> str:
    """Table 4: Horovod and HetPipe (ED-local; 1 VW for 4 GPUs, else 4 VWs) beside the paper.

    HetPipe rows: N_m = the paper's own (its parenthesised total / VWs), and the largest
    every VW fits in our memory model (N_m shown in parentheses as total, like the paper).
    `bandwidths` (intra_bandwidth=, inter_bandwidth=) override the setup's: what-if runs.
    """
    if bandwidths:
        setup = dataclasses.replace(setup, name=f"{setup.name} + WHAT-IF {bandwidths}",
                                    **bandwidths)
    lines = _header(setup)
    hdr = f"{'model':10} {'row':22} " + " ".join(f"{c:>24}" for c in
                                                 ("4 [V]", "8 [VR]", "12 [VRQ]", "16 [VRQG]"))
    lines += [hdr, "(each cell: ours/paper=ratio, '!' = outside 25%; (n) = concurrent "
              "minibatches over all VWs; [k GPUs] = Horovod on the k GPUs the model fits)"]
    inside = total = 0
    for m in models:
        profile, hv_profile, factor = _profiles(m, cache_dir, setup)
        paper = TABLE4[m]
        rows: dict[str, list[str]] = {"Horovod": [], "HetPipe N_m as paper": [],
                                      "HetPipe N_m max fit": []}
        for c, letters in enumerate(TABLE4_COLUMNS):
            cluster = subcluster(letters, setup=setup)
            vws = 1 if letters == "V" else 4
            nm_paper = paper["concurrent"][c] // vws
            kw = dict(num_virtual_workers=vws, num_waves=num_waves,
                      horovod_config=setup.horovod, horovod_profile=hv_profile,
                      network=setup.network)
            r_max = simulate_scenario(profile, cluster, "ED", "ed_local", **kw)
            try:
                r_paper = simulate_scenario(profile, cluster, "ED", "ed_local", n_m=nm_paper,
                                            **kw)
                hp_paper = _triple(r_paper.samples_per_s, paper["HetPipe"][c],
                                   f"({nm_paper * vws})")
            except PartitionError:
                r_paper, hp_paper = None, f"N_m {nm_paper} does not fit"
            hv_r = r_max.horovod
            hv = hv_r.samples_per_s if hv_r.devices else None
            note = f"[{len(hv_r.devices)} GPUs]" if hv is not None and hv_r.excluded else ""
            rows["Horovod"].append(_triple(hv, paper["Horovod"][c], note))
            rows["HetPipe N_m as paper"].append(hp_paper)
            rows["HetPipe N_m max fit"].append(_triple(r_max.samples_per_s,
                                                       paper["HetPipe"][c],
                                                       f"({r_max.n_m * vws})"))
            for ours, theirs in ((hv, paper["Horovod"][c]),
                                 (r_paper.samples_per_s if r_paper else None,
                                  paper["HetPipe"][c])):
                if theirs:
                    total += 1
                    inside += ours is not None and abs(ours / theirs - 1) <= WITHIN
        lines.append(f"{MODEL_TITLES[m]:10} {'single V (calibrated)':22} "
                     f"{SINGLE_GPU[m]:.0f}/{SINGLE_GPU[m]:.0f}=1.00 (factor {factor:.3f} "
                     "on the catalog estimate)")
        for name, cells in rows.items():
            lines.append(f"{'':10} {name:22} " + " ".join(f"{x:>24}" for x in cells))
    lines.append(f"Within 25% (Horovod and HetPipe at the paper's N_m): {inside} of {total} "
                 "cells")
    return "\n".join(lines)


FIGURE5_POLICIES = (("NP", "default"), ("ED", "default"), ("HD", "default"),
                    ("ED-local", "ed_local"))
# Section 8.3's statements about Figure 5 (the bars' numbers are not in our copy).
FIGURE5_PAPER = {
    "vgg19": "ED-local highest (1.8x Horovod); Horovod > NP, ED, HD; NP lowest",
    "resnet152": "ED-local highest (1.4x Horovod); ED, HD >= Horovod (12 GPUs); NP lowest",
}
# Section 8.3's numbers: ED-local / Horovod throughput, and MB crossing hosts per minibatch
# (the paper's MB are MiB: its "548MB" of VGG-19 parameters are 574.7e6 bytes; its Horovod
# figures are twice one ring's crossing bytes, i.e. counted when sent and when received).
FIGURE5_NUMBERS = {
    "vgg19": {"ED-local/Horovod": 1.8, "ED-local MiB": 103, "Horovod MiB": 515},
    "resnet152": {"ED-local/Horovod": 1.4, "ED-local MiB": 298, "Horovod MiB": 211},
}


def figure5(cache_dir: str | None = None, models: Sequence[str] = ("vgg19", "resnet152"),
            num_waves: int = 10, max_n_m: int | None = None,
            setup: PaperSetup = PAPER_SETUP) -> str:
    """Figure 5: NP, ED, HD (Table 3's VVQQ/RRGG with the paper's measured ranking) and
    ED-local on the 16-GPU cluster at D=0; N_m = the largest every VW fits, and the N_m
    maximising simulated throughput (the paper's own wording) beside it."""
    lines = _header(setup) + [
        f"{'model':10} {'policy':9} {'VWs':20} {'N_m max':>7} {'samples/s':>9} "
        f"{'N_m best':>8} {'samples/s':>9} {'MiB across/minibatch':>20}"]
    cluster = subcluster("VRGQ", setup=setup)
    for m in models:
        profile, hv_profile, _ = _profiles(m, cache_dir, setup)
        got: dict[str, float] = {}
        across: dict[str, float] = {}
        hv = None
        for label, placement in FIGURE5_POLICIES:
            policy = "ED" if label == "ED-local" else label
            top, best = best_n_m(profile, cluster, policy, placement, num_waves=num_waves,
                                 ranking=PAPER_RANKING, max_n_m=max_n_m,
                                 horovod_config=setup.horovod, horovod_profile=hv_profile)
            hv = top.horovod
            got[label] = top.samples_per_s
            got[label + "*"] = best.samples_per_s
            across[label] = best.bytes_across_hosts_per_minibatch / MIB
            lines.append(f"{MODEL_TITLES[m]:10} {label:9} {','.join(top.compositions):20} "
                         f"{top.n_m:7} {top.samples_per_s:9.0f} {best.n_m:8} "
                         f"{best.samples_per_s:9.0f} {across[label]:20.0f}")
        hv_mib = hv.bytes_inter_host / MIB / len(hv.devices) if hv.devices else 0.0
        lines.append(f"{MODEL_TITLES[m]:10} {'Horovod':9} {len(hv.devices):2} GPUs"
                     f"{' (' + str(len(hv.excluded)) + ' lack memory)' if hv.excluded else '':14}"
                     f" {'':7} {hv.samples_per_s:9.0f} {'':8} {'':9} {hv_mib:20.0f}")
        order_max = " > ".join(f"{k} {got[k]:.0f}" for k in sorted(
            (k for k in got if not k.endswith("*")), key=lambda k: -got[k]))
        order_best = " > ".join(f"{k[:-1]} {got[k]:.1f}" for k in sorted(
            (k for k in got if k.endswith("*")), key=lambda k: -got[k]))
        lines.append(f"{'':10} ordering (N_m max):  {order_max}; Horovod {hv.samples_per_s:.0f}")
        lines.append(f"{'':10} ordering (N_m best): {order_best}; Horovod "
                     f"{hv.samples_per_s:.1f}")
        lines.append(f"{'':10} paper (Section 8.3): {FIGURE5_PAPER[m]}")
        num = FIGURE5_NUMBERS[m]
        lines.append(
            f"{'':10} Section 8.3 numbers, ours/paper=ratio: ED-local/Horovod "
            f"{got['ED-local*'] / hv.samples_per_s:.2f}/{num['ED-local/Horovod']}="
            f"{got['ED-local*'] / hv.samples_per_s / num['ED-local/Horovod']:.2f}; MiB across "
            f"hosts per minibatch: ED-local {_triple(across['ED-local'], num['ED-local MiB'])}, "
            f"Horovod (sent+received, 2x ring crossing) "
            f"{_triple(2 * hv_mib, num['Horovod MiB'])}")
    return "\n".join(lines)


# ------------------------------------------------------------------ scaling


def mixed_cluster(num_hosts: int, gpus_per_host: int = 4, letters: str = "VRGQ", *,
                  setup: PaperSetup = PAPER_SETUP) -> Cluster:
    """`num_hosts` hosts of `gpus_per_host` GPUs, host i of type letters[i % len(letters)]."""
    return subcluster("".join(letters[i % len(letters)] for i in range(num_hosts)),
                      gpus_per_host, setup=setup)


def blocked_ed(cluster: Cluster, hosts_per_block: int = 4) -> tuple[tuple[Device, ...], ...]:
    """ED inside each block of `hosts_per_block` consecutive hosts: VW (b, i) takes device i
    of every host of block b (VWs of `hosts_per_block` GPUs, one per type)."""
    vws = []
    hosts = [h for h in cluster.hosts if h.devices]
    for b in range(0, len(hosts), hosts_per_block):
        block = hosts[b:b + hosts_per_block]
        n = min(len(h.devices) for h in block)
        vws += [tuple(h.devices[i] for h in block) for i in range(n)]
    return tuple(vws)


def scaling(cache_dir: str | None = None, model: str = "resnet152",
            gpus: Sequence[int] = (64, 256, 1024), num_waves: int = 4,
            n_m: int | None = 4, setup: PaperSetup = PAPER_SETUP) -> str:
    """Throughput, planning and simulation wall time for 64/256/1024 mixed GPUs.

    Hosts of 4 GPUs cycle through V, R, G, Q; each block of 4 hosts is split by ED into 4
    VWs "VRGQ" (so VWs = GPUs / 4); default placement over one PS per host. All VWs have
    the same composition, so the partitioner runs once; planning time is that run.
    """
    profile, hv_profile, _ = _profiles(model, cache_dir, setup)
    lines = [f"Scaling, {MODEL_TITLES.get(model, model)}, batch {profile.batch_size}, "
             f"VWs of VRGQ by ED per 4 hosts, default placement, D=0, N_m="
             f"{n_m if n_m else 'max fit'}, {num_waves} waves (calibrated as Table 4)",
             f"{'GPUs':>5} {'hosts':>5} {'VWs':>4} {'plans':>5} {'N_m':>3} {'samples/s':>10} "
             f"{'per GPU':>7} {'Horovod':>8} {'plan s':>7} {'sim s':>7} "
             f"{'MB across/mb':>12}"]
    for g in gpus:
        cluster = mixed_cluster(g // 4, setup=setup)
        r = simulate_scenario(profile, cluster, "ED", "default", n_m=n_m,
                              num_waves=num_waves, virtual_workers=blocked_ed(cluster),
                              horovod_config=setup.horovod, horovod_profile=hv_profile)
        lines.append(f"{g:5} {g // 4:5} {len(r.plans):4} {r.distinct_plans:5} {r.n_m:3} "
                     f"{r.samples_per_s:10.0f} {r.samples_per_s / g:7.1f} "
                     f"{r.horovod.samples_per_s:8.0f} {r.planning_wall_s:7.2f} "
                     f"{r.simulation_wall_s:7.2f} "
                     f"{r.bytes_across_hosts_per_minibatch / 1e6:12.0f}")
    return "\n".join(lines)


def tables(cache_dir: str | None = None, setup: PaperSetup = PAPER_SETUP) -> str:
    """Table 4 (with the largest N_m that fits), Figure 5 and mixed scaling as one text."""
    return "\n\n".join([
        "== Table 4 (simulated vs paper) ==", table4(cache_dir, setup=setup),
        "== Figure 5 (16 GPUs, D=0) ==", figure5(cache_dir, setup=setup),
        "== Scaling ==", scaling(cache_dir, setup=setup)])


DEFAULT_CACHE_DIR = "/tmp/hetpipe_profiles"


def main(argv: Sequence[str]) -> None:
    """`python -m experiments.paper`: print the paper-vs-model report."""
    from absl import app, flags
    from experiments import paper_goals
    if len(argv) > 1:
        raise app.UsageError(f"Unexpected positional arguments. Received: {list(argv[1:])}; "
                             "pass options as --flag=value.")
    cache = flags.FLAGS.cache_dir if "cache_dir" in flags.FLAGS else DEFAULT_CACHE_DIR
    print(paper_goals.report(cache_dir=cache or None))


if __name__ == "__main__":
    from absl import app, flags
    flags.DEFINE_string("cache_dir", DEFAULT_CACHE_DIR, "Where model profiles are cached "
                        "(JSON); empty = profile every time.")
    app.run(main)
