"""One minibatch of a pipelined virtual worker while it is in flight: its data, what its
stages handed on (saved activations, gradients, non-trainable deltas) and, for a share of
a split batch (ps/split.py), the scale of its update (`scaled`)."""

from __future__ import annotations

import dataclasses
from typing import Any

import tensorflow as tf


@dataclasses.dataclass
class Minibatch:
    id: int
    inputs: list
    y: Any
    sample_weight: Any
    saved: dict = dataclasses.field(default_factory=dict)
    grads: dict = dataclasses.field(default_factory=dict)
    deltas: dict = dataclasses.field(default_factory=dict)
    extra_loss: Any = 0.0
    run: int = 0   # the runtime's run id when submitted; an abort drops older runs' work
    tied: dict = dataclasses.field(default_factory=dict)        # lent versions (tied.py)
    tied_grads: dict = dataclasses.field(default_factory=dict)  # borrowers' gradients
    # A share of a split batch (ps/split.py): its gradients and float deltas times n_k / N.
    loss_scale: float | None = None


def scaled(mb: Minibatch, j: int, device: str) -> tuple[list, list]:
    """Stage j's gradients and non-trainable deltas of `mb`, times its loss scale (a split
    batch's share n_k / N: the gradient is linear in the loss, so this is the gradient of
    the weighted loss; the metrics saw the unweighted one), on stage j's `device`."""
    grads, deltas = mb.grads.pop(j), mb.deltas.pop(j)
    s = mb.loss_scale
    if s is None:
        return grads, deltas
    with tf.device(device):   # unpinned, eager ops run on the caller's default device:
        return _times(grads, deltas, s)   # in a cluster job the chief (cluster_jobs.md)


def _times(grads: list, deltas: list, s: float) -> tuple[list, list]:
    """Every float gradient and delta times s (IndexedSlices: their values)."""
    def times(x):
        if x is None or not x.dtype.is_floating:
            return x
        if isinstance(x, tf.IndexedSlices):
            return tf.IndexedSlices(x.values * tf.cast(s, x.dtype), x.indices, x.dense_shape)
        return x * tf.cast(s, x.dtype)
    return [times(g) for g in grads], [times(d) for d in deltas]
