"""Several virtual workers trained in the order and at the virtual time of a cluster model.

`VirtualCoordinator` is the executor of `HetPipeStrategy(clock=VirtualClock(cluster))`
(docs/virtual_clock.md). It owns the same parts as `Coordinator` (each VW's pipeline, its
wave sync, the parameter servers) but no thread: `schedule(num_waves)` gives every action
of a run (`hetpipe_tf.core.virtual_time`: stage tasks, pushes, pulls, with virtual times)
and the coordinator runs them one at a time in that order on the caller's thread:

* the k-th batch of a run goes to the VW whose minibatch enters stage 0 k-th
  (`batch_order`); `submit` then runs every action up to the next minibatch's entry;
* a TASK runs the stage's real task (`OrderedRuntime.run`); a commit takes the wave's
  update (`TimedWaveSync.commit`), a PUSH lands it, a PULL_READ reads w_global, a PULL_DONE
  rebases w_local and completes the minibatch that ended the wave (the next wave's gated
  minibatch may start);
* `drain` runs what is left of the submitted minibatches (a task of a minibatch that got no
  batch, a push of an unfinished wave and a pull whose global wave is incomplete are
  skipped), lands the remaining updates, pushes unfinished waves (`flush`) and copies
  w_global into the model, as `Coordinator` does.

Virtual time: a run starts at the end of the previous one (every run starts with empty
pipelines, as the threaded runtime's); `virtual_time_s` is the end of the latest action
run. `on_time(t)` is called with a task's end before the last stage's task (its metrics
update reads it) and with the run's end when it closes. Runs longer than the schedule
double it (the actions already run stay; the rest follow the longer schedule).

Records: `assignment[w]` (step numbers VW w took, as Coordinator's), `syncs[w].record`,
`runtimes[w].record`, the servers' pushes, and `actions` (every action run, with the run's
virtual start added to its times).
"""

from __future__ import annotations

import collections
import dataclasses
from typing import Any, Callable, Sequence

import tensorflow as tf

from hetpipe_tf._shim import keras_optimizer
from hetpipe_tf.core.schedule import TaskKind
from hetpipe_tf.core.virtual_time import Action, ActionKind, batch_order
from hetpipe_tf.pipeline.executor import Executor, PipelineError
from hetpipe_tf.pipeline.window import Window
from hetpipe_tf.ps.server import ParameterServers
from hetpipe_tf.ps.timed_sync import TimedWaveSync

_LONG = 1 << 20   # records kept (actions, assignment): a test's or a benchmark's runs


def _ident(a: Action) -> tuple:
    return (int(a.kind), a.vw, a.stage, a.minibatch, a.wave, a.task)


