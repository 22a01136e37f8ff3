"""One virtual worker's side of WSP with its push and pull at times someone else gives.

`TimedWaveSync` is the `WaveSync` (the same wave accounting, Difference, rebase and
records) with `after_apply` cut where time passes in the cluster model:

* `commit(q)`: u_q is on every stage. If q ends wave c, the wave's aggregated update is
  taken now (w_local right after q minus w_local at the wave's start), to land later;
* `land(c)`: that update reaches the parameter servers (the VW's clock becomes c + 1);
* `read(c)`: the pull after wave c is granted: w_global as `ParameterServers.pull_wave`
  gives it (None if the global wave it needs is not complete: the run ended first);
* `take(c, pulled)`: the pulled weights replace w_local as of q, later local updates kept.

Fresh pulls (WaveSync's `fresh_pulls`) are not made: the cluster model has none, so a VW
pulls only after a wave c >= D, as in Section 5.
"""

from __future__ import annotations

from hetpipe_tf.core import wsp
from hetpipe_tf.ps.server import Difference
from hetpipe_tf.ps.wave_sync import WaveSync


class TimedWaveSync(WaveSync):
    """WaveSync driven by a virtual clock (module docstring); arguments as WaveSync's."""

    def __init__(self, *args, **kwargs):
        kwargs["fresh_pulls"] = False
        super().__init__(*args, **kwargs)
        self._pending: dict[int, Difference] = {}   # wave -> its update, not landed yet
        self._ended_by: dict[int, int] = {}         # wave -> the update q that ended it

    def after_apply(self, q: int) -> None:
        raise RuntimeError("TimedWaveSync is driven by commit/land/read/take; this is a "
                           "bug, please report it.")

    def commit(self, q: int) -> int | None:
        """u_q is applied on every stage; the wave it ends (its update taken), or None."""
        self._since_push += 1
        k = wsp.wave_completed_by(q - self._run_start + 1, self.n_m)
        if k is None:
            self.note(q)
            return None
        c = self._run_first_wave + k
        self._q = q
        state = self._state()
        self._q = None
        self._pending[c] = Difference(tuple(state), tuple(self._base), self._devices)
        self._ended_by[c] = q
        self._base = state
        self._since_push = 0
        self._waves_pushed = c + 1
        self._vector = tuple(c + 1 if w == self.worker else n
                             for w, n in enumerate(self._vector))
        return c

    def pulls_after(self, c: int) -> bool:
        """Whether a pull follows the push of wave c (c >= D)."""
        return wsp.wave_pulled_after_push(c, self.clock_distance) is not None

    def pending(self) -> list[int]:
        """Waves whose update was taken but has not landed."""
        return sorted(self._pending)

    def land(self, c: int) -> bool:
        """Wave c's update reaches the servers; False if there is none (not committed)."""
        diff = self._pending.pop(c, None)
        if diff is None:
            return False
        self.servers.push(self.worker, c, diff)
        return True

    def read(self, c: int):
        """The pulled (values, clocks) after wave c, or None if the global wave it needs is
        not complete at the servers (no pull then)."""
        r = wsp.wave_pulled_after_push(c, self.clock_distance)
        if r is None or wsp.global_clock(self.servers.clocks, self.servers.retired) <= r:
            return None
        return self.servers.pull_wave(self.worker, r)

    def take(self, c: int, pulled) -> None:
        """The pull after wave c arrived: w_local as of the update that ended it := pulled
        (None: no pull); then the version of that update + N_m is recorded."""
        q = self._ended_by.pop(c)
        if pulled is not None:
            self._q = q
            self._take(pulled)
            self._q = None
        self.note(q)

    def note(self, q: int) -> None:
        """Record the clocks of the version of q + N_m (WaveSync.after_apply's record)."""
        self.record[q + self.n_m] = self._vector
        while len(self.record) > self.history:
            del self.record[next(iter(self.record))]
