"""Each device's share of the global batch for HetSeq-style data parallelism (pure).

Every device holds the whole model and trains on its share n_k of the global batch N; the
shares' gradients (each share's loss weighted by n_k / N) are summed and applied once
(hetpipe_tf/ps/hetseq.py). A synchronous step ends when the slowest share ends, so the
shares are chosen to minimise the largest predicted share time

    t_k(n) = fixed_s_k + seconds_per_sample_k x n      (n >= 1; t_k(0) = 0)

subject to n_k <= max_samples_k (the device's memory) and sum n_k = N, every device taking
at least `minimum` samples (1 for a plan: a device given to the strategy takes part).

The rule is greedy and exact: starting from the minimum, each next sample goes to the
device whose time after taking it is the smallest (ties: the lower index). For
non-decreasing t_k this picks the N smallest values of {t_k(m)}, so the largest share
time is the smallest any split reaches (the classic bottleneck-allocation argument);
O(N log K). The same rule splits a smaller batch (an epoch's remainder) in proportion
(`Shares.split`); shares given by hand split smaller batches in proportion to themselves.

`speeds_from_profile` reads the per-sample time and the memory bound of each device from a
partitioner `ModelProfile` through the cost model (one stage holding the whole model at
N_m = 1; times divided by the device's emulated speed factor, as the planner does).
"""

from __future__ import annotations

import dataclasses
import heapq
import math
import numbers
from typing import Any, Sequence

from hetpipe_tf._args import check_int


class ShareError(ValueError):
    """Shares that cannot be made or used (a ValueError, refused before training)."""


@dataclasses.dataclass(frozen=True)
class DeviceSpeed:
    """What the share rule needs of one device.

    seconds_per_sample: compute (forward + backward) seconds per sample of a share.
    fixed_s: seconds a share costs whatever its size (a call's own cost).
    max_samples: the largest share the device's memory holds; None = no bound known.
    """

    name: str
    seconds_per_sample: float
    fixed_s: float = 0.0
    max_samples: int | None = None

    def __post_init__(self) -> None:
        if not (self.seconds_per_sample > 0 and math.isfinite(self.seconds_per_sample)):
            raise ShareError(f"Device {self.name}: seconds_per_sample must be a finite number "
                             f"> 0. Received: seconds_per_sample={self.seconds_per_sample!r}; "
                             "profile the model on the device's type.")
        if not (self.fixed_s >= 0 and math.isfinite(self.fixed_s)):
            raise ShareError(f"Device {self.name}: fixed_s must be a finite number >= 0. "
                             f"Received: fixed_s={self.fixed_s!r}.")
        if self.max_samples is not None:
            check_int("max_samples", self.max_samples, minimum=0, error=ShareError,
                      hint=f"device {self.name}: None (no bound) or a sample count")

    def time(self, n: int) -> float:
        """Predicted seconds of a share of n samples."""
        return 0.0 if n == 0 else self.fixed_s + self.seconds_per_sample * n


@dataclasses.dataclass(frozen=True)
class Shares:
    """The devices' shares of a global batch of `batch_size` and why they were chosen."""

    batch_size: int
    sizes: tuple[int, ...]
    speeds: tuple[DeviceSpeed, ...]
    given: bool = False          # sizes given by hand (not chosen by the rule)
    reason: str = ""

    @property
    def devices(self) -> tuple[str, ...]:
        return tuple(s.name for s in self.speeds)

    @property
    def step_s(self) -> tuple[float, ...]:
        """Predicted seconds of each device's share."""
        return tuple(s.time(n) for s, n in zip(self.speeds, self.sizes))

    @property
    def offsets(self) -> tuple[int, ...]:
        """Where each share starts in the global batch (len K + 1, last = batch_size)."""
        out = [0]
        for n in self.sizes:
            out.append(out[-1] + n)
        return tuple(out)

    def split(self, n: int, minimum: int = 0) -> tuple[int, ...]:
        """Shares of a batch of n <= batch_size samples (an epoch's remainder): the same
        rule on the same speeds, so in proportion; a device may get 0 when n is small
        (`minimum`: every device at least that many; needs n >= minimum x devices)."""
        _check_int("n", n)
        if n > self.batch_size:
            raise ShareError(
                f"A batch is larger than the global batch the shares were made for. Received: "
                f"batch of {n}, shares {list(self.sizes)} for {self.batch_size}; batch the "
                f"dataset with batch_size={self.batch_size}, or make shares for {n}.")
        if n == self.batch_size:
            return self.sizes
        # Given by hand: in proportion to the given shares (as if 1 / share s a sample).
        speeds = (tuple(DeviceSpeed(s.name, 1.0 / k) for s, k in zip(self.speeds, self.sizes))
                  if self.given else self.speeds)
        return _greedy(n, speeds, minimum, caps=self.sizes)

    def table(self) -> str:
        lines = [f"HetSeq shares of a global batch of {self.batch_size} "
                 f"({'given' if self.given else 'chosen by speed'}):",
                 "device                          share  max (memory)  predicted step s"]
        for s, n, t in zip(self.speeds, self.sizes, self.step_s):
            cap = "-" if s.max_samples is None else str(s.max_samples)
            lines.append(f"{s.name:30}  {n:5}  {cap:>12}  {t:16.6f}")
        if self.reason:
            lines.append(self.reason)
        return "\n".join(lines)


