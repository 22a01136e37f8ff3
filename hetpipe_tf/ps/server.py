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
  worker are in it), read atomically with respect to pushes; `pull_if_newer(worker, held)`
  the same, but only when another worker pushed a wave that `held` lacks (never waits).

`retire(worker)` (a VW lost under `on_fault="continue"`): the worker pushes nothing more
(a push of it that arrives later is dropped) and the global clock becomes the minimum over
the others (`wsp.global_clock`), so nobody waits for it. With `settle_pushes` (set when a
job may go on without a worker) a push copies its deltas to the servers' devices and waits
until they arrived BEFORE taking the servers' lock: a push from a dead or frozen worker
then hangs in its own copy, not holding every other worker's push and pull (TensorFlow
runs remote ops asynchronously: an `assign_add` of deltas still on their way would hang
under the lock, and every read of the variables after it).

Clocks continue across runs: `start_run` lifts every clock to the largest
(`wsp.clocks_at_run_start`), it never resets them; see docs/wsp.md for runs.
"""

from __future__ import annotations

import dataclasses
import threading
from typing import Sequence

import tensorflow as tf

from hetpipe_tf._args import check_int
from hetpipe_tf.core import wsp
from hetpipe_tf.pipeline import transport
from hetpipe_tf.pipeline.compiled import compiled_method
from hetpipe_tf.pipeline.window import DEFAULT_HISTORY, Window


def read_values(variables: Sequence[tf.Variable]) -> list:
    """Copy-on-write snapshots of `variables`, each read on its own device."""
    out = []
    for v in variables:
        with tf.device(v.device):
            out.append(tf.identity(v))
    return out


class VariableReader:
    """`read_values(variables)` in as few calls as their devices allow: one compiled call
    hosted on their task when they share a remote one, one compiled call in this process
    when all are here (local mode), else one eager read each (docs/cluster_jobs.md,
    "Speed of the wire")."""

    def __init__(self, variables: Sequence[tf.Variable]):
        self.variables = list(variables)
        self._read_all = compiled_method(self._read_impl)
        tasks = {transport.task_of(v.device) for v in self.variables}
        self._here = tasks == {None}
        self._device = (self.variables[0].device
                        if len(tasks) == 1 and None not in tasks else None)

    def _read_impl(self):
        return read_values(self.variables)

    def __call__(self) -> list:
        if self._here:
            return list(self._read_all())
        if self._device is None:
            return read_values(self.variables)
        with tf.device(self._device):
            return list(self._read_all())


class VariableCopy:
    """`dst[i] := src[i]` for two fixed lists of variables in one compiled call hosted by
    this process: each read runs on its source's task and each assignment on its
    destination's, so every value crosses the wire once (w_global to and from the model's
    variables at a run's start and end: one request per task, not one per variable)."""

    def __init__(self, src: Sequence[tf.Variable], dst: Sequence[tf.Variable]):
        if len(src) != len(dst):
            raise ValueError(f"One destination per source variable is needed. Received: "
                             f"{len(src)} sources, {len(dst)} destinations.")
        self.src, self.dst = list(src), list(dst)
        self._copy = compiled_method(self._copy_impl)

    def _copy_impl(self):
        for s, d in zip(self.src, self.dst):
            with tf.device(d.device):
                d.assign(tf.identity(s))

    def __call__(self) -> None:
        if self.src:
            self._copy()


def _spread(clocks: Sequence[int], retired: frozenset = frozenset()) -> int:
    live = [c for w, c in enumerate(clocks) if w not in retired]
    return max(live) - min(live)


@dataclasses.dataclass(frozen=True)
class Difference:
    """A wave's update given as `now - base` (w_local at the wave's end and start), each
    subtraction pinned to `devices[i]` (the VW's own device): `push` computes it inside
    its own compiled call instead of a call of its own (docs/cluster_jobs.md, "Speed of
    the wire")."""

    now: tuple
    base: tuple
    devices: tuple[str, ...]


def _arguments(deltas) -> tuple:
    """(tensors, base, devices): a compiled call's arguments for `deltas` (tensors or a
    `Difference`; flat, so that the call is keyed by shapes, `_deltas_ops` undoes it)."""
    if isinstance(deltas, Difference):
        return list(deltas.now), list(deltas.base), tuple(deltas.devices)
    return list(deltas), None, None


def _deltas_ops(tensors, base, devices) -> list:
    """The deltas as tensors of the caller's graph (`tensors - base`, each on its device,
    when `base` is given)."""
    if base is None:
        return list(tensors)
    out = []
    for a, b, device in zip(tensors, base, devices):
        with tf.device(device):
            out.append(a - b)
    return out


