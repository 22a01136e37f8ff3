"""The cluster model against the paper, figure by figure (docs/cluster_model.md).

`report(cache_dir)` prints, from one model (`sim.network` shared links, the paper setup's
link and memory constants, profiles calibrated on the single-GPU cells only):

* Table 4's 15 headline cells (Horovod; HetPipe ED-local at the paper's N_m): paper,
  model, ratio, and how many are within 10% and 25%; whether HetPipe beats Horovod in
  the 7 columns where the paper has both;
* Figure 5 (16 GPUs, D = 0): NP, ED, HD, ED-local at their best N_m, Horovod, against
  Section 8.3's stated order;
* the clock distance: VGG-19 ED-local on 16 GPUs at D = 0, 4, 32: waiting, idle,
  throughput; waiting(D=4) / waiting(D=0) against the paper's 0.62;
* homogeneous scaling: 1..16 hosts of 4 TITAN V, Horovod and HetPipe ED-local.
"""

from __future__ import annotations

import dataclasses
from typing import Sequence

from hetpipe_tf.cluster.spec import Cluster
from hetpipe_tf.partitioner.plan import PartitionError
from hetpipe_tf.sim.scenario import ScenarioResult, simulate_scenario
from experiments import paper
from experiments.paper_setup import PAPER_SETUP, PaperSetup

# Section 8.4: "the average waiting time with D = 4 is found to be 62% of that with D = 0",
# "the actual idle time is only 18% of the waiting time" (VGG-19, 16 GPUs).
PAPER_WAIT_RATIO = 0.62
PAPER_IDLE_OVER_WAIT = 0.18
SCALING_HOSTS = (1, 2, 4, 8, 16)


@dataclasses.dataclass(frozen=True)
class Cell:
    model: str
    method: str          # "Horovod" or "HetPipe"
    column: str          # "V", "VR", ...
    paper: float
    ours: float

    @property
    def ratio(self) -> float:
        return self.ours / self.paper


def _kw(setup: PaperSetup, hv_profile, num_waves: int) -> dict:
    return dict(num_waves=num_waves, horovod_config=setup.horovod,
                horovod_profile=hv_profile, network=setup.network)


def headline_cells(cache_dir: str | None = None, num_waves: int = 10,
                   setup: PaperSetup = PAPER_SETUP) -> list[Cell]:
    """The 15 cells: Horovod where the paper ran it, HetPipe ED-local at its N_m."""
    cells = []
    for m in ("vgg19", "resnet152"):
        profile, hv_profile, _ = paper._profiles(m, cache_dir, setup)
        table = paper.TABLE4[m]
        for c, letters in enumerate(paper.TABLE4_COLUMNS):
            vws = 1 if letters == "V" else 4
            r = simulate_scenario(profile, paper.subcluster(letters, setup=setup), "ED",
                                  "ed_local", n_m=table["concurrent"][c] // vws,
                                  num_virtual_workers=vws, **_kw(setup, hv_profile, num_waves))
            if table["Horovod"][c] is not None:
                cells.append(Cell(m, "Horovod", letters, table["Horovod"][c],
                                  r.horovod.samples_per_s))
            cells.append(Cell(m, "HetPipe", letters, table["HetPipe"][c], r.samples_per_s))
    return cells


