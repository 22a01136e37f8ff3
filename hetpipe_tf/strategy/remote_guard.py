"""One virtual worker on remote tasks: a lost task ends its calls within the bound.

Several virtual workers (VWs) run under the `Coordinator`, whose calls a `FaultGuard`
(hetpipe_tf/ps/faults.py) takes. One VW has no coordinator: the strategy drives its
`PipelineRuntime` directly, so a stage stuck in a remote op of a frozen worker (TensorFlow
has no deadline on eager remote ops) held `fit` forever, and a dead worker surfaced as the
stage's `UnavailableError`, naming nothing. `GuardedPipelineRuntime` is that runtime with
its calls (submit, wait_for_room, drain, abort, close) run by the guard, as the
coordinator's are: within `fault_timeout_s` of a worker dying or freezing, the call raises
the named `TaskLostError` (task, address, stages, VW), which `error` then reports, so the
model's guarded `fit` raises it. An abort or close after a lost task does not wait for
remote work: the run is left without `on_run_end` (which reads the optimizer state on
the stages' devices) and threads stuck in remote ops stay behind as daemons.

`guard_for(faults, plans, cluster)` is the guard of a one-VW job whose stages are on
remote tasks with known addresses, else None. The in-graph runtime runs its stage inside
Keras' train function on the caller's thread, which no guard can unblock: a one-VW job on
remote tasks runs on this threaded runtime instead (strategy/modes.py).
"""

from __future__ import annotations

from hetpipe_tf.pipeline.runtime import PipelineRuntime
from hetpipe_tf.ps.faults import FaultGuard, FaultOptions, fault_guard


def guard_for(faults: FaultOptions | None, plans: tuple, cluster) -> FaultGuard | None:
    """The guard of a single VW (`plans`, one) when its stages run on remote tasks of
    `cluster` (a hetpipe_tf Cluster, or None for a local job)."""
    if faults is None or len(plans) != 1:
        return None
    return fault_guard(faults, plans, (), cluster)


class GuardedPipelineRuntime(PipelineRuntime):
    """A `PipelineRuntime` whose calls a `FaultGuard` runs (module docstring)."""

    def __init__(self, *args, guard: FaultGuard, **kwargs):
        self.guard = guard
        super().__init__(*args, **kwargs)

    @property
    def error(self) -> BaseException | None:
        """A lost task's TaskLostError first (the stage errors it caused follow from it)."""
        return self.guard.fatal if self.guard.fatal is not None else self._error

    def _guarded(self, fn, *args):
        if self.guard.inside():   # already on the guard's helper thread (nested calls)
            return fn(*args)
        return self.guard.call(fn, *args)

    def submit(self, inputs: list, y, sample_weight, loss_scale: float | None = None) -> None:
        return self._guarded(super().submit, inputs, y, sample_weight, loss_scale)

    def wait_for_room(self) -> None:
        return self._guarded(super().wait_for_room)

    def drain(self) -> None:
        return self._guarded(super().drain)

    def abort(self) -> None:
        if self.guard.inside():
            return super().abort()
        self.guard.call_or_abandon(super().abort, self._abandon)

    def close(self) -> None:
        if self._closed:
            return
        try:
            self.guard.call_or_abandon(super().close, lambda: self._abandon(close=True))
        finally:
            self.guard.close()

    def _abandon(self, close: bool = False) -> None:
        """A task is lost: end the run without remote work (queued tasks of it are skipped);
        `close`: also stop the threads that can stop, without joining any."""
        with self._cond:
            self._run += 1
            self._waiting = None
            self._run_open = False
            self._cond.notify_all()
        if close:
            self._closed = True
            if self._workers is not None:
                self._workers.stop()   # no join: a thread in a lost task's op stays behind
