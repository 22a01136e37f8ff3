"""Cost model of a pipeline stage: predicted time and memory of a node range on a device.

One place computes what a stage costs, so the MILP's coefficients, the plan's reported
figures, the tests' exhaustive search and the simulator all agree.

Time of the stage at pipeline position j (one minibatch: forward + backward + update):
    compute: sum of its layers' forward+backward times on the device's type
    + update: sum of its layers' update times on that type (the optimizer step and the
      next weight-version snapshot every stage makes per minibatch, `LayerCost.update_s`;
      0 when the profile costs no update)
    (both / the device's emulated speed factor)
    + receiving the activations that cross its first cut from position j-1 (forward)
    + receiving the gradients that cross its last cut from position j+1 (backward).
`layer_time` (and so `prefix_time`, which the MILP is built from) is per layer compute +
update, so the solver's objective includes the update through the per-layer figures; a
tied layer's later call also adds the exchange of its borrowed weights and their gradient
(`tied_bytes`) with the slowest-linked other device (an upper bound: pipeline/tied.py).

Memory of the stage at position j, holding `held(j)` minibatches' activations (N_m for
every position but the last, which runs forward and backward of a minibatch as one task
and holds 1; upstream positions can hold all N_m in flight when a later stage is the
bottleneck):
    weights + gradients + optimizer slots (per trainable byte)
    + (N_m - 1) stashed versions of the trainable weights, at EVERY position (one version
      is w_local; the last position too: the versions of the minibatches in flight wait
      there until its task takes them; benchmarks/memory_benchmark.py, docs/memory.md)
    + held x (activations kept for backward + the received input activations)
    + with staleness compensation by weight prediction (`prediction=PredictionMemory(...)`,
      N_m > 1 only): its extra trainable-sized copies, per_version x (N_m - 1) + constant
      (each pending version's d, delay compensation's window of updates, the predicted
      weights a forward reads; measured by benchmarks/memory_benchmark.py --compensation,
      docs/memory.md "Staleness compensation"; strategy/prediction_memory.py gives the
      value for each Compensation). Default None: no such buffers.
Usable memory is the device's memory times `usable_fraction` (framework workspace).

Synchronous schedules (`sync=SyncMemory(M, schedule=...)`; N_m = 1, so no stashed
versions): a minibatch of M micro-batches, each 1/M of the profiled activations; the stage
at position j holds `SyncMemory.held(j, K)` micro-batches at once, the schedule's own rule
(`core.sync_schedule.Schedule.held`: GPipe M, 1F1B min(K - j, M)):
    weights + gradients + optimizer slots + the gradient accumulator (M > 1)
    + held/M x the received input activations (the last stage: the input gradients it
      keeps until its backward actions send them)
    + activations: held/M x the stage's activations; with re-materialization (and on the
      last stage, whose forward and backward run as one task) one micro-batch's working
      set, 1/M of them.
"""

from __future__ import annotations

import dataclasses
from typing import Any, Sequence

import numpy as np

from hetpipe_tf._args import check_int
from hetpipe_tf.core.schedule import held_minibatches
from hetpipe_tf.core.sync_schedule import Schedule
from hetpipe_tf.partitioner.comm import CommModel

# Optimizer state per trainable weight, by Keras optimizer class name.
_SLOTS_BY_OPTIMIZER = {
    "sgd": 0, "adam": 2, "adamw": 2, "adamax": 2, "nadam": 2, "amsgrad": 3, "rmsprop": 1,
    "adagrad": 1, "adadelta": 2, "ftrl": 2, "lion": 1, "lamb": 2, "adafactor": 2,
}


