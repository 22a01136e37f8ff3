"""Communication model: seconds to send activations or gradients between two devices.

Section 7 of the HetPipe paper: inside a node, time = bytes / (PCIe bandwidth x a
scaling-down constant), as in Paleo, because transfers never reach the peak bandwidth;
the constant is derived from transfers of several sizes between two devices of a node
(`measure_transfer` + `fit_intra_scale`). Between nodes, time is a linear regression
on measured (bytes, seconds) samples (`fit_inter_host`); without samples the model falls
back to bytes / the cluster's inter-host bandwidth.
"""

from __future__ import annotations

import dataclasses
import math
import numbers
import statistics
import time
from typing import Any, Mapping, Sequence

from hetpipe_tf._args import check_int
from hetpipe_tf.cluster.spec import Cluster, Device

# Paleo's default scaling-down constant for achievable vs. peak bandwidth; measure it
# with fit_intra_scale on the machine at hand when possible.
DEFAULT_INTRA_SCALE = 0.7


def _check_samples(samples: Sequence[tuple[int, float]]) -> tuple[list[int], list[float]]:
    sizes, seconds = [], []
    for s in samples:
        try:
            nbytes, secs = s
        except (TypeError, ValueError):
            raise ValueError(
                f"A sample must be a (bytes, seconds) pair. Received: sample={s!r}; "
                "pass e.g. (1048576, 0.0002).") from None
        if (isinstance(nbytes, bool) or not isinstance(nbytes, numbers.Integral)
                or nbytes < 0 or not isinstance(secs, numbers.Real)
                or not math.isfinite(secs) or secs < 0):
            raise ValueError(
                f"A sample needs bytes >= 0 (int) and seconds >= 0. Received: sample={s!r}; "
                "drop or fix the sample.")
        sizes.append(int(nbytes))
        seconds.append(float(secs))
    if len(set(sizes)) < 2:
        raise ValueError(
            "Fitting needs samples of at least 2 distinct sizes. "
            f"Received: sizes={sorted(set(sizes))}; measure transfers of several sizes.")
    return sizes, seconds


@dataclasses.dataclass(frozen=True)
class LinearFit:
    """seconds = intercept_s + seconds_per_byte x bytes (clamped at 0)."""

    intercept_s: float
    seconds_per_byte: float

    def __post_init__(self) -> None:
        for field in ("intercept_s", "seconds_per_byte"):
            v = getattr(self, field)
            if isinstance(v, bool) or not isinstance(v, numbers.Real) or not math.isfinite(v):
                raise ValueError(f"LinearFit {field} must be a finite number. "
                                 f"Received: {field}={v!r}; pass a float.")
            object.__setattr__(self, field, float(v))
        if self.seconds_per_byte < 0:
            raise ValueError(
                "LinearFit seconds_per_byte must be >= 0 (more bytes never take less "
                f"time). Received: seconds_per_byte={self.seconds_per_byte!r}; "
                "refit on samples over a wider range of sizes.")

    def predict(self, nbytes: int) -> float:
        """Predicted seconds for `nbytes`; 0 bytes is no transfer at all."""
        if nbytes <= 0:
            return 0.0
        # A fitted negative intercept must not produce negative times for small sizes.
        return max(0.0, self.intercept_s + self.seconds_per_byte * nbytes)


def _linregress(samples: Sequence[tuple[int, float]]) -> Any:
    from scipy import stats  # local import: only fitting needs scipy

    sizes, seconds = _check_samples(samples)
    return stats.linregress(sizes, seconds)


def fit_inter_host(samples: Sequence[tuple[int, float]]) -> LinearFit:
    """Least-squares line through (bytes, seconds) samples of inter-host transfers."""
    r = _linregress(samples)
    if r.slope < 0:
        raise ValueError(
            "The samples' transfer time decreases with size (negative slope). "
            f"Received: slope={r.slope!r} s/byte; measure over a wider range of sizes "
            "or with more repeats.")
    return LinearFit(intercept_s=float(r.intercept), seconds_per_byte=float(r.slope))