def _check_int(what: str, n: Any) -> None:
    check_int(what, n, minimum=0, error=ShareError)


def _greedy(n: int, speeds: Sequence[DeviceSpeed], minimum: int,
            caps: Sequence[int | None] | None = None) -> tuple[int, ...]:
    """The min-max split of n samples (module docstring); caps default to max_samples."""
    caps = [s.max_samples for s in speeds] if caps is None else list(caps)
    sizes = [minimum] * len(speeds)
    heap = [(s.time(minimum + 1), k) for k, s in enumerate(speeds)
            if caps[k] is None or caps[k] > minimum]
    heapq.heapify(heap)
    for _ in range(n - minimum * len(speeds)):
        _, k = heapq.heappop(heap)   # callers checked that the caps hold n
        sizes[k] += 1
        if caps[k] is None or sizes[k] < caps[k]:
            heapq.heappush(heap, (speeds[k].time(sizes[k] + 1), k))
    return tuple(sizes)


def _check_fits(batch_size: int, speeds: Sequence[DeviceSpeed]) -> None:
    if not speeds:
        raise ShareError("HetSeq needs at least one device. Received: no devices.")
    if batch_size < len(speeds):
        raise ShareError(
            "The global batch is smaller than the number of devices, so some device would "
            f"train on nothing. Received: batch_size={batch_size} for {len(speeds)} devices "
            f"({', '.join(s.name for s in speeds)}); use batch_size >= {len(speeds)} or fewer "
            "devices.")
    short = [s for s in speeds if s.max_samples is not None and s.max_samples < 1]
    if short:
        raise ShareError(
            "A device's memory has no room for a sample after the model's weights. Received: "
            f"{', '.join(s.name for s in short)} with max_samples=0; leave it out of the "
            "devices, or use a smaller model.")
    caps = [s.max_samples for s in speeds]
    if None not in caps and sum(caps) < batch_size:
        raise ShareError(
            "The devices' memory cannot hold the global batch. Received: batch_size="
            f"{batch_size}, at most {sum(caps)} samples fit ("
            + ", ".join(f"{s.name}: {s.max_samples}" for s in speeds)
            + "); use a smaller batch or more devices.")


def choose_shares(batch_size: int, speeds: Sequence[DeviceSpeed]) -> Shares:
    """The shares of `batch_size` that minimise the slowest share's predicted time."""
    _check_int("batch_size", batch_size)
    speeds = tuple(speeds)
    _check_fits(batch_size, speeds)
    sizes = _greedy(batch_size, speeds, 1)
    return Shares(batch_size, sizes, speeds, given=False,
                  reason=_reason(batch_size, sizes, speeds))


def check_share_sizes(sizes: Sequence[object]) -> tuple[int, ...]:
    """Every share an int >= 1 (a list of per-device batch sizes), as ints."""
    for n in sizes:
        if isinstance(n, bool) or not isinstance(n, numbers.Integral) or n < 1:
            raise ShareError(f"Every share must be an int >= 1. Received: shares="
                             f"{list(sizes)!r}; give every device at least one sample.")
    return tuple(int(n) for n in sizes)


def given_shares(sizes: Sequence[int], speeds: Sequence[DeviceSpeed],
                 batch_size: int | None = None) -> Shares:
    """Shares given by hand, checked: one per device, each >= 1 and within the device's
    memory, summing to `batch_size` when that is given."""
    sizes = tuple(sizes)
    speeds = tuple(speeds)
    if len(sizes) != len(speeds):
        raise ShareError(f"Shares given by hand need one size per device. Received: "
                         f"shares={list(sizes)} for {len(speeds)} devices.")
    check_share_sizes(sizes)
    total = sum(int(n) for n in sizes)
    if batch_size is not None and total != batch_size:
        raise ShareError(
            f"The shares given by hand do not sum to the global batch. Received: shares="
            f"{list(sizes)} (sum {total}), batch_size={batch_size}; make them sum to "
            f"{batch_size} or batch the dataset with batch_size={total}.")
    over = [(s, n) for s, n in zip(speeds, sizes)
            if s.max_samples is not None and n > s.max_samples]
    if over:
        raise ShareError(
            "A share given by hand exceeds its device's memory. Received: "
            + ", ".join(f"{s.name}: share {n} > max {s.max_samples}" for s, n in over)
            + "; give it a smaller share, or let the planner choose (shares=None).")
    sizes = tuple(int(n) for n in sizes)
    return Shares(total, sizes, speeds, given=True,
                  reason=f"Shares given by hand: {list(sizes)}; a smaller batch is split in "
                         "proportion to them.")


