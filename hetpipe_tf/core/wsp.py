"""Pure clock rules of Wave Synchronous Parallel (paper Section 5), no timing.

Minibatches of a VW are numbered from 1, waves from 0 (wave w = minibatches
w*N_m+1 .. (w+1)*N_m, `core.schedule.wave_of`). The VW pushes the aggregated update of
wave c when it completes the wave's last minibatch; its local clock is then c+1.

Rule (Section 5): a VW with local clock c must use weights that include the updates of
waves 0..c-D-1 of every VW, and may start s_local = N_m-1 minibatches of the next wave
while it waits. Equivalently (the paper's s_global form): minibatch p needs every VW's
updates of minibatches 1..p-(s_global+1), s_global = (D+1)(s_local+1) + s_local - 1; as
updates arrive per wave, that is every wave up to the one holding minibatch
p-(s_global+1). Worked check (Figure 3, D=0, N_m=4): minibatches 5-7 need nothing, 8-11
need wave 0 (minibatches 1-4), 12 needs wave 1 (up to minibatch 8), as the text says.

Note: the paper also writes that the rule applies "for p > (D+1)(s_global+1) + s_local";
with D=0, N_m=4 that is p > 10, which contradicts its own example (minibatch 8 waits for
wave 0). We follow the clock rule and the example; `first_gated_minibatch` gives the
first p that needs a global wave: (D+1)*N_m + N_m (= 8 in the example).

The pull that satisfies wave r is issued after the VW pushed wave r+D (the end of clock
r+D), once every VW pushed wave r (`pull_after_wave`). In clock form: weights taken while
a VW's clock is k (k waves pushed) must include `waves_needed(k, D)` = k - D waves of every
VW (`bound_holds`).

Beyond the bound (issue 8, point 9): at every wave end a VW may also take whatever newer
w_global the servers hold, without waiting (`fresh_pull_due`); and clocks continue across
runs, a run start lifting every clock to the largest (`clocks_at_run_start`).

Going on without a lost VW (issue 16, `on_fault="continue"`): a retired VW pushes nothing
more, so the global clock is the minimum over the OTHER VWs' clocks (`global_clock`) and
nobody waits for the lost one.
"""

from __future__ import annotations

from typing import Sequence

from hetpipe_tf._args import check_int
from hetpipe_tf.core.schedule import wave_of


def _check(name: str, value: int, low: int) -> None:
    check_int(name, value, minimum=low)


def s_local(n_m: int) -> int:
    """Local staleness threshold N_m - 1 (Section 4)."""
    _check("n_m", n_m, 1)
    return n_m - 1


def s_global(n_m: int, clock_distance: int) -> int:
    """Global staleness bound (D+1)(s_local+1) + s_local - 1 (Section 5)."""
    _check("clock_distance", clock_distance, 0)
    sl = s_local(n_m)
    return (clock_distance + 1) * (sl + 1) + sl - 1


def required_global_wave(p: int, n_m: int, clock_distance: int) -> int | None:
    """The last wave (0-based) whose updates from EVERY VW minibatch p's weights must
    include, or None when p may start on local weights alone."""
    _check("p", p, 1)
    q = p - (s_global(n_m, clock_distance) + 1)
    return wave_of(q, n_m) if q >= 1 else None


def first_gated_minibatch(n_m: int, clock_distance: int) -> int:
    """The first minibatch that needs a global wave: (D+1)*N_m + N_m."""
    return s_global(n_m, clock_distance) + 2


def pull_after_wave(required_wave: int, clock_distance: int) -> int:
    """The wave after whose push the VW pulls the weights including `required_wave`."""
    return required_wave + clock_distance


def wave_completed_by(i: int, n_m: int) -> int | None:
    """The wave that the i-th minibatch of a run (1-based) completes, or None when it is
    not the last minibatch of its wave."""
    _check("i", i, 1)
    _check("n_m", n_m, 1)
    return (i - 1) // n_m if i % n_m == 0 else None


def wave_pulled_after_push(pushed_wave: int, clock_distance: int) -> int | None:
    """After pushing wave c, the VW pulls weights that include every VW's wave c - D (the
    inverse of `pull_after_wave`), or None while c < D (nothing needs a global wave yet).
    The version of the minibatch after the wave's last plus N_m needs exactly that wave:
    required_global_wave((c+1)N_m + N_m) = c - D."""
    _check("pushed_wave", pushed_wave, 0)
    _check("clock_distance", clock_distance, 0)
    r = pushed_wave - clock_distance
    return r if r >= 0 else None


def waves_needed(clock: int, clock_distance: int) -> int:
    """How many waves of EVERY VW (waves 0..k-D-1) the weights a VW uses at local clock
    k (= waves it pushed) must include: max(0, k - D). After pushing wave c the clock is
    c + 1, so this is the wave `wave_pulled_after_push(c, D)` plus one."""
    _check("clock", clock, 0)
    _check("clock_distance", clock_distance, 0)
    return max(0, clock - clock_distance)


def bound_holds(held: Sequence[int], clock: int, clock_distance: int) -> bool:
    """Whether weights that include `held[w]` waves of each VW w satisfy WSP's bound for a
    VW at local clock `clock` (Section 5)."""
    return min(held) >= waves_needed(clock, clock_distance)


def fresh_pull_due(worker: int, held: Sequence[int], on_servers: Sequence[int]) -> bool:
    """Whether w_global on the servers (`on_servers[w]` waves of each VW w) holds a wave of
    ANOTHER VW that weights including `held` lack, so a pull at a wave end adds something.
    This VW's own waves never make a pull due: its w_local already has all its updates."""
    if len(held) != len(on_servers) or not 0 <= worker < len(held):
        raise ValueError(f"held and on_servers need one clock per VW and worker must index "
                         f"them. Received: worker={worker}, held={tuple(held)}, "
                         f"on_servers={tuple(on_servers)}.")
    return any(s > h for w, (h, s) in enumerate(zip(held, on_servers)) if w != worker)


def clocks_at_run_start(clocks: Sequence[int]) -> tuple[int, ...]:
    """The clocks a new run starts from: every VW at the largest clock of the previous run.

    A run ends with every VW drained and its unfinished wave pushed (a partial final wave
    counts as one wave, so its clock advances by one); w_global then holds every update
    of every VW. The VWs behind the largest clock have no more updates to push: their
    missing waves are empty, so every VW's clock may stand at the largest and the run-start
    weights meet the bound for all of them (`bound_holds(clocks, max, D)` for any D). Not
    lifting them would leave a fast VW up to D + 2 waves ahead at the next run's start,
    using weights that lack waves the slow VW has yet to compute.
    """
    top = max(clocks)
    return (top,) * len(clocks)


def global_clock(clocks: Sequence[int], retired: Sequence[int] = ()) -> int:
    """The global clock: the fewest waves any VW still training pushed (the minimum over
    the clocks of the VWs not `retired`; a retired VW was lost and will push no more, so
    waiting for it would wait forever). Every VW's waves below it are in w_global."""
    gone = set(retired)
    if any(not 0 <= w < len(clocks) for w in gone):
        raise ValueError(f"retired must index the clocks. Received: clocks={tuple(clocks)}, "
                         f"retired={sorted(gone)}.")
    live = [c for w, c in enumerate(clocks) if w not in gone]
    if not live:
        raise ValueError(f"At least one VW must still train. Received: clocks={tuple(clocks)}, "
                         f"retired={sorted(gone)}; a job without a VW has no clock.")
    return min(live)