def table4_text(cells: Sequence[Cell]) -> str:
    lines = [f"{'model':10} {'method':8} {'GPUs':9} {'paper':>6} {'model':>6} {'ratio':>6}"]
    for x in cells:
        flag = "" if abs(x.ratio - 1) <= 0.10 else " outside 10%" if abs(x.ratio - 1) <= \
            0.25 else " OUTSIDE 25%"
        lines.append(f"{paper.MODEL_TITLES[x.model]:10} {x.method:8} "
                     f"{len(x.column) * 4:2} [{x.column:4}] {x.paper:6.0f} {x.ours:6.0f} "
                     f"{x.ratio:6.2f}{flag}")
    n10 = sum(abs(x.ratio - 1) <= 0.10 for x in cells)
    n25 = sum(abs(x.ratio - 1) <= 0.25 for x in cells)
    lines.append(f"Within 10%: {n10} of {len(cells)} (goal >= 8); within 25%: {n25} of "
                 f"{len(cells)} (goal >= 12)")
    by = {(x.model, x.method, x.column): x for x in cells}
    above = [(m, col) for (m, meth, col) in by if meth == "Horovod"]
    wins = [(m, col) for m, col in above
            if by[(m, "HetPipe", col)].ours > by[(m, "Horovod", col)].ours]
    lines.append(f"HetPipe above Horovod: {len(wins)} of {len(above)} columns (paper: "
                 f"{len(above)} of {len(above)}): "
                 + ", ".join(f"{paper.MODEL_TITLES[m]} [{c}] "
                             f"{by[(m, 'HetPipe', c)].ours:.0f} vs "
                             f"{by[(m, 'Horovod', c)].ours:.0f}" for m, c in above))
    return "\n".join(lines)


def figure5_text(cache_dir: str | None = None, num_waves: int = 10, max_n_m: int = 5,
                 setup: PaperSetup = PAPER_SETUP) -> str:
    """Figure 5's policies at their best N_m in 1..`max_n_m` against Section 8.3's order."""
    cluster = paper.subcluster("VRGQ", setup=setup)
    lines = []
    for m in ("vgg19", "resnet152"):
        profile, hv_profile, _ = paper._profiles(m, cache_dir, setup)
        got, hv = {}, None
        for label, placement in paper.FIGURE5_POLICIES:
            policy = "ED" if label == "ED-local" else label
            _, best = paper.best_n_m(profile, cluster, policy, placement,
                                     ranking=paper.PAPER_RANKING, max_n_m=max_n_m,
                                     **_kw(setup, hv_profile, num_waves))
            got[label], hv = (best.samples_per_s, best.n_m), best.horovod
        horovod = hv.samples_per_s
        order = sorted(list(got) + ["Horovod"], key=lambda k: -(got[k][0] if k in got
                                                               else horovod))
        lines.append(f"{paper.MODEL_TITLES[m]}: " + " > ".join(
            f"{k} {got[k][0]:.0f} (N_m {got[k][1]})" if k in got else
            f"Horovod {horovod:.0f} ({len(hv.devices)} GPUs)" for k in order))
        ed_local, np_, others = got["ED-local"][0], got["NP"][0], [got[k][0] for k in
                                                                    ("ED", "HD")]
        if m == "vgg19":
            ok = ed_local > horovod > max(others + [np_]) and np_ <= min(others)
        else:   # ED-local highest, NP lowest, ED and HD "a bit better or similar" (10%)
            ok = (ed_local > max(others + [horovod]) and np_ <= min(others + [horovod])
                  and all(x >= 0.9 * horovod for x in others))
        lines.append(f"  paper (Section 8.3): {paper.FIGURE5_PAPER[m]}; ED-local/Horovod "
                     f"model {ed_local / horovod:.2f}, paper "
                     f"{paper.FIGURE5_NUMBERS[m]['ED-local/Horovod']}; stated order "
                     f"{'HOLDS' if ok else 'DOES NOT HOLD'}")
    return "\n".join(lines)


