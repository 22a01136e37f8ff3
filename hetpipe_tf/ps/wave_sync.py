"""One virtual worker's side of Wave Synchronous Parallel (Section 5).

A virtual worker (VW) keeps w_local in variables of its own, on its stages' devices. Its
pipeline runtime calls `after_apply(q)` on the VW's updater thread each time u_q has been
added to w_local, before the version of minibatch q + N_m is taken:

- when q completes wave c (`wsp.wave_completed_by`), the VW pushes the wave's aggregated
  update u~ = w_local - (w_local when the wave started) to the parameter servers;
- then, if c >= D, it waits until every VW pushed wave c - D (`wsp.wave_pulled_after_push`)
  and pulls: w_local := w_global;
- otherwise, with `fresh_pulls` (the default), it pulls without waiting if the servers
  hold a wave of another VW that w_local lacks (`ParameterServers.pull_if_newer`).

A pull replaces w_local by w_global, which is right only because every update of this VW
is in w_global at that moment: pulls happen only right after this VW's push, and the
updater applies nothing while it pulls. The updater, not a stage, waits: the stages keep
computing the s_local minibatches of the next wave that already started, as the paper
allows. The version of q + N_m is taken after the pull, so it reflects exactly the local
updates 1..q and at least every VW's waves 0..c-D. `record[p]` holds the clock vector
(waves of each VW that minibatch p's weights include; for this VW, the waves it had pushed
when the version was taken, its later updates being in the runtime's record); with the
runtime's record of local updates it pins the version down exactly (tests rebuild every
minibatch's weights from it).

Clocks continue across runs: a run starts from the servers' clocks (every VW lifted to the
largest, `wsp.clocks_at_run_start`) and its waves are numbered from there; at the end of a
run `flush` pushes the updates of an unfinished wave (a short wave, counted as one).
"""

from __future__ import annotations

import time
from typing import Sequence

import tensorflow as tf

from hetpipe_tf.core import wsp
from hetpipe_tf.pipeline.compiled import compiled_method
from hetpipe_tf.pipeline.window import DEFAULT_HISTORY
from hetpipe_tf.ps.server import Difference, ParameterServers, VariableReader


