"""What experiments/paper_time_to_accuracy.py decides, without flags: the row set, the
tasks, the plans and placement on the paper's cluster, each row's virtual time, and the
epochs to a target. TensorFlow and Keras are imported when called.

Rows (`row_set`):
- HetPipe (NP, ED, ED-local, HD; each D; each compensation, "default" = none given):
  trained under `HetPipeStrategy(plan=plans, clock=VirtualClock(..., placement=...))`,
  the virtual clock of `hetpipe_tf.sim`: numerics of the runtime in the cluster model's
  order and time.
- Horovod, HetSeq, GPipe, 1F1B: synchronous SGD over their global batch, whose numerics do
  not depend on the cluster's order. Their epochs to target come from ONE plain Keras run
  per global batch; their virtual seconds are those epochs' steps x the cluster model's
  seconds per step for that configuration (`sim.horovod`, `sim.hetseq.hetseq`, `simulate`
  with the GPipe/1F1B schedule).
"""

from __future__ import annotations

import dataclasses
import enum
from typing import Any, Callable, Sequence


PAPER_TYPES = ("TITAN_V", "TITAN_RTX", "RTX_2060", "QUADRO_P4000")   # fastest first (8.1)
POLICIES = ("NP", "ED", "ED-local", "HD")
COMPENSATIONS = ("none", "default", "both", "predict", "momentum", "average", "all",
                 "both_dc", "both_ga")
SCHEDULES = ("gpipe", "1f1b")
TASKS = ("cnn", "spirals")
# Section 8.4: HetPipe (ED-local) reaches the target this much sooner than Horovod.
PAPER_SOONER = {"vgg19": "49%", "resnet152": "35-39%"}
IMAGENET_TRAIN_IMAGES = 1_281_167   # the paper's data set (ILSVRC-2012 training images)


class Kind(enum.Enum):
    HOROVOD = "Horovod"
    HETSEQ = "HetSeq"
    GPIPE = "GPipe"
    ONE_F_ONE_B = "1F1B"
    HETPIPE = "HetPipe"

    @property
    def synchronous(self) -> bool:
        return self is not Kind.HETPIPE


@dataclasses.dataclass(frozen=True)
class Row:
    """One configuration of the table."""

    kind: Kind
    policy: str = ""              # HetPipe: NP, ED, ED-local, HD; GPipe/1F1B: ED
    d: int = 0
    compensation: str = ""        # HetPipe: a preset name, or "default" (none given)
    n_m: int = 0                  # HetPipe: 0 = the binary's --n_m
    picked: bool = False          # HetPipe: the defaults' pick (`pick`)

    @property
    def label(self) -> str:
        if self.kind is Kind.HETPIPE and self.picked:
            return (f"HetPipe pick: {self.policy}, N_m={self.n_m}, D={self.d}, "
                    f"{self.compensation}")
        if self.kind is Kind.HETPIPE:
            return f"HetPipe {self.policy}, D={self.d}, {self.compensation}"
        if self.kind in (Kind.GPIPE, Kind.ONE_F_ONE_B):
            return f"{self.kind.value} {self.policy} 4 VWs, synchronous"
        if self.kind is Kind.HETSEQ:
            return "HetSeq 16 GPUs, shares by speed"
        return "Horovod 16 GPUs, equal batches"


def row_set(policies: Sequence[str], distances: Sequence[int], compensations: Sequence[str],
            schedules: Sequence[str]) -> tuple[Row, ...]:
    """Horovod and HetSeq, then each schedule, then HetPipe policy x D x compensation."""
    rows = [Row(Kind.HOROVOD), Row(Kind.HETSEQ)]
    rows += [Row(Kind.GPIPE if s == "gpipe" else Kind.ONE_F_ONE_B, "ED") for s in schedules]
    rows += [Row(Kind.HETPIPE, p, d, c) for p in policies for d in distances
             for c in compensations]
    return tuple(rows)


def global_batch(row: Row, batch: int, num_vws: int, num_gpus: int) -> int:
    """Samples per synchronous step: every GPU a minibatch (Horovod; HetSeq splits the same
    global batch by speed), or every VW one (GPipe/1F1B)."""
    if row.kind in (Kind.HOROVOD, Kind.HETSEQ):
        return batch * num_gpus
    if row.kind in (Kind.GPIPE, Kind.ONE_F_ONE_B):
        return batch * num_vws
    raise ValueError(f"HetPipe rows have no synchronous global batch. Received: {row.label}.")


def sync_history(accuracies: Sequence[float], steps_per_epoch: int, step_s: float
                 ) -> list[tuple[float, float]]:
    """A synchronous run's (virtual seconds, accuracy) per epoch: epoch e ends after
    e x steps_per_epoch steps of `step_s` each."""
    return [((e + 1) * steps_per_epoch * step_s, a) for e, a in enumerate(accuracies)]