@dataclasses.dataclass(frozen=True)
class Push:
    """One push as it was applied (for tests and the timeline)."""

    worker: int
    wave: int
    clocks_after: tuple[int, ...]
    final: bool = False   # the unfinished wave pushed when the run ended
    retired: frozenset = frozenset()   # workers retired when it was applied


class ParameterServers:
    """w_global on the parameter servers' devices and the WSP clocks of `num_workers`."""

    def __init__(self, initial: Sequence, devices: Sequence[str], num_workers: int,
                 names: Sequence[str] | None = None, history: int = DEFAULT_HISTORY):
        if len(initial) != len(devices):
            raise ValueError(f"One device per variable is needed. Received: {len(initial)} "
                             f"variables, {len(devices)} devices.")
        check_int("num_workers", num_workers, minimum=1)
        names = list(names) if names is not None else [f"w{i}" for i in range(len(initial))]
        self.variables = []
        with tf.init_scope():
            for value, device, name in zip(initial, devices, names):
                with tf.device(device):
                    self.variables.append(tf.Variable(tf.identity(value), trainable=False,
                                                      name="ps/" + name.replace(":", "_")))
        self.num_workers = num_workers
        self._cond = threading.Condition()
        self._pushed = [0] * num_workers
        self._retired: set[int] = set()
        self.dropped_pushes = 0   # pushes of retired workers, not applied
        self.settle_pushes = False   # module docstring
        self._released = False
        self.pushes = Window(history)   # the last `history` pushes, indexed absolutely
        self._run_first_push = 0   # index in `pushes` of the current run's first push
        self.run_start_clocks: list[tuple[int, ...]] = []   # clocks at each run's start
        self.pull_count = 0
        # w_global as it stood when the global clock (min over workers) last advanced.
        self._at_global: tuple[list, tuple[int, ...]] | None = None
        self._add = compiled_method(self._add_impl, reduce_retracing=True)
        self._copy = compiled_method(self._copy_impl, reduce_retracing=True)
        self._assign_all = compiled_method(self._assign_impl, reduce_retracing=True)
        # Snapshots and pulls read every variable in one call where the devices allow.
        self._read = VariableReader(self.variables)

    # --- clocks -------------------------------------------------------------------------
    @property
    def clocks(self) -> tuple[int, ...]:
        """Local clock of every worker: waves pushed since training began (a run start
        lifts the clocks behind to the largest)."""
        with self._cond:
            return tuple(self._pushed)

    @property
    def retired(self) -> frozenset:
        """The workers retired (lost VWs): their clocks no longer count."""
        with self._cond:
            return frozenset(self._retired)

    def _global(self) -> int:
        return wsp.global_clock(self._pushed, self._retired)

    def retire(self, worker: int) -> None:
        """Go on without `worker` (module docstring); at least one worker must remain."""
        with self._cond:
            if not 0 <= worker < self.num_workers:
                raise ValueError(f"worker must be in 0..{self.num_workers - 1}. Received: "
                                 f"worker={worker!r}.")
            wsp.global_clock(self._pushed, self._retired | {worker})   # one must remain
            self._retired.add(worker)
            self._cond.notify_all()   # a wait for the lost worker's wave is over

    @property
    def max_clock_distance(self) -> int:
        """Largest spread of the clocks after a push in a run (final pushes excluded): at
        most D + 1 (a VW that pushed wave c and waits for wave c - D is one ahead of the
        paper's clock)."""
        return max((_spread(p.clocks_after, p.retired) for p in self.pushes if not p.final),
                   default=0)

    @property
    def run_max_clock_distance(self) -> int:
        """`max_clock_distance` within the current run."""
        return max((_spread(p.clocks_after, p.retired)
                    for p in self.pushes[self._run_first_push:] if not p.final), default=0)

    # --- runs ---------------------------------------------------------------------------
    def start_run(self, values: Sequence | VariableCopy | None = None) -> None:
        """A new run: w_global := values when given (tensors, or a `VariableCopy` into
        `variables`); clocks continue, every one lifted to the largest
        (`wsp.clocks_at_run_start`: the workers behind have nothing left to push, so the
        run-start w_global holds all their waves)."""
        with self._cond:
            if isinstance(values, VariableCopy):
                values()
            elif values is not None:   # one call, not one remote op per variable
                self._assign_all(list(values))
            self._pushed = list(wsp.clocks_at_run_start(self._pushed))
            self._at_global = None
            self.run_start_clocks.append(tuple(self._pushed))
            self._released = False
            self._run_first_push = len(self.pushes)

    def end_run(self) -> None:
        """No more minibatches in this run: release every waiting worker."""
        with self._cond:
            self._released = True
            self._cond.notify_all()

    # --- push and pull ------------------------------------------------------------------
    def _assign_impl(self, values):
        for v, x in zip(self.variables, values):
            with tf.device(v.device):
                v.assign(x)

    def _add_impl(self, tensors, base, devices):
        for v, d in zip(self.variables, _deltas_ops(tensors, base, devices)):
            with tf.device(v.device):
                v.assign_add(d)

    def _copy_impl(self, tensors, base, devices):
        out = []
        for v, d in zip(self.variables, _deltas_ops(tensors, base, devices)):
            with tf.device(v.device):
                out.append(tf.identity(d))
        with tf.device(self.variables[0].device), tf.control_dependencies(out):
            arrived = tf.identity(tf.constant(0))   # ready once every delta is there
        return out, arrived

    def push(self, worker: int, wave: int, deltas: Sequence | Difference,
             final: bool = False) -> None:
        """w_global += deltas (the aggregated update of `worker`'s wave `wave`, as tensors
        or a `Difference`, subtracted in the same compiled call as the add or, with
        `settle_pushes`, the copy; `final`: the unfinished wave at the end of a run, not
        counted in the clock distance). A retired worker's push is dropped."""
        args = _arguments(deltas)
        if self.settle_pushes:
            if worker in self._retired:
                return self._drop_push()
            # Outside the lock: a lost worker's deltas never arrive (module docstring).
            copied, arrived = self._copy(*args)
            args = (list(copied), None, None)
            arrived.numpy()
        with self._cond:
            if worker in self._retired:   # lost while its deltas were on their way
                return self._drop_push()
            if wave != self._pushed[worker]:
                raise RuntimeError(f"Worker {worker} pushed wave {wave} but its clock is "
                                   f"{self._pushed[worker]}: pushes must come in wave order.")
            before = self._global()
            self._add(*args)
            self._pushed[worker] = wave + 1
            if self._global() > before:   # copy-on-write: a copy only once written again
                self._at_global = (self._read(), tuple(self._pushed))
            self.pushes.append(Push(worker, wave, tuple(self._pushed), final,
                                    frozenset(self._retired)))
            self._cond.notify_all()

    def _drop_push(self) -> None:
        with self._cond:
            self.dropped_pushes += 1

    def wait_for_wave(self, wave: int) -> bool:
        """Block until every worker pushed `wave`; False if the run ended first."""
        with self._cond:
            while self._global() <= wave and not self._released:
                self._cond.wait()
            return self._global() > wave

    def pull(self) -> tuple[list, tuple[int, ...]]:
        """(w_global as tensors on the servers' devices, clocks it reflects)."""
        with self._cond:
            self.pull_count += 1
            return self._read(), tuple(self._pushed)

    def pull_into(self, copy: VariableCopy) -> tuple[int, ...]:
        """`pull()` straight into variables (`copy`: from `variables` to them), in one
        compiled call that moves each value once; returns the clocks it reflects."""
        with self._cond:
            self.pull_count += 1
            copy()
            return tuple(self._pushed)

    def pull_wave(self, worker: int, wave: int) -> tuple[list, tuple[int, ...]]:
        """The pull after waiting for `wave`: w_global as it stood when every worker had
        pushed `wave` (the global clock passed it) if that state already holds every wave
        `worker` pushed (its invariant: a pull loses no local update), else the live
        w_global. A faster worker's later waves are then never mixed in by timing: with
        D = 0 and N_m = 1 one stage per worker is exactly synchronous data parallelism."""
        with self._cond:
            self.pull_count += 1
            snap = self._at_global
            if (snap is not None and wsp.global_clock(snap[1], self._retired) > wave
                    and snap[1][worker] == self._pushed[worker]):
                return list(snap[0]), snap[1]
            return self._read(), tuple(self._pushed)

    def pull_if_newer(self, worker: int, held: Sequence[int]
                      ) -> tuple[list, tuple[int, ...]] | None:
        """`pull()` if another worker pushed a wave that weights including `held` lack
        (`wsp.fresh_pull_due`), else None; never waits for a wave. The check and the read
        are one atomic step, so the clocks returned are exactly those of the values."""
        with self._cond:
            if not wsp.fresh_pull_due(worker, held, self._pushed):
                return None
            self.pull_count += 1
            return self._read(), tuple(self._pushed)