def optimizer_slots(optimizer: Any) -> int:
    """Number of optimizer slot variables per trainable weight.

    Accepts an int, an optimizer name ("sgd", "adam", ...) or a Keras optimizer instance
    (SGD with momentum and RMSprop with momentum keep one slot more).
    """
    if isinstance(optimizer, (int, np.integer)) and not isinstance(optimizer, bool):
        return check_int("optimizer", optimizer, minimum=0,
                         hint="pass the number of slot variables per weight")
    if isinstance(optimizer, str):
        name = optimizer.lower()
        extra = 0
    else:
        name = type(optimizer).__name__.lower()
        extra = 1 if float(getattr(optimizer, "momentum", 0) or 0) > 0 else 0
        if name == "adam" and getattr(optimizer, "amsgrad", False):
            name = "amsgrad"
    if name not in _SLOTS_BY_OPTIMIZER:
        raise ValueError(
            f"Unknown optimizer for the memory model. Received: optimizer={optimizer!r}; pass "
            f"the number of slot variables per weight as an int, or one of "
            f"{sorted(_SLOTS_BY_OPTIMIZER)}.")
    return _SLOTS_BY_OPTIMIZER[name] + extra


@dataclasses.dataclass(frozen=True)
class SyncMemory:
    """What a stage holds under a synchronous `schedule` of M micro-batches (module
    docstring); how many micro-batches each position holds is the schedule's own rule."""

    micro_batches: int
    schedule: Schedule = Schedule.GPIPE
    rematerialize: bool = False

    def __post_init__(self):
        check_int("micro_batches", self.micro_batches, minimum=1)
        schedule = Schedule.parse(self.schedule)
        if not schedule.synchronous:
            raise ValueError(f"SyncMemory models a synchronous schedule. Received: "
                             f"schedule={schedule}; plan HETPIPE with sync=None and n_m.")
        object.__setattr__(self, "schedule", schedule)

    def held(self, position: int, num_stages: int) -> int:
        """Micro-batches whose activations (or inputs) the stage holds at once."""
        return self.schedule.held(num_stages, self.micro_batches)[position]

    def activation_factor(self, position: int, num_stages: int) -> float:
        """The stage's profiled (whole-minibatch) activations it holds, as a fraction."""
        if self.rematerialize or position == num_stages - 1:
            return 1.0 / self.micro_batches
        return self.held(position, num_stages) / self.micro_batches


@dataclasses.dataclass(frozen=True)
class PredictionMemory:
    """Trainable-sized copies of a stage's weights that a staleness compensation keeps
    besides w_local and the N_m - 1 stashed versions: per_version x (N_m - 1) + constant,
    charged only at N_m > 1 (at N_m = 1 no predictor exists). Plain counts, so the
    partitioner needs nothing of the pipeline (strategy/prediction_memory.py maps each
    Compensation to one)."""

    per_version: int = 0
    constant: int = 0

    def __post_init__(self):
        for name in ("per_version", "constant"):
            check_int(name, getattr(self, name), minimum=0,
                      hint="count copies of the trainable weights")

    def copies(self, n_m: int) -> int:
        """Trainable-sized copies charged at N_m minibatches in flight."""
        return 0 if n_m <= 1 else self.per_version * (n_m - 1) + self.constant


@dataclasses.dataclass(frozen=True)
class StageCost:
    compute_s: float          # forward + backward of the stage's layers
    recv_forward_s: float
    recv_backward_s: float
    memory_bytes: int
    memory_available: int
    held: int
    update_s: float = 0.0     # the stage's per-minibatch update (optimizer + snapshot)

    @property
    def time_s(self) -> float:
        return self.compute_s + self.update_s + self.recv_forward_s + self.recv_backward_s

    @property
    def fits(self) -> bool:
        return self.memory_bytes <= self.memory_available


