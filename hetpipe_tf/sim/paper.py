"""The paper's experiments, simulated: Table 4, Figure 5's ordering, and a scaling run.

Calibration (the only one): every model is profiled for the four types of the paper with
times ESTIMATED from the device catalog (roofline, no measurement here); then one factor
per model multiplies every layer time on every type so that one TITAN V alone (one VW of
one device, no parameter server) simulates exactly the paper's Table 4 "Single GPU [V]"
figure at batch 32 (VGG-19 159, ResNet-152 112 images/s). The relative speed of the types,
the memory model, the PCIe/InfiniBand bandwidths and the Horovod model are the catalog's
and the simulator's, untouched.

    from hetpipe_tf.sim import paper
    print(paper.main(cache_dir="/tmp/hetpipe_profiles"))   # all three tables
    paper.table4(cache_dir=...), paper.figure5(cache_dir=...), paper.scaling(cache_dir=...)

Profiles (10-20 s per keras.applications model) are cached as JSON under `cache_dir`
(never in the repository); `cache_dir=None` profiles every time.
"""

from __future__ import annotations

import dataclasses
import os
from typing import Any, Sequence

from hetpipe_tf.cluster.allocation import AllocationPolicy
from hetpipe_tf.cluster.spec import (INFINIBAND_56G_BANDWIDTH, PCIE3_X16_BANDWIDTH, Cluster,
                                     Device, Host, paper_cluster)
from hetpipe_tf.partitioner.profile import ModelProfile
from hetpipe_tf.ps.placement import PlacementPolicy
from hetpipe_tf.sim.scenario import ScenarioResult, simulate_scenario, single_device_samples_per_s

PAPER_TYPES = ("TITAN_V", "TITAN_RTX", "RTX_2060", "QUADRO_P4000")
LETTER_TYPE = {"V": "TITAN_V", "R": "TITAN_RTX", "G": "RTX_2060", "Q": "QUADRO_P4000"}
# The paper's measured speed order (Section 8.1), used for HD as in its Table 3.
PAPER_RANKING = ("TITAN_V", "TITAN_RTX", "RTX_2060", "QUADRO_P4000")
BATCH_SIZE = 32

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


# ------------------------------------------------------------------ profiles


def estimated_profile(model_name: str, cache_dir: str | None = None,
                      batch_size: int = BATCH_SIZE,
                      types: Sequence[str] = PAPER_TYPES) -> ModelProfile:
    """`profile_model(build_model(name), batch_size, types)` with estimated times, cached as
    JSON in `cache_dir` (created if needed) under <model>_b<batch>_<types>.json."""
    path = None
    if cache_dir:
        os.makedirs(cache_dir, exist_ok=True)
        path = os.path.join(cache_dir, f"{model_name}_b{batch_size}_{'-'.join(types)}.json")
        if os.path.exists(path):
            with open(path) as f:
                return ModelProfile.from_json(f.read())
    from hetpipe_tf.models import build_model
    from hetpipe_tf.partitioner.profile import profile_model
    profile = profile_model(build_model(model_name), batch_size, list(types))
    if path:
        tmp = path + f".tmp{os.getpid()}"
        with open(tmp, "w") as f:
            f.write(profile.to_json())
        os.replace(tmp, path)
    return profile


def scale_times(profile: ModelProfile, factor: float) -> ModelProfile:
    """Every layer time on every type multiplied by `factor`."""
    layers = tuple(dataclasses.replace(l, time_s={t: s * factor for t, s in l.time_s.items()})
                   for l in profile.layers)
    return dataclasses.replace(profile, layers=layers)


def calibration_factor(profile: ModelProfile, single_gpu_samples_per_s: float,
                       device_type: str = "TITAN_V") -> float:
    """The factor that makes one `device_type` alone simulate `single_gpu_samples_per_s`."""
    if single_gpu_samples_per_s <= 0:
        raise ValueError(f"single_gpu_samples_per_s must be > 0. Received: "
                         f"{single_gpu_samples_per_s!r}.")
    return single_device_samples_per_s(profile, device_type) / single_gpu_samples_per_s


