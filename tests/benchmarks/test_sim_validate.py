"""benchmarks.sim_validate's pure helper (the validation itself is a binary, not a test)."""

from hetpipe_tf.sim.result import SimEvent
from benchmarks.sim_validate import overlap_fraction
from hetpipe_tf.core.schedule import Task, TaskKind


def _ev(vw, stage, start, end):
    return SimEvent(vw, Task(stage, 1, TaskKind.FORWARD), start, end)


def test_overlap_fraction_hand_computed():
    # A busy [0, 2], B busy [1, 3]: each overlaps the other for 1 of its 2 busy seconds.
    assert overlap_fraction([_ev(0, 0, 0, 2), _ev(0, 1, 1, 3)]) == 0.5
    # Strictly alternating stages (one VW at N_m = 1) never overlap.
    assert overlap_fraction([_ev(0, 0, 0, 1), _ev(0, 1, 1, 2), _ev(0, 0, 2, 3)]) == 0.0
    # Two VWs, one stage each, always busy together; a device's own tasks are merged first.
    assert overlap_fraction([_ev(0, 0, 0, 1), _ev(0, 0, 1, 2), _ev(1, 0, 0, 2)]) == 1.0
    assert overlap_fraction([]) == 0.0
