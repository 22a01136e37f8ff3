"""One VW's Section 4 pipeline under WSP gates: the glue between the engine and the rules.

The pipeline is `hetpipe_tf.core.schedule.simulate` itself (with each stage's update where
the runtime runs it: its `update_time`); WSP enters
through its `arrival` argument (the gate of minibatch p: when the pull bringing the global wave it
needs completed, `core/wsp.py`). Nothing here decides an order of tasks.

Finality (what lets the engine simulate a VW before all its gates are known): gates never
decrease with p (a later wave's pull completes no earlier), so minibatches complete in
order, and minibatch q + N_m enters stage 0 only after q completed, i.e. after every task
of 1..q; so the events of minibatches 1..q do not depend on the minibatches after
q + N_m - 1. A run of the first m minibatches therefore has final events for minibatches
1..m - N_m + 1 (all of them when m is the whole run), and wave c's pushes are final once
(c + 2) N_m - 1 <= m. tests/sim/test_pipelines.py checks this on `simulate` itself.
"""

from __future__ import annotations

from typing import Mapping, Sequence

from hetpipe_tf.core import schedule, wsp
from hetpipe_tf.sim.model import SimConfig, VirtualWorker
from hetpipe_tf.core.schedule import Event, TaskKind


def pull_waves(cfg: SimConfig) -> list[int | None]:
    """Per minibatch p (index p-1): the wave after whose push the pull gating p is issued,
    or None when p runs on local weights alone."""
    out = []
    for p in range(1, cfg.num_minibatches + 1):
        r = wsp.required_global_wave(p, cfg.n_m, cfg.clock_distance)
        out.append(None if r is None else wsp.pull_after_wave(r, cfg.clock_distance))
    return out


def gates(pull_done: Mapping[int, float], cfg: SimConfig) -> list[float]:
    """arrival[p-1] for one VW: completion of the pull bringing p's required wave
    (infinite while that pull has not been issued)."""
    return [0.0 if w is None else pull_done.get(w, float("inf")) for w in pull_waves(cfg)]


def final_waves(m: int, cfg: SimConfig) -> int:
    """How many leading waves have final events in a run of the first m minibatches."""
    if m >= cfg.num_minibatches:
        return cfg.num_waves
    return max(0, (m + 1) // cfg.n_m - 1)


def wave_ends(events: Sequence[Event], k: int, n_m: int, waves: range) -> list[list[float]]:
    """t[i][j]: when stage j finished its last task of wave waves[i]'s last minibatch.

    Its update (an APPLY event) does not count: a push is issued at the end of the stage's
    backward, as before updates were simulated (the runtime's updater pushes once every
    stage applied the minibatch, a little later). With one VW, which the runtime never
    gates, a push after the updates would gate stage 0 on the other stages' updates."""
    last = {}
    for e in events:
        if e.task.kind in (TaskKind.BACKWARD, TaskKind.FORWARD_BACKWARD):
            last[(e.task.stage, e.task.minibatch)] = e.end
    return [[last[(j, (c + 1) * n_m)] for j in range(k)] for c in waves]


class PipelineCache:
    """`schedule.simulate` of a VW for given gates, memoised: VWs with equal stage times
    and equal gates (every VW before its first pull; in the fixed point, every VW whose
    gates did not change) share one run. Partial runs keep only their wave ends, so their
    events die young (the cyclic GC then has less to walk)."""

    def __init__(self, cfg: SimConfig) -> None:
        self._cfg = cfg
        self._runs: dict[tuple, list[Event]] = {}
        self._ends: dict[tuple, list[list[float]]] = {}

    @staticmethod
    def _key(vw: VirtualWorker, arrival: Sequence[float]) -> tuple:
        return (tuple(vw.forward_times), tuple(vw.backward_times), tuple(vw.update_times),
                tuple(arrival))

    def _simulate(self, vw: VirtualWorker, arrival: Sequence[float]) -> list[Event]:
        return schedule.simulate(vw.num_stages, self._cfg.n_m, len(arrival),
                                 vw.forward_times, vw.backward_times, arrival=arrival,
                                 update_time=vw.update_times)

    def run(self, vw: VirtualWorker, arrival: Sequence[float]) -> list[Event]:
        """Events of every minibatch (the caller must not mutate them)."""
        key = self._key(vw, arrival)
        if key not in self._runs:
            self._runs[key] = self._simulate(vw, arrival)
        return self._runs[key]

    def final_wave_ends(self, vw: VirtualWorker, arrival: Sequence[float]) -> list[list[float]]:
        """`wave_ends` of the waves final in a run of the first len(arrival) minibatches."""
        key = self._key(vw, arrival)
        if key not in self._ends:
            events = (self.run(vw, arrival) if len(arrival) == self._cfg.num_minibatches
                      else self._simulate(vw, arrival))
            waves = range(final_waves(len(arrival), self._cfg))
            self._ends[key] = wave_ends(events, vw.num_stages, self._cfg.n_m, waves)
        return self._ends[key]