def fit_intra_scale(samples: Sequence[tuple[int, float]], bandwidth: float) -> float:
    """The scaling-down constant: achieved bandwidth / nominal `bandwidth`.

    The achieved bandwidth is 1 / slope of a line fitted through the samples, so a fixed
    per-transfer latency (the intercept) does not distort it.
    """
    if isinstance(bandwidth, bool) or not isinstance(bandwidth, numbers.Real) \
            or not math.isfinite(bandwidth) or bandwidth <= 0:
        raise ValueError(f"bandwidth must be > 0 (bytes/s). Received: bandwidth={bandwidth!r}; "
                         "pass the nominal link bandwidth, e.g. 15.75e9.")
    r = _linregress(samples)
    if r.slope <= 0:
        raise ValueError(
            "The samples' transfer time does not grow with size, so no bandwidth can be "
            f"derived. Received: slope={r.slope!r} s/byte; use larger sizes (copies "
            "between logical CPU devices of one process may share memory and cost nothing).")
    return float(1.0 / (r.slope * bandwidth))


@dataclasses.dataclass(frozen=True)
class CommModel:
    """Predicts transfer seconds between two devices of a cluster.

    Attributes:
      intra_scale: the Paleo-style scaling-down constant: the fraction of the nominal
        intra-host bandwidth transfers achieve (measured with `fit_intra_scale`).
      inter: a fit of inter-host transfer times, or None to use bytes / the cluster's
        `inter_bandwidth` (no fixed latency).
    """

    intra_scale: float = DEFAULT_INTRA_SCALE
    inter: LinearFit | None = None

    def __post_init__(self) -> None:
        s = self.intra_scale
        if isinstance(s, bool) or not isinstance(s, numbers.Real) or not math.isfinite(s) \
                or s <= 0:
            raise ValueError(f"intra_scale must be > 0. Received: intra_scale={s!r}; "
                             f"use e.g. {DEFAULT_INTRA_SCALE} or a measured value.")
        object.__setattr__(self, "intra_scale", float(s))
        if self.inter is not None and not isinstance(self.inter, LinearFit):
            raise ValueError(f"inter must be a LinearFit or None. Received: inter={self.inter!r}; "
                             "build it with fit_inter_host(samples).")

    def seconds(self, nbytes: int, src: Device | str, dst: Device | str,
                cluster: Cluster) -> float:
        """Seconds to move `nbytes` from `src` to `dst` (devices or device names)."""
        check_int("nbytes", nbytes, minimum=0, hint="pass a byte count")
        a, b = cluster.device(src), cluster.device(dst)
        if a.name == b.name or nbytes == 0:
            return 0.0
        if a.host == b.host:
            return nbytes / (cluster.host_of(a).intra_bandwidth * self.intra_scale)
        if self.inter is not None:
            return self.inter.predict(int(nbytes))
        return nbytes / cluster.inter_bandwidth

    def to_dict(self) -> dict[str, Any]:
        """JSON-able form."""
        inter = None if self.inter is None else dataclasses.asdict(self.inter)
        return {"intra_scale": self.intra_scale, "inter": inter}

    @classmethod
    def from_dict(cls, d: Mapping[str, Any]) -> CommModel:
        """Inverse of `to_dict`."""
        inter = d.get("inter")
        return cls(intra_scale=d.get("intra_scale", DEFAULT_INTRA_SCALE),
                   inter=None if inter is None else LinearFit(**inter))


def measure_transfer(src_tf_device: str, dst_tf_device: str, sizes: Sequence[int],
                     repeats: int = 3) -> list[tuple[int, float]]:
    """Time copying tensors of `sizes` bytes from one TF device to another.

    Works with any two devices TensorFlow can address: logical CPU devices of this
    process ("/device:CPU:0", "/device:CPU:1") or remote ones ("/job:worker/task:1/...")
    after `tf.config.experimental_connect_to_cluster`. Each size is copied once to warm
    up and then `repeats` times, each time from a fresh source tensor (TF caches a
    tensor's copy on a device); the median is returned. Returns one (bytes, seconds)
    sample per size, in the order given.
    """
    check_int("repeats", repeats, minimum=1, hint="pass e.g. repeats=3")
    for n in sizes:
        check_int("size", n, minimum=1, hint="transfer sizes are bytes, e.g. [2**16, 2**20, "
                  "2**24]")
    import tensorflow as tf  # local import: the model itself does not need TF

    def copy_once(nbytes: int, fill: int) -> float:
        with tf.device(src_tf_device):
            x = tf.fill([nbytes], tf.constant(fill % 256, tf.uint8))
        start = time.perf_counter()
        with tf.device(dst_tf_device):
            y = tf.identity(x)
        # Eager ops return when done; the tiny slice forces a remote copy to complete.
        _ = y[:1].numpy()
        return time.perf_counter() - start

    samples = []
    for n in sizes:
        copy_once(int(n), 0)
        times = [copy_once(int(n), r + 1) for r in range(repeats)]
        samples.append((int(n), statistics.median(times)))
    return samples