class VirtualCoordinator(Executor):
    """The virtual-clock executor of several VWs (module docstring).

    Args:
      runtimes: one `OrderedRuntime` per VW, built with `on_commit=coordinator.committer(w)`
        (or [] and `attach` them once built).
      syncs: their `TimedWaveSync`s.
      servers: the parameter servers; model_variables: the model's versioned variables.
      schedule: num_waves -> the ordered actions of a run of that many waves per VW.
      first_waves: the schedule's length tried first.
      on_time: called with virtual times (module docstring); on_run_start, on_run_end: as
        Coordinator's.
    """

    def __init__(self, runtimes: Sequence[Any], syncs: Sequence[TimedWaveSync],
                 servers: ParameterServers, model_variables: Sequence[Any],
                 schedule: Callable[[int], Sequence[Action]], *, first_waves: int,
                 n_m: int, on_time: Callable[[float], None] | None = None,
                 on_run_start: Callable[[], None] | None = None,
                 on_run_end: Callable[[], None] | None = None):
        self.runtimes, self.syncs = list(runtimes), list(syncs)
        self.servers = servers
        self.model_variables = list(model_variables)
        self._schedule_fn = schedule
        self._schedules: dict[int, tuple[Action, ...]] = {}
        self._first_waves, self._n_m = first_waves, n_m
        self._on_time = on_time or (lambda t: None)
        self._on_run_start, self._on_run_end = on_run_start, on_run_end
        self.assignment = [Window(_LONG) for _ in self.syncs]
        self.run_starts = Window(_LONG)
        self.actions = Window(_LONG)   # every action run, times from training's start
        self.run_seconds = Window(_LONG)   # virtual seconds of each run
        self.virtual_time_s = 0.0
        self._offset = 0.0
        self._steps = 0
        self._run_open = False
        self._closed = False
        self._error = None

    def committer(self, w: int) -> Callable:
        """VW w's `on_commit`: its wave hook."""
        return lambda mb: self._committed(w, mb)

    def attach(self, runtimes: Sequence[Any]) -> None:
        """The VWs' runtimes, built with `on_commit=self.committer(w)` (one per sync)."""
        if len(runtimes) != len(self.syncs):
            raise ValueError(f"One runtime per wave sync is needed. Received: "
                             f"{len(runtimes)} runtimes, {len(self.syncs)} syncs.")
        self.runtimes = list(runtimes)

    @property
    def thread_ids(self) -> set[int]:
        return set()

    @property
    def logs(self) -> dict | None:
        done = [rt for rt in self.runtimes if rt.logs is not None]
        return max(done, key=lambda rt: rt.logs_time).logs if done else None

    # --- the strategy's calls ------------------------------------------------------------
    def submit(self, inputs: list, y, sample_weight) -> None:
        self._raise_if_failed()
        if self._closed:
            raise PipelineError("The virtual clock's coordinator is closed.")
        if not self._run_open:
            self._start_run()
        if self._taken + self._margin >= len(self._order):
            self._extend()
        v, p = self._order[self._taken]
        rt = self.runtimes[v]
        if rt.submitted + 1 != self._first[v] + p - 1:
            raise RuntimeError(f"The virtual order skipped a minibatch. Received: VW {v} "
                               f"minibatch {p}, {rt.submitted} submitted; this is a bug, "
                               "please report it.")
        self.assignment[v].append(self._steps)
        self._steps += 1
        self._taken += 1
        self._submitted[v] = p
        rt.submit(inputs, y, sample_weight)
        self._advance(until_entry=True)

    def drain(self) -> None:
        self._raise_if_failed()
        if not self._run_open:
            return
        self._advance(until_entry=False)
        self._release()
        for w, rt in enumerate(self.runtimes):
            if rt.completed < rt.submitted:   # never wait: nothing else would run
                raise RuntimeError(
                    f"The virtual order left minibatches of VW {w} unfinished. Received: "
                    f"{rt.submitted} submitted, {rt.completed} completed; this is a bug, "
                    "please report it.")
            rt.drain()
        self._close_run()

    def abort(self) -> None:
        """Keep what was applied: land taken updates, complete committed minibatches, drop
        the rest, close the run."""
        if self._run_open:
            self._release()
            for rt in self.runtimes:
                rt.abort()
            self._close_run()
        self._error = None

    def close(self) -> None:
        if self._closed:
            return
        self.abort()
        self._closed = True
        for rt in self.runtimes:
            rt.close()

    # --- runs ------------------------------------------------------------------------------
    def _start_run(self) -> None:
        values = [tf.identity(keras_optimizer.variable_handle(v)) for v in self.model_variables]
        self.servers.start_run(values)
        self._first = [rt.submitted + 1 for rt in self.runtimes]
        self._base_wave = []
        for rt, s in zip(self.runtimes, self.syncs):
            s.start_run(rt.submitted + 1)
            self._base_wave.append(s.clock)
        self._submitted = [0] * len(self.runtimes)
        self._held: dict[tuple[int, int], Any] = {}   # (VW, wave) -> minibatch awaiting pull
        self._commits = [collections.deque() for _ in self.runtimes]   # hooks not run yet
        self._pulled: dict[tuple[int, int], Any] = {}
        self._done: set[tuple] = set()
        self._taken = 0
        self._waves = self._first_waves
        self._use(self._schedule(self._waves), ())
        self._now = 0.0
        self.run_starts.append(self._steps)
        self._run_open = True
        if self._on_run_start is not None:
            self._on_run_start()

    def _schedule(self, waves: int) -> tuple[Action, ...]:
        if waves not in self._schedules:
            self._schedules[waves] = tuple(self._schedule_fn(waves))
        return self._schedules[waves]

    def _use(self, actions: Sequence[Action], assigned: Sequence[tuple[int, int]]) -> None:
        self._actions = [a for a in actions if _ident(a) not in self._done]
        self._timed_pulls = {(a.vw, a.wave) for a in actions if a.kind is ActionKind.PULL_DONE}
        self._cursor = 0
        seen = set(assigned)
        self._order = list(assigned) + [x for x in batch_order(actions) if x not in seen]
        self._margin = len(self.runtimes) * self._n_m * 4

    def _extend(self) -> None:
        """The run outgrows the schedule: double it; actions already run stay run."""
        self._waves *= 2
        self._use(self._schedule(self._waves), self._order[:self._taken])

    def _close_run(self) -> None:
        for s in self.syncs:
            s.flush()
        values, _ = self.servers.pull()
        for v, x in zip(self.model_variables, values):
            keras_optimizer.variable_handle(v).assign(x)
        self._run_open = False
        self.run_seconds.append(self._now)
        self._offset += self._now
        self.virtual_time_s = self._offset
        self._on_time(self._offset)
        if self._on_run_end is not None:
            self._on_run_end()

    def _release(self) -> None:
        """Land every taken update and complete every minibatch waiting for a pull (no
        pull: the run ended before the global wave it needs), each logged as an action."""
        self._land_all()
        while self._held:
            (w, c), mb = min(self._held.items(), key=lambda kv: kv[0])
            del self._held[(w, c)]
            self.syncs[w].take(self._base_wave[w] + c, None)
            self._log(Action(self._now, ActionKind.PULL_DONE, w, wave=c, end=self._now))
            self.runtimes[w].complete(mb)
            self._flow(w)
            self._land_all()

    def _land_all(self) -> None:
        for w, s in enumerate(self.syncs):
            for c in s.pending():
                s.land(c)
                self._log(Action(self._now, ActionKind.PUSH, w, wave=c - self._base_wave[w],
                                 end=self._now))

    # --- the order ---------------------------------------------------------------------
    def _advance(self, until_entry: bool) -> None:
        """Run actions in order; stop before the entry of a minibatch with no batch yet
        (`until_entry`), else skip what belongs to such minibatches."""
        while self._cursor < len(self._actions):
            a = self._actions[self._cursor]
            if a.kind is ActionKind.TASK and a.minibatch > self._submitted[a.vw]:
                if until_entry and a.entry:
                    return
                self._cursor += 1
                continue
            self._cursor += 1
            self._run(a)

    def _log(self, a: Action) -> None:
        self.actions.append(dataclasses.replace(a, time=self._offset + a.time,
                                                end=self._offset + a.end))

    def _run(self, a: Action) -> None:
        v = a.vw
        if a.kind is ActionKind.TASK:
            if a.task is TaskKind.FORWARD_BACKWARD:
                self._on_time(self._offset + a.end)
            self._done.add(_ident(a))
            self._now = max(self._now, a.end)
            self.virtual_time_s = self._offset + self._now
            self._log(a)   # first: what its commit does at once is logged after it
            self.runtimes[v].run(a.stage, a.task, self._first[v] + a.minibatch - 1)
            return
        else:
            c = self._base_wave[v] + a.wave
            if a.kind is ActionKind.PUSH:
                if not self.syncs[v].land(c):
                    return   # the wave never ended: the run got fewer batches
            elif a.kind is ActionKind.PULL_READ:
                if (v, a.wave) not in self._held:
                    return
                self._pulled[(v, a.wave)] = self.syncs[v].read(c)
            else:
                mb = self._held.pop((v, a.wave), None)
                if mb is None:
                    return
                self.syncs[v].take(c, self._pulled.pop((v, a.wave), None))
                self.runtimes[v].complete(mb)
                self._flow(v)
        self._done.add(_ident(a))
        self._log(a)

    def _committed(self, w: int, mb) -> None:
        """VW w applied mb on every stage: its wave hook runs after those of the minibatches
        committed before it (in order, as the threaded runtime's updater runs them)."""
        self._commits[w].append(mb)
        self._flow(w)

    def _flow(self, w: int) -> None:
        """Run VW w's wave hooks in order until one waits for its pull: take the wave's
        update; the minibatch completes now, or when the pull after its wave arrives."""
        s, rt, queue = self.syncs[w], self.runtimes[w], self._commits[w]
        while queue and not any(v == w for v, _ in self._held):
            mb = queue.popleft()
            c = s.commit(mb.id)
            if c is not None and s.pulls_after(c):
                if (w, c - self._base_wave[w]) in self._timed_pulls:
                    self._held[(w, c - self._base_wave[w])] = mb
                    return
                # The cluster model has no pull here (a run's waves below D, clocks going
                # on from the last run; the last simulated wave): push and pull now.
                rel = c - self._base_wave[w]
                for x in s.pending():
                    if x <= c:
                        s.land(x)
                        self._log(Action(self._now, ActionKind.PUSH, w,
                                         wave=x - self._base_wave[w], end=self._now))
                s.take(c, s.read(c))
                for kind in (ActionKind.PULL_READ, ActionKind.PULL_DONE):
                    self._log(Action(self._now, kind, w, wave=rel, end=self._now))
            elif c is not None:
                s.take(c, None)
            rt.complete(mb)
