"""w_local and its versions (paper Section 4, "Considering Staleness").

w_local is the model's real variables. A `Version` is a snapshot of them as tensors, one
list per stage, read on that stage's device: TensorFlow's copy-on-write keeps a snapshot's
buffers intact when the variables are later updated, so a version costs a copy only of what
changes while it is alive (and a transfer when a variable sits on another device).

`WeightVersions` keeps the version of every minibatch in flight and the record of which
update ids each minibatch's weights reflected. When minibatch q completes, `apply` adds u_q
to w_local (the model's optimizer applies q's gradients once, so its counters advance once
per minibatch, plus the BatchNorm-style deltas) and snapshots the version for q + N_m.
"""

from __future__ import annotations

import dataclasses
import threading
from typing import Callable, Sequence

import tensorflow as tf

from hetpipe_tf import _keras_shim as keras_shim


@dataclasses.dataclass(frozen=True)
class Version:
    """Weights reflecting exactly local updates 1..last_update (per-stage tensor lists)."""

    last_update: int
    trainable: tuple[tuple, ...]     # per stage
    non_trainable: tuple[tuple, ...]  # per stage (versioned float state)

    @property
    def updates(self) -> tuple[int, ...]:
        return tuple(range(1, self.last_update + 1))


class WeightVersions:
    """w_local and its versions.

    Args:
      stages: the virtual worker's stages (their devices; their model variables by default).
      optimizer: applies each minibatch's gradients to w_local.
      n_m: minibatches in flight.
      local: per stage, (trainable, versioned non-trainable) variables that ARE w_local;
        default: the model's own variables (one virtual worker). Several virtual workers
        each pass their own copies (hetpipe_tf.ps.coordinator).
      after_apply: called as after_apply(q) once u_q is in w_local and before the version
        of q + N_m is taken: WSP pushes a finished wave and pulls global weights there.
      counter: an int variable incremented once per update applied, in the same step (the
        model optimizer's iterations when VWs apply with optimizers of their own).
      history: how many minibatches `record` keeps.
    """

    def __init__(self, stages: Sequence, optimizer, n_m: int,
                 local: Sequence[tuple[Sequence, Sequence]] | None = None,
                 after_apply: Callable[[int], None] | None = None, counter=None,
                 history: int = 10_000):
        self._stages = list(stages)
        self._optimizer = optimizer
        self._n_m = n_m
        if local is None:
            local = [(s.trainable, s.versioned_nt) for s in self._stages]
        self.local = [(list(t), list(n)) for t, n in local]
        self._tvars = [v for t, _ in self.local for v in t]
        self._ntvars = [v for _, n in self.local for v in n]
        self._after_apply = after_apply
        self._versions: dict[int, Version] = {}
        self._lock = threading.Lock()
        self.applied = 0            # id of the last update applied to w_local
        self.record: dict[int, int] = {}  # minibatch id -> last update id its version had
        self._history = history
        self._counter = counter
        self._apply_fn = tf.function(self._apply_impl, reduce_retracing=True)

    def snapshot(self) -> Version:
        tr, nt = [], []
        for s, (tvars, ntvars) in zip(self._stages, self.local):
            with tf.device(s.device):
                tr.append(tuple(tf.identity(keras_shim.variable_handle(v)) for v in tvars))
                nt.append(tuple(tf.identity(keras_shim.variable_handle(v)) for v in ntvars))
        return Version(self.applied, tuple(tr), tuple(nt))

    def start_run(self, first: int) -> None:
        """A run starts at minibatch `first`: minibatches first..first+N_m-1 use w_local now."""
        base = self.snapshot()
        with self._lock:
            self._versions = {p: base for p in range(first, first + self._n_m)}

    def take(self, p: int) -> Version:
        """The version minibatch p uses (recorded); stays alive until `release(p)`."""
        with self._lock:
            version = self._versions.pop(p)
            self.record[p] = version.last_update
            while len(self.record) > self._history:
                del self.record[next(iter(self.record))]
        return version

    def forget(self, p: int) -> None:
        """Minibatch p was dropped (abort): no version or record of it remains."""
        with self._lock:
            self._versions.pop(p, None)
            self.record.pop(p, None)

    def _apply_impl(self, grads, deltas):
        pairs = [(g, v) for g, v in zip(grads, self._tvars) if g is not None]
        if pairs:
            self._optimizer.apply_gradients(pairs)
        for v, d in zip(self._ntvars, deltas):
            keras_shim.variable_handle(v).assign_add(d)
        if self._counter is not None:
            keras_shim.variable_handle(self._counter).assign_add(1)

    def apply(self, q: int, grads_by_stage: Sequence[Sequence], deltas_by_stage: Sequence[Sequence]):
        """w_local += u_q, then snapshot the version of minibatch q + N_m."""
        if q != self.applied + 1:
            raise RuntimeError(f"Updates must be applied in order: got {q} after {self.applied}.")
        grads = [g for gs in grads_by_stage for g in gs]
        deltas = [d for ds in deltas_by_stage for d in ds]
        self._apply_fn(grads, deltas)
        self.applied = q
        if self._after_apply is not None:
            self._after_apply(q)
        version = self.snapshot()
        with self._lock:
            self._versions[q + self._n_m] = version