class WaveSync:
    """Pushes and pulls of virtual worker `worker`.

    Args:
      worker: this VW's index among the parameter servers' workers.
      servers: the parameter servers.
      local: this VW's w_local variables, in the servers' variable order.
      n_m: minibatches per wave.
      clock_distance: D.
      fresh_pulls: at every wave end also take a newer w_global without waiting.
      weights: the VW's `pipeline.weights.WeightVersions` when its stages apply their own
        updates (then a wave's state is read from the version snapshots and a pull rebases
        them); None: w_local is read and assigned directly (nothing else applies meanwhile).
    """

    def __init__(self, worker: int, servers: ParameterServers, local: Sequence[tf.Variable],
                 n_m: int, clock_distance: int, fresh_pulls: bool = True,
                 history: int = DEFAULT_HISTORY, weights=None):
        if len(local) != len(servers.variables):
            raise ValueError(f"w_local needs one variable per parameter-server variable. "
                             f"Received: {len(local)} local, {len(servers.variables)} on the "
                             "servers.")
        wsp.s_global(n_m, clock_distance)  # validates both
        self.worker = worker
        self.servers = servers
        self.local = list(local)
        self.n_m = n_m
        self.clock_distance = clock_distance
        self._weights = weights
        if not isinstance(fresh_pulls, bool):
            raise ValueError(f"fresh_pulls must be a bool. Received: fresh_pulls="
                             f"{fresh_pulls!r}; pass True or False.")
        self.fresh_pulls = fresh_pulls
        self.record: dict[int, tuple[int, ...]] = {}   # the last `history` minibatches
        self.history = history
        self.wait_s = 0.0   # time spent waiting for other VWs' waves
        self.fresh_pull_count = 0   # pulls at a wave end with c < D (nothing to wait for)
        self._run_start = 1
        self._run_first_wave = 0
        self._since_push = 0
        self._waves_pushed = 0
        self._vector = (0,) * servers.num_workers
        self._base: list = []
        self._q: int | None = None   # the update that ended the wave being synced
        self._assign = compiled_method(self._assign_impl, reduce_retracing=True)
        self._devices = tuple(v.device for v in self.local)   # where a push subtracts
        # w_local read at run boundaries in one call where its devices allow.
        self._read_local = VariableReader(self.local)

    # --- compiled helpers (each op on the variable's own device) -------------------------
    def _assign_impl(self, values):
        for v, x in zip(self.local, values):
            with tf.device(v.device):
                v.assign(x)

    @property
    def clock(self) -> int:
        """This VW's local clock: the waves it pushed since training began (counting the
        waves it was lifted over at run starts)."""
        return self._waves_pushed

    # --- runs ---------------------------------------------------------------------------
    def start_run(self, first: int) -> None:
        """A run starts at this VW's minibatch `first` (after `ParameterServers.start_run`):
        w_local := w_global; waves are numbered on from the servers' clock of this VW."""
        values, vector = self.servers.pull()
        self._assign(values)
        self._base = self._read_local()
        self._vector = vector
        self._run_start = first
        self._since_push = 0
        self._waves_pushed = self._run_first_wave = vector[self.worker]
        for p in range(first, first + self.n_m):
            self.record[p] = vector

    def flush(self) -> None:
        """End of a run (this VW drained): push the updates of an unfinished wave."""
        if self._since_push:
            self._push(self._waves_pushed, final=True)

    # --- the hook of the pipeline runtime ------------------------------------------------
    def after_apply(self, q: int) -> None:
        self._since_push += 1
        k = wsp.wave_completed_by(q - self._run_start + 1, self.n_m)
        if k is not None:
            self._q = q
            c = self._run_first_wave + k
            self._push(c)
            r = wsp.wave_pulled_after_push(c, self.clock_distance)
            if r is not None:
                self._pull(r)
            elif self.fresh_pulls:
                self._fresh_pull()
            self._q = None
        self.record[q + self.n_m] = self._vector
        while len(self.record) > self.history:
            del self.record[next(iter(self.record))]

    def _state(self) -> list:
        """w_local right after the update that ended the wave (stages may already have
        applied later ones), or now at a run's end."""
        if self._weights is None or self._q is None:
            return self._read_local()
        after = self._weights.state_after(self._q)
        return [after[id(v)] for v in self.local]

    def _push(self, wave: int, final: bool = False) -> None:
        state = self._state()
        # The delta is subtracted inside the push's call (one call, not two).
        self.servers.push(self.worker, wave,
                          Difference(tuple(state), tuple(self._base), self._devices), final)
        self._base = state
        self._since_push = 0
        self._waves_pushed = wave + 1
        # w_local holds every update of this VW: all of its pushed waves.
        self._vector = tuple(wave + 1 if w == self.worker else n
                             for w, n in enumerate(self._vector))

    def _pull(self, wave: int) -> None:
        t0 = time.perf_counter()
        self.servers.wait_for_wave(wave)
        self.wait_s += time.perf_counter() - t0
        self._take(self.servers.pull_wave(self.worker, wave))

    def _fresh_pull(self) -> None:
        pulled = self.servers.pull_if_newer(self.worker, self._vector)
        if pulled is not None:
            self.fresh_pull_count += 1
            self._take(pulled)

    def _take(self, pulled: tuple[list, tuple[int, ...]]) -> None:
        values, vector = pulled
        if self._weights is None or self._q is None:
            self._assign(values)
            self._base = self._read_local()
        else:   # keep the local updates after the wave that stages already applied
            self._weights.rebase(self._q, {id(v): x for v, x in zip(self.local, values)})
            after = self._weights.state_after(self._q)
            self._base = [after[id(v)] for v in self.local]
        self._vector = vector
