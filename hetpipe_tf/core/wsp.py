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
r+D), once every VW pushed wave r (`pull_after_wave`).
"""

from __future__ import annotations

from hetpipe_tf.core.schedule import wave_of


def _check(name: str, value: int, low: int) -> None:
    if isinstance(value, bool) or not isinstance(value, int) or value < low:
        raise ValueError(f"{name} must be an int >= {low}. Received: {name}={value!r}.")


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
