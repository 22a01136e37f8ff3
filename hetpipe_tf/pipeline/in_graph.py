"""One virtual worker of one stage at N_m = 1, run inside Keras' compiled train step.

With one stage and one minibatch in flight the pipeline has nothing to overlap: minibatch p
runs forward, loss, backward and metrics, then applies u_p, and p + 1 starts from the
result, which is exactly what the compiled step does. So instead of handing each minibatch
through a `py_function` to a stage thread (about 1.5 ms a minibatch on this project's
machine, more than a whole step of a small model; docs/performance.md), `step` emits the
stage's compiled task and update as ops of Keras' own train function: no `py_function`, no
thread, no second call.

What stays the same as with `PipelineRuntime`: the stage's own code (`Stage.train_ops`,
`StageWeights.update_ops`), its optimizer (a clone of the model's, seeded when a run opens
and merged back when it ends: `on_run_start` / `on_run_end`), the Executor interface, and
the records, as far as they exist here:

* `record` (p -> the updates its weights reflected) is 1..p-1 by construction;
* `trace` has one FORWARD_BACKWARD event of stage 0 per Keras call when
  `steps_per_execution` is 1, spanning the whole call (the update included: it runs inside
  the same call); with more steps per call it stays empty;
* `update_s` stays empty (the update is not a span of its own);
* `completed` is read from the step counter (`model.optimizer.iterations`) when asked.

Nothing is ever in flight between Keras calls, so `drain` and `abort` only end the run. A
Ctrl-C lands between calls (TensorFlow runs a call to its end before Python handles the
signal), so no minibatch is half applied; with `run_eagerly=True` Keras runs the step op by
op in Python, and an interrupt can land inside it, as in plain Keras.
"""

from __future__ import annotations

import time
from typing import Any, Callable, Iterator, Mapping

import tensorflow as tf

from hetpipe_tf.core.schedule import Task, TaskKind
from hetpipe_tf.pipeline.executor import Executor
from hetpipe_tf.pipeline.runtime import PipelineError, TraceEvent
from hetpipe_tf.pipeline.stage import Stage
from hetpipe_tf.pipeline.weights import WeightVersions
from hetpipe_tf.pipeline.window import DEFAULT_HISTORY, Window


def runs_in_graph(stages, n_m: int) -> bool:
    """Whether a virtual worker of these stages at this N_m can run in Keras' step: one
    stage, one minibatch in flight, no emulated slowdown (emulation sleeps in Python)."""
    return (len(stages) == 1 and n_m == 1
            and all(s.emulated_speed_factor >= 1.0 for s in stages))


class _SequentialRecord(Mapping):
    """p -> (1, ..., p - 1) for the last `history` completed minibatches."""

    def __init__(self, completed: int, history: int):
        self._first = max(1, completed - history + 1)
        self._last = completed

    def __getitem__(self, p: int) -> tuple[int, ...]:
        if not self._first <= p <= self._last:
            raise KeyError(p)
        return tuple(range(1, p))

    def __iter__(self) -> Iterator[int]:
        return iter(range(self._first, self._last + 1))

    def __len__(self) -> int:
        return self._last - self._first + 1