def clock_distance_text(cache_dir: str | None = None, num_waves: int = 40,
                        setup: PaperSetup = PAPER_SETUP) -> str:
    """VGG-19 ED-local on 16 GPUs (N_m 5 per VW, Table 4's 20 in flight) at D = 0, 4, 32."""
    profile, hv_profile, _ = paper._profiles("vgg19", cache_dir, setup)
    cluster = paper.subcluster("VRQG", setup=setup)
    rows = {}
    for d in (0, 4, 32):
        r = simulate_scenario(profile, cluster, "ED", "ed_local", n_m=5, clock_distance=d,
                              **_kw(setup, hv_profile, num_waves))
        wait = sum(r.waiting_s) / len(r.waiting_s)
        idle = sum(sum(s) / len(s) for s in r.idle_s) / len(r.idle_s)
        rows[d] = (wait, idle, r.samples_per_s)
    lines = [f"VGG-19, 16 GPUs, ED-local, N_m 5 per VW, {num_waves} waves: "
             f"{'D':>3} {'waiting s':>9} {'idle s':>7} {'samples/s':>9}"]
    for d, (w, i, s) in rows.items():
        lines.append(f"{'':68}{d:3} {w:9.3f} {i:7.3f} {s:9.0f}")
    w0 = rows[0][0]
    ratio = rows[4][0] / w0 if w0 else float("nan")
    idle = rows[0][1] / w0 if w0 else float("nan")
    lines.append(f"waiting(D=4)/waiting(D=0) = {ratio:.2f} (paper {PAPER_WAIT_RATIO}; goal "
                 f"within 25%: {'MET' if abs(ratio / PAPER_WAIT_RATIO - 1) <= 0.25 else 'NOT MET'}"
                 f"); idle/waiting at D=0 = {idle:.2f} (paper {PAPER_IDLE_OVER_WAIT})")
    return "\n".join(lines)


def _ed_by_host(cluster: Cluster) -> tuple:
    """VW i = GPU i of every host (ED over identical hosts)."""
    n = min(len(h.devices) for h in cluster.hosts)
    return tuple(tuple(h.devices[i] for h in cluster.hosts) for i in range(n))


def scaling_results(cache_dir: str | None = None, model: str = "vgg19",
                    hosts: Sequence[int] = SCALING_HOSTS, num_waves: int = 10,
                    setup: PaperSetup = PAPER_SETUP, n_m: int | None = None
                    ) -> list[tuple[int, ScenarioResult]]:
    """(hosts, run) on hosts of 4 TITAN V: ED-local with VW i = GPU i of every host;
    N_m = `n_m`, or the report's rule below when None."""
    profile, hv_profile, _ = paper._profiles(model, cache_dir, setup)
    out = []
    for h in hosts:
        cluster = paper.subcluster("V" * h, setup=setup)
        vws = _ed_by_host(cluster)
        # h stages with one spare minibatch, at most Table 4's 5 per VW (memory: deeper
        # pipelines hold more versions on the FC stage); 1 when one GPU holds the model
        try:
            r = simulate_scenario(profile, cluster, "ED", "ed_local",
                                  n_m=n_m if n_m is not None else min(h + 1, 5),
                                  virtual_workers=vws, **_kw(setup, hv_profile, num_waves))
        except PartitionError:
            if h > 1 or n_m is not None:
                raise
            r = simulate_scenario(profile, cluster, "ED", "ed_local", n_m=1,
                                  virtual_workers=vws, **_kw(setup, hv_profile, num_waves))
        out.append((h, r))
    return out


def scaling_rows(cache_dir: str | None = None, model: str = "vgg19",
                 hosts: Sequence[int] = SCALING_HOSTS, num_waves: int = 10,
                 setup: PaperSetup = PAPER_SETUP) -> list[tuple[int, float, float, int]]:
    """(hosts, Horovod samples/s, ED-local samples/s, N_m) on hosts of 4 TITAN V."""
    return [(h, r.horovod.samples_per_s, r.samples_per_s, r.n_m)
            for h, r in scaling_results(cache_dir, model, hosts, num_waves, setup)]


def slowest_stage(r: ScenarioResult) -> tuple[str, float, float, float, float, float]:
    """What bounds an ED-local run, from VW 0's plan (seconds per minibatch): (the slowest
    stage's layers "a-b", its compute, activations received, update, the bound
    VWs x batch / that stage's total, and the fill bound VWs x N_m x batch / the sum of
    every stage's total: a minibatch passes every stage once, N_m are in flight)."""
    plan = r.plans[0]

    def total(x) -> float:
        return x.compute_s + x.recv_forward_s + x.recv_backward_s + x.update_s
    s = max(plan.stages, key=total)
    samples = len(r.plans) * plan.batch_size
    return (f"{s.first}-{s.last}", s.compute_s, s.recv_forward_s + s.recv_backward_s,
            s.update_s, samples / total(s),
            samples * r.n_m / sum(total(x) for x in plan.stages))