def calibrate(profile: ModelProfile, single_gpu_samples_per_s: float,
              device_type: str = "TITAN_V") -> tuple[ModelProfile, float]:
    """(calibrated profile, factor): the Table 4 calibration rule (module doc)."""
    f = calibration_factor(profile, single_gpu_samples_per_s, device_type)
    return scale_times(profile, f), f


def paper_profile(model_name: str, cache_dir: str | None = None) -> tuple[ModelProfile, float]:
    """The calibrated profile of "vgg19" or "resnet152" and its calibration factor."""
    return calibrate(estimated_profile(model_name, cache_dir), SINGLE_GPU[model_name])


# ------------------------------------------------------------------ clusters and runs


def subcluster(letters: str, gpus_per_host: int = 4, *,
               intra_bandwidth: float = PCIE3_X16_BANDWIDTH,
               inter_bandwidth: float = INFINIBAND_56G_BANDWIDTH) -> Cluster:
    """Hosts of the paper's cluster, one per letter ("VRQ" = TITAN V, TITAN RTX, Quadro
    P4000 hosts), each with `gpus_per_host` GPUs, PCIe 3 x16 inside, 56 Gb/s InfiniBand
    (other bandwidths only for what-if runs)."""
    hosts = []
    for i, letter in enumerate(letters):
        name = f"host{i}"
        devices = tuple(
            Device(name=f"{name}/gpu{k}", type_name=LETTER_TYPE[letter], host=name,
                   tf_device=f"/job:worker/replica:0/task:{i}/device:GPU:{k}")
            for k in range(gpus_per_host))
        hosts.append(Host(name=name, devices=devices, intra_bandwidth=intra_bandwidth,
                          task=("worker", i)))
    return Cluster(hosts=tuple(hosts), inter_bandwidth=inter_bandwidth)


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
        return "  -  "
    return f"{ours / theirs:5.2f}"


def _cell(v: float | None) -> str:
    return "X" if v is None else f"{v:.0f}"


CALIBRATION_NOTE = (
    "Calibration: layer times ESTIMATED from the device catalog (roofline), then ONE factor "
    "per model scales every layer on every type so that one TITAN V alone simulates the "
    "paper's Table 4 'Single GPU [V]' (VGG-19 159, ResNet-152 112 images/s, batch 32). "
    "Nothing else is fitted: type speeds, memory model, PCIe/InfiniBand bandwidths and the "
    "Horovod model are the catalog's and the simulator's.")