# --- tasks -------------------------------------------------------------------------------
@dataclasses.dataclass(frozen=True)
class Task:
    name: str
    x: Any
    y: Any
    x_val: Any
    y_val: Any
    build: Callable[[], Any]
    what: str


def load_task(name: str, examples: int = 0) -> Task:
    """cnn: scikit-learn's 8x8 digits (shipped inside the package) upsampled to 32x32x3,
    `models.build_model("small_cnn")`; spirals: `models.spirals` (two turns, noise 0.04,
    4096 examples) and `models.spiral_resmlp(64, depth=3)`. examples > 0: the first ones."""
    import numpy as np

    from hetpipe_tf import models

    if name == "cnn":
        x, y, xv, yv = models.digits()

        def up(a):   # each pixel a 4x4 block, three equal channels
            return np.repeat(np.kron(a.reshape(-1, 8, 8), np.ones((4, 4), "float32"))
                             [..., None], 3, -1)

        x, xv = up(x), up(xv)
        build = lambda: models.build_model("small_cnn", input_size=32,  # noqa: E731
                                           num_classes=10)
        what = "scikit-learn digits at 32x32x3, small_cnn (2 conv, 2 dense)"
    elif name == "spirals":
        x, y = models.spirals(4096, seed=0, turns=4.4, noise=0.04)
        xv, yv = models.spirals(1024, seed=1, turns=4.4, noise=0.04)
        build = lambda: models.spiral_resmlp(64, depth=3)  # noqa: E731
        what = "spirals (two turns, noise 0.04), spiral_resmlp(64, depth 3)"
    else:
        raise ValueError(f"Unknown task. Received: {name!r}; use one of {TASKS}.")
    if examples:
        x, y = x[:examples], y[:examples]
        xv, yv = xv[:max(examples // 4, 32)], yv[:max(examples // 4, 32)]
    return Task(name, x, y, xv, yv, build, f"{what}; {len(x)} train / {len(xv)} validation")


def task_profile(task: Task, batch: int) -> Any:
    """The task model's profile on the paper's GPU types (catalog estimates), in the
    paper's measured speed order: the times every plan and step of the table carries."""
    from hetpipe_tf.partitioner.profiling import profile_model
    from hetpipe_tf.sim.calibration import in_measured_order

    return in_measured_order(profile_model(task.build(), batch, list(PAPER_TYPES)))


# --- HetPipe plans and their parameter placement ------------------------------------------
def hetpipe_plans(profile: Any, cluster: Any, policy: str, n_m: int = 0):
    """(plans on `cluster`'s devices, PS shares per VW per stage) of `policy` (4 VWs).
    n_m = 0: the stages of the longest VW (min(Max_m, k), the throughput default)."""
    from hetpipe_tf.cluster.allocation import allocate
    from hetpipe_tf.ps.placement import place_parameters, traffic
    from hetpipe_tf.sim.scenario import plan_distinct

    alloc = "ED" if policy == "ED-local" else policy
    vws = [tuple(cluster.device(d) for d in vw)
           for vw in allocate(cluster, alloc, profile=profile, ranking=PAPER_TYPES)]
    plans, _, _ = plan_distinct(profile, vws, cluster, n_m=n_m or None)
    if not n_m:
        plans, _, _ = plan_distinct(profile, vws, cluster,
                                    n_m=min(plans[0].n_m, max(p.num_stages for p in plans)))
    placed = place_parameters(profile, plans, cluster,
                              policy="ed_local" if policy == "ED-local" else "default")
    shares = []
    for stages in traffic(placed, plans, profile, cluster):
        shares.append(tuple(
            tuple((t.ps_host, t.bytes / max(sum(u.bytes for u in st), 1)) for t in st)
            for st in stages))
    return tuple(plans), tuple(shares)


# --- the defaults' pick (hetpipe_tf/strategy/pick.py) ---------------------------------------
# Epochs to 0.95 at N_m = 1, D = 0 (no staleness but the 4 VWs' own), measured under the
# virtual clock with ED-local and the default compensation (docs/time_to_accuracy.md "The
# defaults"): cnn at its 1437 examples, spirals at 2048.
BASE_EPOCHS = {"cnn": 2.0, "spirals": 4.0}


def pick(profile: Any, cluster: Any, policies: Sequence[str], distances: Sequence[int],
         compensation: Any, base_epochs: float, minibatches_per_epoch: float,
         num_waves: int = 10) -> Any:
    """The defaults' pick (`hetpipe_tf.strategy.pick`) over `policies` x N_m in 1..k (k:
    the policy's stages per VW) x `distances`: each candidate's seconds per minibatch from
    the virtual clock's cluster model (`VirtualClock(cluster, placement=...)`, the model
    the HetPipe rows train in), its epochs from the epoch model of `compensation` with
    `base_epochs`."""
    from hetpipe_tf.sim import VirtualClock
    from hetpipe_tf.strategy.pick import epoch_model, pick_for_time_to_accuracy
    from hetpipe_tf.strategy.planning import simulated_candidates, stage_bytes

    cands = []
    for policy in policies:
        k = max(p.num_stages for p in hetpipe_plans(profile, cluster, policy)[0])
        for n in range(1, k + 1):
            plans, shares = hetpipe_plans(profile, cluster, policy, n)
            cands += simulated_candidates(
                VirtualClock(cluster, placement=shares), plans,
                [stage_bytes(p, profile) for p in plans], [n], distances,
                label=policy, num_waves=num_waves)
    return pick_for_time_to_accuracy(cands, epoch_model(compensation).with_base(base_epochs),
                                     minibatches_per_epoch)


def sync_step_s(row: Row, profile: Any, cluster: Any, ed_plans: Sequence[Any],
                micro_batches: int, waves: int = 8) -> float:
    """The cluster model's seconds per synchronous step of `row` (module doc). GPipe/1F1B:
    the ED VWs' pipelines (identical) in step, the slowest sets the step; the sim's
    synchronous schedules move no parameters between VWs."""
    from hetpipe_tf.sim import horovod
    from hetpipe_tf.sim.hetseq import hetseq

    from experiments.paper_setup import PAPER_SETUP

    # The paper setup's all-reduce (Horovod on the CPU, docs/cluster_model.md), as
    # experiments.paper and the estimate use.
    if row.kind is Kind.HOROVOD:
        return horovod(profile, cluster.devices, cluster, config=PAPER_SETUP.horovod).step_s
    if row.kind is Kind.HETSEQ:
        return hetseq(profile, cluster.devices, cluster, config=PAPER_SETUP.horovod).step_s
    out = simulate_synchronous(row, profile, cluster, ed_plans, micro_batches, waves)
    return len(ed_plans) / out.minibatches_per_s


def simulate_synchronous(row: Row, profile: Any, cluster: Any, plans: Sequence[Any],
                         micro_batches: int, waves: int = 8) -> Any:
    """The cluster model's run of `plans` under row's synchronous schedule (GPipe or 1F1B,
    M = micro_batches), every VW's pipeline in step."""
    from hetpipe_tf.sim import SimConfig, from_plan, simulate, stage_update_times

    vws = [from_plan(p, cluster, name=f"vw{v}", cut_bytes=profile.cut_bytes,
                     update_s=stage_update_times(p, profile)) for v, p in enumerate(plans)]
    mode = "gpipe" if row.kind is Kind.GPIPE else "1f1b"
    return simulate(vws, SimConfig(n_m=micro_batches, num_waves=waves, mode=mode), cluster)


# --- training ------------------------------------------------------------------------------
def target_stopper(target: float, time_key: str):
    """A Keras callback: `history` of (logs[time_key], val_accuracy) per epoch, and training
    stopped at the first epoch end whose validation accuracy reached `target`."""
    import keras

    class StopAtTarget(keras.callbacks.Callback):
        def __init__(self):
            super().__init__()
            self.history: list[tuple[float, float]] = []

        def on_epoch_end(self, epoch, logs=None):
            logs = logs or {}
            acc = float(logs.get("val_accuracy", 0.0))
            self.history.append((float(logs.get(time_key, epoch + 1)), acc))
            if acc >= target:
                self.model.stop_training = True

    return StopAtTarget()


def fit(task: Task, optimizer: tuple[str, dict], weights0: list, batch: int, epochs: int,
        target: float, strategy: Any = None, seed: int = 0, stop: bool = True
        ) -> tuple[list[tuple[float, float]], str]:
    """((virtual seconds or epoch number, validation accuracy) per epoch, the compensation
    the strategy ran with or "") of one training from `weights0`: under `strategy` (its
    `virtual_time_s`) or plain Keras (the epoch number); stopped at `target` when `stop`.
    Every training starts from random state `seed` (dropout's masks), so that a row's
    figures do not depend on the rows trained before it in the same process."""
    import keras
    import tensorflow as tf

    from experiments import _study

    keras.utils.set_random_seed(seed)

    ds = (tf.data.Dataset.from_tensor_slices((task.x, task.y)).shuffle(len(task.x), seed=seed)
          .batch(batch, drop_remainder=True))
    val = tf.data.Dataset.from_tensor_slices((task.x_val, task.y_val)).batch(256)
    cb = target_stopper(target if stop else float("inf"), "virtual_time_s")
    with _study.compiled(task.build, optimizer, weights0, strategy) as model:
        model.fit(ds, validation_data=val, epochs=epochs, verbose=0, callbacks=[cb])
        used = strategy.extended.compensation.value if strategy is not None else ""
    return cb.history, used


def scaled(optimizer: tuple[str, dict], factor: float) -> tuple[str, dict]:
    """The optimizer at `factor` x its learning rate (Horovod's documented rule: the rate
    x the workers; WSP sums the VWs' updates alike)."""
    cls, kwargs = optimizer
    return cls, {**kwargs, "learning_rate": kwargs["learning_rate"] * factor}