# ResNet-152 stops at 8 hosts: planning a 16-stage ResNet-152 pipeline takes over 10
# minutes on a shared 2-core machine (VGG-19's 25 layers plan in seconds).
SCALING_HOSTS_BY_MODEL = {"vgg19": SCALING_HOSTS, "resnet152": (1, 2, 4, 8)}


def scaling_text(cache_dir: str | None = None, setup: PaperSetup = PAPER_SETUP) -> str:
    """Each row with what bounds it: Horovod's step (compute, ring, update) and ED-local's
    slowest stage (VW 0; compute, activations received, update) and its bound."""
    lines = []
    for m in ("vgg19", "resnet152"):
        results = scaling_results(cache_dir, m, hosts=SCALING_HOSTS_BY_MODEL[m], setup=setup)
        lines.append(f"{paper.MODEL_TITLES[m]}, hosts of 4 TITAN V: {'hosts':>5} "
                     f"{'Horovod':>8} {'step ms = compute + ring + update':>34} "
                     f"{'ED-local':>8} {'N_m':>4} {'VWs x stages':>12} "
                     f"{'slowest stage: layers, compute + receive + update ms':>52} "
                     f"{'bound':>6} {'fill':>6}")
        for h, r in results:
            hv = r.horovod
            comp = max(hv.compute_s) if hv.compute_s else 0.0
            ring = hv.step_s - comp - hv.update_s
            layers, c, rcv, upd, bound, fill = slowest_stage(r)
            lines.append(
                f"{'':36}{h:5} {hv.samples_per_s:8.0f} "
                f"{f'{hv.step_s * 1e3:.0f} = {comp * 1e3:.0f} + {ring * 1e3:.0f} + {hv.update_s * 1e3:.1f}':>34} "
                f"{r.samples_per_s:8.0f} {r.n_m:4} "
                f"{f'{len(r.plans)} x {r.plans[0].num_stages}':>12} "
                f"{f'{layers}, {c * 1e3:.1f} + {rcv * 1e3:.1f} + {upd * 1e3:.1f}':>52} "
                f"{bound:6.0f} {fill:6.0f}")
        rows = [(h, r.horovod.samples_per_s, r.samples_per_s) for h, r in results]
        mono = [all(b[k] >= a[k] for a, b in zip(rows, rows[1:])) for k in (1, 2)]
        lines.append(f"  monotone: Horovod {'yes' if mono[0] else 'NO'}, ED-local "
                     f"{'yes' if mono[1] else 'NO'}")
    return "\n".join(lines)


def report(cache_dir: str | None = None, setup: PaperSetup = PAPER_SETUP) -> str:
    cells = headline_cells(cache_dir, setup=setup)
    return "\n\n".join([
        "\n".join(paper._header(setup)),
        "== Table 4: headline cells (paper vs model) ==", table4_text(cells),
        "== Figure 5 (16 GPUs, D=0, best N_m <= 5) ==", figure5_text(cache_dir, setup=setup),
        "== Clock distance (Section 8.4) ==", clock_distance_text(cache_dir, setup=setup),
        "== Homogeneous scaling ==", scaling_text(cache_dir, setup=setup),
        "== Why cells are off (docs/cluster_model.md) ==", causes_text(cache_dir, setup)])


# ------------------------------------------------------------------ why cells are off


