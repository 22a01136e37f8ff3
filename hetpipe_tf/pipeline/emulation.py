"""EMULATION of a slower device (a speed factor f < 1 in the cluster description): after a
piece of work that started at `t0`, sleep (1/f - 1) times its measured time, so it took 1/f
as long. Stages emulate their tasks and `StageWeights` their updates with it, so the
planner's and the simulator's costs (/ f) hold under emulation. Emulation only: no real
work is done while sleeping, and every caller labels and totals the time slept.
"""

from __future__ import annotations

import time


def emulate_slowdown(t0: float, factor: float) -> float:
    """Sleep for a device of speed `factor` after work started at perf_counter `t0`; the
    seconds slept (0 when factor >= 1)."""
    if factor >= 1.0:
        return 0.0
    extra = (time.perf_counter() - t0) * (1.0 / factor - 1.0)
    time.sleep(extra)  # EMULATION of a slower device, not real work
    return extra