def _reason(batch_size: int, sizes: Sequence[int], speeds: Sequence[DeviceSpeed]) -> str:
    step = max(s.time(n) for s, n in zip(speeds, sizes))
    equal_caps = [s.max_samples for s in speeds]
    k = len(speeds)
    equal = [batch_size // k + (1 if i < batch_size % k else 0) for i in range(k)]
    parts = []
    for s, n in zip(speeds, sizes):
        why = "memory bound" if s.max_samples is not None and n == s.max_samples else "speed"
        parts.append(f"{s.name}: {n} ({1 / s.seconds_per_sample:.4g} samples/s, by {why})")
    line = (f"Each next sample goes to the device that finishes it first: "
            f"{'; '.join(parts)}. Predicted step {step:.6g} s")
    if all(c is None or c >= e for c, e in zip(equal_caps, equal)):
        eq = max(s.time(n) for s, n in zip(speeds, equal))
        line += f" against {eq:.6g} s with equal shares {equal} ({eq / step:.2f}x)"
    return line + "."


def uniform_speeds(names: Sequence[str], speed_factors: Sequence[float] | None = None,
                   max_samples: Sequence[int | None] | None = None) -> tuple[DeviceSpeed, ...]:
    """Devices whose only known difference is a relative speed (1.0 = the fastest):
    seconds_per_sample = 1 / factor. For shares by speed factor without a profile."""
    factors = [1.0] * len(names) if speed_factors is None else list(speed_factors)
    caps = [None] * len(names) if max_samples is None else list(max_samples)
    if len(factors) != len(names) or len(caps) != len(names):
        raise ShareError(f"One speed factor and one memory bound per device are needed. "
                         f"Received: {len(names)} devices, {len(factors)} factors, "
                         f"{len(caps)} bounds.")
    return tuple(DeviceSpeed(n, 1.0 / f, max_samples=c) for n, f, c in zip(names, factors, caps))


def speeds_from_plans(plans: Sequence[Any]) -> tuple[DeviceSpeed, ...]:
    """Per virtual worker (split batches, ps/split.py): seconds per sample = its plan's
    predicted time of its slowest stage / the plan's batch size (a pipeline's pace; for a
    one-device VW, the device's speed, emulated factor included); largest share = the
    plan's batch size (the planner checked its memory at that size). A plan without
    predicted times (made by hand, e.g. `even_plan`): 1 / its slowest stage's emulated
    speed factor a sample, no memory bound."""
    out = []
    for k, p in enumerate(plans):
        name = f"vw{k} ({'+'.join(p.devices)})"
        if p.batch_size > 0 and p.predicted_stage_time_s > 0:
            out.append(DeviceSpeed(name, p.predicted_stage_time_s / p.batch_size,
                                   max_samples=p.batch_size))
        else:
            slowest = min(s.emulated_speed_factor for s in p.stages)
            out.append(DeviceSpeed(name, 1.0 / slowest))
    return tuple(out)


def speeds_from_profile(profile: Any, devices: Sequence[Any], cluster: Any, *,
                        optimizer_slots: int = 0, usable_fraction: float = 0.9
                        ) -> tuple[DeviceSpeed, ...]:
    """Per device of `cluster`: seconds per sample (the whole model's forward + backward at
    the profile's batch size / batch size, / the emulated speed factor) and the largest
    share its memory holds (weights, gradients and `optimizer_slots` slots fixed, the
    activations per sample on top; the partitioner's cost model at N_m = 1)."""
    from hetpipe_tf.partitioner.cost import CostModel

    out = []
    b = profile.batch_size
    last = len(profile.layers) - 1
    for ref in devices:
        d = cluster.device(ref)
        cm = CostModel(profile, [d], cluster, n_m=1, optimizer_slots=optimizer_slots,
                       usable_fraction=usable_fraction)
        cost = cm.stage_cost(0, last, 0, [d])
        per_sample_bytes = float(cm.activation.sum()) / b
        fixed_bytes = cost.memory_bytes - float(cm.activation.sum())
        room = cost.memory_available - fixed_bytes
        cap = 0 if room <= 0 else (None if per_sample_bytes <= 0
                                   else int(room // per_sample_bytes))
        out.append(DeviceSpeed(d.name, max(cost.compute_s, 1e-12) / b, max_samples=cap))
    return tuple(out)