class InGraphRuntime(Executor):
    """The Executor of one virtual worker of one stage at N_m = 1 (module docstring).

    Args:
      stage: the model's only stage.
      weights: its weights (one `StageWeights`).
      update_metrics: update_metrics(loss, y, y_pred, sample_weight) -> logs.
      counter: the variable the update increments once a minibatch.
      plan, vw, history, on_run_start, on_run_end: as for `PipelineRuntime`.
    """

    n_m = 1
    dropped = 0          # nothing is ever in flight to drop

    def __init__(self, stage: Stage, weights: WeightVersions,
                 update_metrics: Callable[[Any, Any, Any, Any], dict], counter,
                 plan=None, vw: int = 0, history: int = DEFAULT_HISTORY, trace: bool = True,
                 on_run_start: Callable[[], None] | None = None,
                 on_run_end: Callable[[], None] | None = None):
        if not runs_in_graph([stage], 1) or len(weights.stages) != 1:
            raise ValueError("The in-graph runtime needs one stage (no emulated slowdown) "
                             f"and its weights. Received: stage {stage.index} with "
                             f"emulated_speed_factor={stage.emulated_speed_factor} and "
                             f"{len(weights.stages)} StageWeights.")
        self.stages = [stage]
        self.versions = weights
        self.plan = plan
        self.vw = vw
        self.history = history
        self.trace_enabled = trace
        self._update_metrics = update_metrics
        self._counter = counter
        self._on_run_start = on_run_start
        self._on_run_end = on_run_end
        self.trace = Window(history)
        self.completions = Window(history)
        self.update_s = Window(history)
        self.run_starts = Window(history)
        self.logs = None     # Keras gets the logs from its own step
        self._run_open = False
        self._closed = False
        self._done_before_run = 0   # minibatches completed in earlier runs
        self._count_at_open = 0     # the counter when the run opened
        self._calls = 0             # minibatches counted by `end_call` in this run

    # --- the Keras step -----------------------------------------------------------------
    def step(self, inputs: list, y, sample_weight) -> dict:
        """Minibatch p as ops of the caller's graph (Keras' train step): its forward, loss,
        backward and metrics on the weights as they are, then u_p. Returns the logs."""
        with tf.init_scope():   # eager, once per run (the first trace opens the first run)
            self.begin_call()
        stage, weights = self.stages[0], self.versions.stages[0]
        with tf.device(stage.device):
            tvals, nvals = weights.read_ops()
            grads, deltas, logs = stage.train_ops(tvals, nvals, inputs, y, sample_weight,
                                                  self._update_metrics)
            weights.update_ops(grads, deltas)
        return logs

    def begin_call(self) -> None:
        """Before a Keras call: refuse when closed, open a run if none is open."""
        if self._closed:
            raise PipelineError(f"The pipeline of virtual worker {self.vw} is closed.")
        if self._run_open:
            return
        if self._on_run_start is not None:
            self._on_run_start()
        self._count_at_open = int(self._counter.numpy())
        self._calls = 0
        self._run_open = True
        self.run_starts.append(self._done_before_run + 1)

    def end_call(self, t0: float, steps_per_execution: int) -> None:
        """After a Keras call that returned (started at perf_counter `t0`): record it."""
        if steps_per_execution != 1 or not self._run_open:
            return
        self._calls += 1
        p = self._done_before_run + self._calls
        if self.trace_enabled:
            self.trace.append(TraceEvent(Task(0, p, TaskKind.FORWARD_BACKWARD), t0,
                                         time.perf_counter()))
        self.completions.append(p)

    # --- Executor -----------------------------------------------------------------------
    @property
    def completed(self) -> int:
        if not self._run_open:
            return self._done_before_run
        return self._done_before_run + int(self._counter.numpy()) - self._count_at_open

    @property
    def submitted(self) -> int:
        return self.completed

    @property
    def in_flight(self) -> int:
        return 0

    @property
    def record(self) -> Mapping[int, tuple[int, ...]]:
        return _SequentialRecord(self.completed, self.history)

    @property
    def thread_ids(self) -> set[int]:
        return set()

    def submit(self, inputs: list, y, sample_weight) -> None:
        raise PipelineError("The in-graph runtime takes minibatches inside Keras' train "
                            "step (`step`), not through submit.")

    def wait_for_room(self) -> None:
        return

    def drain(self) -> None:
        """Nothing is in flight: end the run (the model's optimizer takes the state)."""
        if not self._run_open:
            return
        done = self.completed
        if self._on_run_end is not None:
            self._on_run_end()
        # Closed only once merged: an interrupt inside the merge leaves the run open, so
        # the abort that follows merges again.
        self._done_before_run = done
        self._run_open = False

    def abort(self) -> None:
        self.drain()

    def close(self) -> None:
        if not self._closed:
            self.drain()
            self._closed = True
