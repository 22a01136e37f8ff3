"""Parameter servers: w_global, the virtual workers' clocks, push and pull (Section 5).

`ParameterServers` holds one `tf.Variable` per versioned model variable, each on the
TensorFlow device of the parameter server the placement gives it (a logical CPU device of
this machine in local emulation; '/job:ps/task:i/device:CPU:0' on a cluster of
`tf.distribute.Server`s, where TensorFlow's gRPC runtime moves the tensors). The chief
process owns these variables and drives every virtual worker, as ClusterCoordinator does.

- `push(worker, wave, deltas)`: w_global += u~ (the aggregated update of one wave), then the
  worker's clock becomes wave + 1. Pushes are applied one at a time, in arrival order.
- `wait_for_wave(r)`: block until every worker pushed wave r (global clock > r), or until
  the run ends (`end_run`: no more minibatches will come, so nobody may wait any longer).
- `pull()`: the current w_global with the clock vector it reflects (how many waves of each
  worker are in it), read atomically with respect to pushes.

Clocks count waves within a run (`start_run` resets them); see docs/wsp.md for runs.
"""

from __future__ import annotations

import dataclasses
import threading
from typing import Sequence

import tensorflow as tf


@dataclasses.dataclass(frozen=True)
class Push:
    """One push as it was applied (for tests and the timeline)."""

    worker: int
    wave: int
    clocks_after: tuple[int, ...]
    final: bool = False   # the unfinished wave pushed when the run ended


class ParameterServers:
    """w_global on the parameter servers' devices and the WSP clocks of `num_workers`."""

    def __init__(self, initial: Sequence, devices: Sequence[str], num_workers: int,
                 names: Sequence[str] | None = None):
        if len(initial) != len(devices):
            raise ValueError(f"One device per variable is needed. Received: {len(initial)} "
                             f"variables, {len(devices)} devices.")
        if isinstance(num_workers, bool) or not isinstance(num_workers, int) or num_workers < 1:
            raise ValueError(f"num_workers must be an int >= 1. Received: "
                             f"num_workers={num_workers!r}.")
        names = list(names) if names is not None else [f"w{i}" for i in range(len(initial))]
        self.devices = tuple(devices)
        self.variables = []
        with tf.init_scope():
            for value, device, name in zip(initial, devices, names):
                with tf.device(device):
                    self.variables.append(tf.Variable(tf.identity(value), trainable=False,
                                                      name="ps/" + name.replace(":", "_")))
        self.num_workers = num_workers
        self._cond = threading.Condition()
        self._pushed = [0] * num_workers
        self._released = False
        self.pushes: list[Push] = []
        self.push_count = 0
        self.pull_count = 0
        self.bytes_pushed = 0
        # Largest spread of the clocks after a push during a run: at most D + 1 (a VW that
        # pushed wave c and waits for wave c - D is one ahead of the paper's clock).
        self.max_clock_distance = 0
        self.run_max_clock_distance = 0  # the same, in the current run
        self._add = tf.function(self._add_impl, reduce_retracing=True)

    # --- clocks -------------------------------------------------------------------------
    @property
    def clocks(self) -> tuple[int, ...]:
        """Local clock of every worker: waves pushed in this run."""
        with self._cond:
            return tuple(self._pushed)

    @property
    def global_clock(self) -> int:
        return min(self.clocks)

    @property
    def clock_distance(self) -> int:
        c = self.clocks
        return max(c) - min(c)

    # --- runs ---------------------------------------------------------------------------
    def start_run(self, values: Sequence | None = None) -> None:
        """A new run: clocks restart at 0; w_global := values when given."""
        with self._cond:
            if values is not None:
                for v, x in zip(self.variables, values):
                    v.assign(x)
            self._pushed = [0] * self.num_workers
            self._released = False
            self.run_max_clock_distance = 0

    def end_run(self) -> None:
        """No more minibatches in this run: release every waiting worker."""
        with self._cond:
            self._released = True
            self._cond.notify_all()

    # --- push and pull ------------------------------------------------------------------
    def _add_impl(self, deltas):
        for v, d in zip(self.variables, deltas):
            with tf.device(v.device):
                v.assign_add(d)

    def push(self, worker: int, wave: int, deltas: Sequence, final: bool = False) -> None:
        """w_global += deltas (the aggregated update of `worker`'s wave `wave`; `final`: the
        unfinished wave at the end of a run, not counted in the clock distance)."""
        with self._cond:
            if wave != self._pushed[worker]:
                raise RuntimeError(f"Worker {worker} pushed wave {wave} but its clock is "
                                   f"{self._pushed[worker]}: pushes must come in wave order.")
            self._add(list(deltas))
            self._pushed[worker] = wave + 1
            self.pushes.append(Push(worker, wave, tuple(self._pushed), final))
            if not final:
                spread = max(self._pushed) - min(self._pushed)
                self.max_clock_distance = max(self.max_clock_distance, spread)
                self.run_max_clock_distance = max(self.run_max_clock_distance, spread)
            self.push_count += 1
            self.bytes_pushed += sum(int(d.shape.num_elements()) * d.dtype.size for d in deltas)
            self._cond.notify_all()

    def wait_for_wave(self, wave: int) -> bool:
        """Block until every worker pushed `wave`; False if the run ended first."""
        with self._cond:
            while min(self._pushed) <= wave and not self._released:
                self._cond.wait()
            return min(self._pushed) > wave

    def pull(self) -> tuple[list, tuple[int, ...]]:
        """(w_global as tensors on the servers' devices, clocks it reflects)."""
        with self._cond:
            values = []
            for v in self.variables:
                with tf.device(v.device):
                    values.append(tf.identity(v))  # copy-on-write snapshot
            self.pull_count += 1
            return values, tuple(self._pushed)
