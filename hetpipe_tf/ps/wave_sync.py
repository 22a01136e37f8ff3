"""One virtual worker's side of Wave Synchronous Parallel (Section 5).

A virtual worker (VW) keeps w_local in variables of its own, on its stages' devices. Its
pipeline runtime calls `after_apply(q)` on the VW's updater thread each time u_q has been
added to w_local, before the version of minibatch q + N_m is taken:

- when q completes wave c (`wsp.wave_completed_by`), the VW pushes the wave's aggregated
  update u~ = w_local - (w_local when the wave started) to the parameter servers;
- then, if c >= D, it waits until every VW pushed wave c - D (`wsp.wave_pulled_after_push`)
  and pulls: w_local := w_global. Every update of this VW is in w_global at that moment (it
  just pushed, and the updater applies nothing while it waits), so nothing local is lost.

The updater, not a stage, waits: the stages keep computing the s_local minibatches of the
next wave that already started, as the paper allows. The version of q + N_m is taken after
the pull, so it reflects exactly the local updates 1..q and at least every VW's waves
0..c-D. `record[p]` holds the clock vector (waves of each VW in w_global) that minibatch
p's weights reflect; with the runtime's own record of local updates it pins the version
down exactly (tests rebuild every minibatch's weights from it).

Clocks, waves and records restart with each run (`start_run`); at the end of a run `flush`
pushes the updates of an unfinished wave so that w_global holds every update.
"""

from __future__ import annotations

import time
from typing import Sequence

import tensorflow as tf

from hetpipe_tf.core import wsp
from hetpipe_tf.ps.server import ParameterServers, read_values


class WaveSync:
    """Pushes and pulls of virtual worker `worker`.

    Args:
      worker: this VW's index among the parameter servers' workers.
      servers: the parameter servers.
      local: this VW's w_local variables, in the servers' variable order.
      n_m: minibatches per wave.
      clock_distance: D.
      fresh_pulls: at every wave end also take a newer w_global without waiting.
    """

    def __init__(self, worker: int, servers: ParameterServers, local: Sequence[tf.Variable],
                 n_m: int, clock_distance: int, fresh_pulls: bool = True):
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
        self.fresh_pulls = fresh_pulls  # TODO(issue 8, point 9a): not used yet
        self.record: dict[int, tuple[int, ...]] = {}
        self.wait_s = 0.0   # time spent waiting for other VWs' waves
        self._run_start = 1
        self._since_push = 0
        self._waves_pushed = 0
        self._vector = (0,) * servers.num_workers
        self._base: list = []
        self._delta = tf.function(self._delta_impl, reduce_retracing=True)
        self._assign = tf.function(self._assign_impl, reduce_retracing=True)

    # --- compiled helpers (each op on the variable's own device) -------------------------
    def _delta_impl(self, base):
        out = []
        for v, b in zip(self.local, base):
            with tf.device(v.device):
                out.append(v.read_value() - b)
        return out

    def _assign_impl(self, values):
        for v, x in zip(self.local, values):
            with tf.device(v.device):
                v.assign(x)

    # --- runs ---------------------------------------------------------------------------
    def start_run(self, first: int) -> None:
        """A run starts at this VW's minibatch `first`: w_local := w_global, clocks 0."""
        values, vector = self.servers.pull()
        self._assign(values)
        self._base = read_values(self.local)
        self._vector = vector
        self._run_start = first
        self._since_push = 0
        self._waves_pushed = 0
        for p in range(first, first + self.n_m):
            self.record[p] = vector

    def flush(self) -> None:
        """End of a run (this VW drained): push the updates of an unfinished wave."""
        if self._since_push:
            self._push(self._waves_pushed, final=True)

    # --- the hook of the pipeline runtime ------------------------------------------------
    def after_apply(self, q: int) -> None:
        self._since_push += 1
        c = wsp.wave_completed_by(q - self._run_start + 1, self.n_m)
        if c is not None:
            self._push(c)
            r = wsp.wave_pulled_after_push(c, self.clock_distance)
            if r is not None:
                self._pull(r)
        self.record[q + self.n_m] = self._vector

    def _push(self, wave: int, final: bool = False) -> None:
        self.servers.push(self.worker, wave, self._delta(self._base), final)
        self._base = read_values(self.local)
        self._since_push = 0
        self._waves_pushed = wave + 1

    def _pull(self, wave: int) -> None:
        t0 = time.perf_counter()
        self.servers.wait_for_wave(wave)
        self.wait_s += time.perf_counter() - t0
        values, vector = self.servers.pull()
        self._assign(values)
        self._base = read_values(self.local)
        self._vector = vector