def horovod_implied_rows(cache_dir: str | None = None, setup: PaperSetup = PAPER_SETUP
                         ) -> list[tuple[str, str, int, float, float, float, float]]:
    """Per Table 4 Horovod cell: (model, column, GPUs, model step s, paper step s, slowest
    GPU's compute s, ring-link GB/s the paper's step implies with no overlap). The last is
    2 (n-1)/n x gradient bytes / (paper step - compute - update): what a ring link must
    have carried if the paper's step were compute, all-reduce, then the optimizer step."""
    from hetpipe_tf.sim.allreduce import horovod
    rows = []
    for m in ("vgg19", "resnet152"):
        _, hv_profile, _ = paper._profiles(m, cache_dir, setup)
        grads = sum(int(l.trainable_param_bytes) for l in hv_profile.layers)
        for c, letters in enumerate(paper.TABLE4_COLUMNS):
            theirs = paper.TABLE4[m]["Horovod"][c]
            if theirs is None:
                continue
            cluster = paper.subcluster(letters, setup=setup)
            h = horovod(hv_profile, cluster.devices, cluster, config=setup.horovod)
            n = len(h.devices)
            step_paper = n * hv_profile.batch_size / theirs
            compute = max(h.compute_s)
            comm = step_paper - compute - h.update_s
            rate = 2 * (n - 1) / n * grads / comm / 1e9 if comm > 0 else float("nan")
            rows.append((m, letters, n, h.step_s, step_paper, compute, rate))
    return rows


def single_host_rows(cache_dir: str | None = None, setup: PaperSetup = PAPER_SETUP
                     ) -> list[tuple[str, str, float, float, float]]:
    """Table 4's 4 [V] HetPipe cell (1 VW, N_m 5) per model under the cluster model and
    under one hypothesis: (model, variant, samples/s, slowest stage's compute + receive
    s, the paper's time per minibatch s). Variant "PS over one TF gRPC stream": the PS is
    a TF task of its own, so a push or pull on its host goes through gRPC at
    `TF_GRPC_STREAM_BANDWIDTH` instead of PCIe."""
    from hetpipe_tf.sim.network import TF_GRPC_STREAM_BANDWIDTH, NetworkConfig
    base = setup.network or NetworkConfig()
    variants = (("cluster model", base),
                ("PS over one TF gRPC stream",
                 dataclasses.replace(base, pcie_bandwidth=TF_GRPC_STREAM_BANDWIDTH)))
    rows = []
    for m in ("vgg19", "resnet152"):
        profile, hv_profile, _ = paper._profiles(m, cache_dir, setup)
        theirs = paper.TABLE4[m]["HetPipe"][0]
        for name, net in variants:
            r = simulate_scenario(profile, paper.subcluster("V", setup=setup), "ED",
                                  "ed_local", n_m=paper.TABLE4[m]["concurrent"][0],
                                  num_virtual_workers=1, num_waves=10,
                                  horovod_config=setup.horovod, horovod_profile=hv_profile,
                                  network=net)
            slowest = max(s.compute_s + s.recv_forward_s + s.recv_backward_s
                          for s in r.plans[0].stages)
            rows.append((m, name, r.samples_per_s, slowest,
                         profile.batch_size / theirs))
    return rows


def causes_text(cache_dir: str | None = None, setup: PaperSetup = PAPER_SETUP) -> str:
    """The figures behind docs/cluster_model.md's "Why cells are off"."""
    lines = [f"Horovod: {'model':8} {'GPUs':>4} {'model step s':>12} {'paper step s':>12} "
             f"{'compute s':>9} {'implied ring link GB/s (no overlap)':>36}"]
    for m, col, n, ours, theirs, compute, rate in horovod_implied_rows(cache_dir, setup):
        lines.append(f"{'':9}{paper.MODEL_TITLES[m]:10} [{col:4}] {n:2} {ours:12.3f} "
                     f"{theirs:12.3f} {compute:9.3f} {rate:36.2f}")
    lines.append(f"HetPipe 4 [V], 1 VW: {'model':10} {'variant':28} {'samples/s':>9} "
                 f"{'slowest stage s':>15} {'paper s/minibatch':>17}")
    for m, name, sps, slowest, theirs in single_host_rows(cache_dir, setup):
        lines.append(f"{'':21}{paper.MODEL_TITLES[m]:10} {name:28} {sps:9.0f} "
                     f"{slowest:15.4f} {theirs:17.4f}")
    return "\n".join(lines)