def table4(cache_dir: str | None = None, models: Sequence[str] = ("vgg19", "resnet152"),
           num_waves: int = 10, **bandwidths: float) -> str:
    """Table 4: Horovod and HetPipe (ED-local; 1 VW for 4 GPUs, else 4 VWs) beside the paper.

    HetPipe rows: N_m = the paper's own (its parenthesised total / VWs), and the largest
    every VW fits in our memory model (N_m shown in parentheses as total, like the paper).
    """
    lines = [CALIBRATION_NOTE, ""]
    if bandwidths:
        lines = [f"WHAT-IF bandwidths {bandwidths} (not the paper's nominal links)"] + lines
    hdr = f"{'model':10} {'row':22} " + " ".join(f"{c:>22}" for c in
                                                 ("4 [V]", "8 [VR]", "12 [VRQ]", "16 [VRQG]"))
    lines += [hdr, "(each cell: ours / paper = ratio; (n) = concurrent minibatches)"]
    for m in models:
        profile, factor = paper_profile(m, cache_dir)
        paper = TABLE4[m]
        rows: dict[str, list[str]] = {"Horovod": [], "HetPipe N_m as paper": [],
                                      "HetPipe N_m max fit": []}
        for c, letters in enumerate(TABLE4_COLUMNS):
            cluster = subcluster(letters, **bandwidths)
            vws = 1 if letters == "V" else 4
            nm_paper = paper["concurrent"][c] // vws
            kw = dict(num_virtual_workers=vws, num_waves=num_waves)
            r_paper = simulate_scenario(profile, cluster, "ED", "ed_local", n_m=nm_paper, **kw)
            r_max = simulate_scenario(profile, cluster, "ED", "ed_local", **kw)
            hv = r_paper.horovod.samples_per_s if r_paper.horovod.devices else None
            if hv is not None and r_paper.horovod.excluded:
                note = f"[{len(r_paper.horovod.devices)} GPUs]"
            else:
                note = ""
            rows["Horovod"].append(f"{_cell(hv)}{note}/{_cell(paper['Horovod'][c])}="
                                   f"{_ratio(hv, paper['Horovod'][c]).strip()}")
            rows["HetPipe N_m as paper"].append(
                f"{r_paper.samples_per_s:.0f}({nm_paper * vws})/{paper['HetPipe'][c]}="
                f"{_ratio(r_paper.samples_per_s, paper['HetPipe'][c]).strip()}")
            rows["HetPipe N_m max fit"].append(
                f"{r_max.samples_per_s:.0f}({r_max.n_m * vws})/{paper['HetPipe'][c]}="
                f"{_ratio(r_max.samples_per_s, paper['HetPipe'][c]).strip()}")
        lines.append(f"{MODEL_TITLES[m]:10} {'single V (calibrated)':22} "
                     f"{SINGLE_GPU[m]:.0f}/{SINGLE_GPU[m]:.0f}=1.00 (factor {factor:.3f} "
                     "on the catalog estimate)")
        for name, cells in rows.items():
            lines.append(f"{'':10} {name:22} " + " ".join(f"{x:>22}" for x in cells))
    return "\n".join(lines)


FIGURE5_POLICIES = (("NP", "default"), ("ED", "default"), ("HD", "default"),
                    ("ED-local", "ed_local"))
# Section 8.3's statements about Figure 5 (no numbers are printed in the text).
FIGURE5_PAPER = {
    "vgg19": "ED-local highest (1.8x Horovod); Horovod > NP, ED, HD; NP lowest",
    "resnet152": "ED-local highest (1.4x Horovod); ED, HD >= Horovod (12 GPUs); NP lowest",
}


def figure5(cache_dir: str | None = None, models: Sequence[str] = ("vgg19", "resnet152"),
            num_waves: int = 10, max_n_m: int | None = None) -> str:
    """Figure 5: NP, ED, HD (Table 3's VVQQ/RRGG with the paper's measured ranking) and
    ED-local on the 16-GPU cluster at D=0; N_m = the largest every VW fits, and the N_m
    maximising simulated throughput (the paper's own wording) beside it."""
    lines = [CALIBRATION_NOTE, "",
             f"{'model':10} {'policy':9} {'VWs':20} {'N_m max':>7} {'samples/s':>9} "
             f"{'N_m best':>8} {'samples/s':>9} {'MB across/minibatch':>19}"]
    cluster = paper_cluster()
    for m in models:
        profile, _ = paper_profile(m, cache_dir)
        got: dict[str, float] = {}
        hv = None
        for label, placement in FIGURE5_POLICIES:
            policy = "ED" if label == "ED-local" else label
            top, best = best_n_m(profile, cluster, policy, placement, num_waves=num_waves,
                                 ranking=PAPER_RANKING, max_n_m=max_n_m)
            hv = top.horovod
            got[label] = top.samples_per_s
            got[label + "*"] = best.samples_per_s
            lines.append(f"{MODEL_TITLES[m]:10} {label:9} {','.join(top.compositions):20} "
                         f"{top.n_m:7} {top.samples_per_s:9.0f} {best.n_m:8} "
                         f"{best.samples_per_s:9.0f} "
                         f"{best.bytes_across_hosts_per_minibatch / 1e6:19.0f}")
        lines.append(f"{MODEL_TITLES[m]:10} {'Horovod':9} {len(hv.devices):2} GPUs"
                     f"{' (' + str(len(hv.excluded)) + ' lack memory)' if hv.excluded else '':14}"
                     f" {'':7} {hv.samples_per_s:9.0f} {'':8} {'':9} "
                     f"{hv.bytes_inter_host / 1e6 / len(hv.devices):19.0f}")
        order_max = " > ".join(f"{k} {got[k]:.0f}" for k in sorted(
            (k for k in got if not k.endswith("*")), key=lambda k: -got[k]))
        order_best = " > ".join(f"{k[:-1]} {got[k]:.1f}" for k in sorted(
            (k for k in got if k.endswith("*")), key=lambda k: -got[k]))
        lines.append(f"{'':10} ordering (N_m max):  {order_max}; Horovod {hv.samples_per_s:.0f}")
        lines.append(f"{'':10} ordering (N_m best): {order_best}")
        lines.append(f"{'':10} paper (Section 8.3): {FIGURE5_PAPER[m]}")
    return "\n".join(lines)