class CostModel:
    """Per-layer arrays of a profile against a set of devices, and stage costs from them."""

    def __init__(self, profile: Any, devices: Sequence[Any], cluster: Any, *, n_m: int,
                 optimizer_slots: int = 0, comm: CommModel | None = None,
                 usable_fraction: float = 0.9, sync: SyncMemory | None = None,
                 prediction: PredictionMemory | None = None) -> None:
        if not 0 < usable_fraction <= 1:
            raise ValueError("usable_fraction must be in (0, 1]. Received: "
                             f"usable_fraction={usable_fraction}.")
        self.profile = profile
        self.devices = tuple(devices)
        self.cluster = cluster
        self.n_m = n_m
        self.slots = optimizer_slots
        self.comm = comm or CommModel()
        self.num_layers = len(profile.layers)
        self.cut_bytes = np.asarray(profile.cut_bytes, dtype=np.float64)
        param = np.array([l.param_bytes for l in profile.layers], dtype=np.float64)
        trainable = np.array([l.trainable_param_bytes for l in profile.layers], dtype=np.float64)
        self.activation = np.array([l.activation_bytes for l in profile.layers], dtype=np.float64)
        # Bytes a layer costs independent of minibatches held (weights, gradients, slots and
        # the N_m - 1 stashed versions), and per extra minibatch held (its activations).
        # A tied layer's later call holds a borrowed copy and its gradient (tied_bytes).
        tied = np.array([getattr(l, "tied_bytes", 0) for l in profile.layers], dtype=np.float64)
        self.fixed_memory = (param + trainable * (1 + optimizer_slots) + (n_m - 1) * trainable
                             + tied)
        # Staleness compensation's buffers (weight prediction; N_m > 1 only).
        self.prediction = prediction
        if prediction is not None and prediction.copies(n_m):
            self.fixed_memory = self.fixed_memory + prediction.copies(n_m) * trainable
        self.sync = sync
        if sync is not None:   # N_m = 1: no stashed version; a gradient accumulator
            if n_m != 1:
                raise ValueError(f"A synchronous schedule runs one minibatch at a time. "
                                 f"Received: n_m={n_m} with sync={sync}; pass n_m=1.")
            self.fixed_memory = (param + trainable * (1 + optimizer_slots)
                                 + (trainable if sync.micro_batches > 1 else 0.0) + tied)
        self.per_held_memory = self.activation.copy()
        self._compute_time: dict[str, np.ndarray] = {}
        self._update_time: dict[str, np.ndarray] = {}
        self._layer_time: dict[str, np.ndarray] = {}
        for d in self.devices:
            times, updates = [], []
            for layer in profile.layers:
                if d.type_name not in layer.time_s:
                    raise ValueError(
                        f"The profile has no time for device type {d.type_name} (device "
                        f"{d.name}). Received: profiled types={sorted(layer.time_s)}; profile "
                        "the model for every device type of the virtual worker.")
                times.append(layer.time_s[d.type_name])
                updates.append(layer.update_s.get(d.type_name, 0.0))
            f = d.emulated_speed_factor
            self._compute_time[d.name] = np.asarray(times, dtype=np.float64) / f
            self._update_time[d.name] = np.asarray(updates, dtype=np.float64) / f
            self._layer_time[d.name] = (self._compute_time[d.name] + self._update_time[d.name]
                                        + self._tied_exchange(tied, d))
        self.capacity = {d.name: int(cluster.memory_of(d) * usable_fraction) for d in self.devices}
        # allowed[c]: a stage may end at node c (False between the calls of a shared layer).
        self.allowed = np.ones(max(self.num_layers - 1, 0), dtype=bool)
        self.allowed[list(getattr(profile, "forbidden_cuts", ()))] = False

    def _tied_exchange(self, tied: np.ndarray, device: Any) -> np.ndarray:
        """Per layer: the seconds a tied layer's later call adds on `device` to receive the
        borrowed weights and send their gradient back (`tied` holds both, in bytes), from
        the slowest-linked other device of the VW: where the owner sits is not known per
        layer, so this is an upper bound, as the memory charge is."""
        out = np.zeros(len(tied), dtype=np.float64)
        others = [d for d in self.devices if d.name != device.name]
        for i in np.flatnonzero(tied):
            out[i] = max((self.comm.seconds(int(tied[i]), d, device, self.cluster)
                          for d in others), default=0.0)
        return out

    def cuts_allowed(self, cuts: Sequence[int]) -> bool:
        """Whether every cut of a layout is one a plan may use."""
        return all(self.allowed[c] for c in cuts)

    # --- arrays the MILP is built from --------------------------------------------------
    def layer_time(self, device: Any) -> np.ndarray:
        """Per layer: forward+backward + update seconds on `device` (what a stage adds)."""
        return self._layer_time[device.name]

    def layer_compute_time(self, device: Any) -> np.ndarray:
        """Per layer: forward+backward seconds on `device`."""
        return self._compute_time[device.name]

    def layer_update_time(self, device: Any) -> np.ndarray:
        """Per layer: seconds of its weights' per-minibatch update on `device`."""
        return self._update_time[device.name]

    def prefix_time(self, device: Any) -> np.ndarray:
        """P[i] = time of nodes 0..i-1 on `device` (P[0] = 0, len L+1)."""
        return np.concatenate([[0.0], np.cumsum(self.layer_time(device))])

    def prefix_memory(self, held: int) -> np.ndarray:
        """M[i] = memory of nodes 0..i-1 at a position holding `held` minibatches."""
        per_layer = self.fixed_memory + (held - 1) * self.per_held_memory + self.activation
        return np.concatenate([[0.0], np.cumsum(per_layer)])

    def held(self, position: int, num_stages: int) -> int:
        """Minibatches (micro-batches under `sync`) the stage at `position` holds at once:
        the schedule's own rule (HETPIPE's at N_m, or the synchronous schedule's)."""
        if self.sync is None:
            return held_minibatches(position, num_stages, self.n_m)
        return self.sync.held(position, num_stages)

    def position_memory(self, position: int, num_stages: int) -> np.ndarray:
        """M[i] = memory of nodes 0..i-1 at `position` of a `num_stages` pipeline, without
        the received inputs (`input_factor`): what the solvers bound by the capacity."""
        if self.sync is None:
            return self.prefix_memory(self.held(position, num_stages))
        f = self.sync.activation_factor(position, num_stages)
        return np.concatenate([[0.0], np.cumsum(self.fixed_memory + f * self.activation)])

    def input_factor(self, position: int, num_stages: int) -> float:
        """How many times its input cut's bytes the stage at `position` holds."""
        if self.sync is None:
            return self.held(position, num_stages)
        return self.held(position, num_stages) / self.sync.micro_batches

    def cut_seconds(self, src: Any, dst: Any) -> np.ndarray:
        """Seconds to move each cut's bytes from `src` to `dst` (len L-1)."""
        return np.array([self.comm.seconds(int(b), src, dst, self.cluster)
                         for b in self.cut_bytes], dtype=np.float64)

    # --- evaluation of a concrete partition ---------------------------------------------
    def stage_cost(self, first: int, last: int, position: int, order: Sequence[Any]) -> StageCost:
        """Cost of nodes first..last at `position` of the pipeline `order` of devices."""
        k = len(order)
        device = order[position]
        held = self.held(position, k)
        compute = float(self.layer_compute_time(device)[first:last + 1].sum())
        update = float(self.layer_update_time(device)[first:last + 1].sum())
        recv_f = recv_b = 0.0
        prefix = self.position_memory(position, k)
        memory = float(prefix[last + 1] - prefix[first])
        if position > 0:
            nbytes = int(self.cut_bytes[first - 1])
            recv_f = self.comm.seconds(nbytes, order[position - 1], device, self.cluster)
            memory += self.input_factor(position, k) * nbytes
        if position < k - 1:
            recv_b = self.comm.seconds(int(self.cut_bytes[last]), order[position + 1], device,
                                       self.cluster)
        return StageCost(compute, recv_f, recv_b, int(round(memory)),
                         self.capacity[device.name], held, update_s=update)

    def evaluate(self, cuts: Sequence[int], order: Sequence[Any]) -> list[StageCost]:
        """Costs of all stages; `cuts[j]` is the last node of stage j (len k-1, increasing)."""
        bounds = [-1, *cuts, self.num_layers - 1]
        return [self.stage_cost(bounds[j] + 1, bounds[j + 1], j, order)
                for j in range(len(order))]
