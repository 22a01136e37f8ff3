"""The decomposition estimate of time to accuracy for models too large to train here: the
epochs a configuration needed on a small task (under its own staleness) x the cluster
model's time per epoch of VGG-19 or ResNet-152 on the paper's 16-GPU cluster (ImageNet's
1,281,167 training images per epoch). An ESTIMATE: the epochs are the small task's, not
the large model's; the time per epoch is the simulator's (`experiments.paper`'s profiles,
setup and cluster: docs/cluster_model.md).
"""

from __future__ import annotations

from typing import Sequence

from experiments._paper_tta import IMAGENET_TRAIN_IMAGES, Kind, Row, simulate_synchronous

MODELS = ("vgg19", "resnet152")


def samples_per_s(model: str, rows: Sequence[Row], cache_dir: str | None,
                  micro_batches: int) -> dict[Row, float]:
    """The cluster model's samples/s of every row for `model` (batch 32 per GPU / VW; HetPipe
    at the largest N_m every VW fits, as Table 4's "max fit" row)."""
    from experiments import paper
    from hetpipe_tf.sim import horovod
    from hetpipe_tf.sim.hetseq import hetseq
    from hetpipe_tf.sim.scenario import simulate_scenario

    setup = paper.PAPER_SETUP
    profile, _ = paper.paper_profile(model, cache_dir,
                                     kept_activations=setup.plan_kept_activations)
    hv_profile, _ = paper.paper_profile(model, cache_dir,
                                        kept_activations=setup.horovod_kept_activations)
    cluster = paper.subcluster("VRGQ", setup=setup)
    scenarios: dict[tuple[str, int], object] = {}

    def scenario(policy: str, d: int):
        if (policy, d) not in scenarios:
            scenarios[(policy, d)] = simulate_scenario(
                profile, cluster, "ED" if policy == "ED-local" else policy,
                "ed_local" if policy == "ED-local" else "default", clock_distance=d,
                ranking=paper.PAPER_RANKING, horovod_config=setup.horovod,
                horovod_profile=hv_profile, network=setup.network)
        return scenarios[(policy, d)]

    out: dict[Row, float] = {}
    for row in rows:
        if row.kind is Kind.HOROVOD:
            out[row] = horovod(hv_profile, cluster.devices, cluster,
                               config=setup.horovod).samples_per_s
        elif row.kind is Kind.HETSEQ:
            out[row] = hetseq(hv_profile, cluster.devices, cluster,
                              config=setup.horovod).samples_per_s
        elif row.kind in (Kind.GPIPE, Kind.ONE_F_ONE_B):
            out[row] = simulate_synchronous(row, profile, cluster, scenario("ED", 0).plans,
                                            micro_batches).samples_per_s
        else:
            out[row] = scenario(row.policy, row.d).samples_per_s
    return out


def estimate_rows(epochs: dict[Row, int | None], speeds: dict[str, dict[Row, float]]
                  ) -> list[tuple[str, ...]]:
    """Table rows: configuration, its epochs, and per model the hours to target
    (epochs x images per epoch / samples/s) and how much sooner than Horovod."""
    header = ["configuration", "epochs (small task)"]
    for m in speeds:
        header += [f"{m} img/s", f"{m} est. h to target", f"{m} vs Horovod"]
    out = [tuple(header)]
    hv = next((r for r in epochs if r.kind is Kind.HOROVOD), None)
    for row, e in epochs.items():
        cells = [row.label, "-" if e is None else str(e)]
        for m, per in speeds.items():
            rate = per.get(row, 0.0)
            hours = e * IMAGENET_TRAIN_IMAGES / rate / 3600 if e and rate > 0 else None
            base = (epochs.get(hv) and per.get(hv) and
                    epochs[hv] * IMAGENET_TRAIN_IMAGES / per[hv] / 3600) if hv else None
            vs = (sooner(hours, base) if hours and base and row is not hv else "")
            cells += [f"{rate:.0f}", "-" if hours is None else f"{hours:.1f}", vs]
        out.append(tuple(cells))
    return out


def sooner(seconds: float, baseline: float) -> str:
    """"x% sooner" (or "x% later") than `baseline`."""
    gain = 1 - seconds / baseline
    return f"{abs(gain) * 100:.0f}% {'sooner' if gain >= 0 else 'later'}"