# ------------------------------------------------------------------ scaling


def mixed_cluster(num_hosts: int, gpus_per_host: int = 4,
                  letters: str = "VRGQ") -> Cluster:
    """`num_hosts` hosts of `gpus_per_host` GPUs, host i of type letters[i % len(letters)]."""
    return subcluster("".join(letters[i % len(letters)] for i in range(num_hosts)),
                      gpus_per_host)


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
            n_m: int | None = 4) -> str:
    """Throughput, planning and simulation wall time for 64/256/1024 mixed GPUs.

    Hosts of 4 GPUs cycle through V, R, G, Q; each block of 4 hosts is split by ED into 4
    VWs "VRGQ" (so VWs = GPUs / 4); default placement over one PS per host. All VWs have
    the same composition, so the partitioner runs once; planning time is that run.
    """
    profile, _ = paper_profile(model, cache_dir)
    lines = [f"Scaling, {MODEL_TITLES.get(model, model)}, batch {profile.batch_size}, "
             f"VWs of VRGQ by ED per 4 hosts, default placement, D=0, N_m="
             f"{n_m if n_m else 'max fit'}, {num_waves} waves (calibrated as Table 4)",
             f"{'GPUs':>5} {'hosts':>5} {'VWs':>4} {'plans':>5} {'N_m':>3} {'samples/s':>10} "
             f"{'per GPU':>7} {'Horovod':>8} {'plan s':>7} {'sim s':>7} "
             f"{'MB across/mb':>12}"]
    for g in gpus:
        cluster = mixed_cluster(g // 4)
        r = simulate_scenario(profile, cluster, "ED", "default", n_m=n_m,
                              num_waves=num_waves, virtual_workers=blocked_ed(cluster))
        lines.append(f"{g:5} {g // 4:5} {len(r.plans):4} {r.distinct_plans:5} {r.n_m:3} "
                     f"{r.samples_per_s:10.0f} {r.samples_per_s / g:7.1f} "
                     f"{r.horovod.samples_per_s:8.0f} {r.planning_wall_s:7.2f} "
                     f"{r.simulation_wall_s:7.2f} "
                     f"{r.bytes_across_hosts_per_minibatch / 1e6:12.0f}")
    return "\n".join(lines)


def main(cache_dir: str | None = None) -> str:
    """Table 4, Figure 5 and the scaling table as one text."""
    return "\n\n".join([
        "== Table 4 (simulated vs paper) ==", table4(cache_dir),
        "== Figure 5 (16 GPUs, D=0) ==", figure5(cache_dir),
        "== Scaling ==", scaling(cache_dir)])
