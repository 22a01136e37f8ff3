"""Synchronous micro-batch schedules (GPipe Section 2.2, 1F1B), replayed from the same
per-stage action lists the executor runs (`core/sync_schedule.py`, `replay`).

A minibatch is split into M = `config.n_m` micro-batches; a micro-batch's action on a stage
takes the minibatch's time / M (times scale linearly with the batch, as in
`ModelProfile.scaled`). Per minibatch every stage runs its action list: F(j, m) after
F(j-1, m), B(j, m) after B(j+1, m) and F(j, m), in the list's order (GPIPE: all forwards,
then all backwards; ONE_F_ONE_B: warm-up, one forward one backward, cool-down); then its
APPLY (update_s[j]) right after its last backward; the next minibatch starts when every
stage has updated (a pipeline flush). The last stage's F and B are separate actions here
(the executor runs the loss and backward inside F and only sends in B: the same busy time
and makespan with equal stage times). The executor also commits a minibatch only when
every stage reached its APPLY (so an abort never applies it on some stages only), which
this model leaves out: a non-first stage's update may start earlier here.
With equal action times the idle ("bubble") fraction of every stage is (K-1)/(M+K-1).

Events number micro-batches globally: micro-batch m of minibatch b is (b-1)*M + m. Several
VWs are simulated independently (no parameter servers in this mode); `num_waves` is the
number of minibatches.
"""

from __future__ import annotations

from typing import Sequence

from hetpipe_tf.cluster.spec import Cluster
from hetpipe_tf.core.schedule import Event, Task, TaskKind
from hetpipe_tf.core.sync_schedule import ActionKind, Schedule, actions, replay
from hetpipe_tf.sim.model import SimConfig, VirtualWorker

_KIND = {ActionKind.FORWARD: TaskKind.FORWARD, ActionKind.BACKWARD: TaskKind.BACKWARD,
         ActionKind.APPLY: TaskKind.APPLY}


def sync_events(forward_s: Sequence[float], backward_s: Sequence[float], micro_batches: int,
                num_minibatches: int, update_s: Sequence[float] | None = None,
                schedule: Schedule = Schedule.GPIPE) -> list[Event]:
    """Events of one VW under a synchronous `schedule`; times are per MINIBATCH per stage.

    `update_s[j]`: stage j's update, once per minibatch after its last backward (an APPLY
    event; none when 0); the next minibatch starts when every stage has updated."""
    k, m_n = len(forward_s), micro_batches
    upd = list(update_s) if update_s is not None else [0.0] * k
    lists = actions(schedule, k, m_n)
    per = {ActionKind.FORWARD: [f / m_n for f in forward_s],
           ActionKind.BACKWARD: [b / m_n for b in backward_s], ActionKind.APPLY: upd}
    events: list[Event] = []
    t0 = 0.0
    for b in range(num_minibatches):
        base = b * m_n
        timed = replay(lists, lambda a: per[a.kind][a.stage], start=t0)
        for t in timed:
            a = t.action
            if a.kind is ActionKind.APPLY:
                if upd[a.stage] > 0:
                    events.append(Event(Task(a.stage, base + m_n, TaskKind.APPLY), t.start,
                                        t.start, t.end))
            else:
                events.append(Event(Task(a.stage, base + a.micro_batch + 1, _KIND[a.kind]),
                                    t.ready, t.start, t.end))
        t0 = max(t.end for t in timed)
    events.sort(key=lambda e: (e.start, e.task.stage))
    return events


def gpipe_events(forward_s: Sequence[float], backward_s: Sequence[float], micro_batches: int,
                 num_minibatches: int, update_s: Sequence[float] | None = None) -> list[Event]:
    """`sync_events` under GPipe's schedule."""
    return sync_events(forward_s, backward_s, micro_batches, num_minibatches, update_s)


def simulate_gpipe(vws: Sequence[VirtualWorker], config: SimConfig, cluster: Cluster):
    """`engine.simulate` under a synchronous `config.mode`: SimResult with micro-batch
    events."""
    import dataclasses

    from hetpipe_tf.sim.result import summarise

    runs = [sync_events(vw.forward_times, vw.backward_times, config.n_m, config.num_waves,
                        vw.update_times, config.mode) for vw in vws]
    gates = [[0.0] * config.num_minibatches for _ in vws]
    r = summarise(vws, config, cluster, runs, gates, ())
    m = config.n_m  # summarise counts micro-batches; report minibatches
    return dataclasses.replace(
        r, minibatches=r.minibatches // m, samples=r.samples // m,
        steady_minibatches_per_s=r.steady_minibatches_per_s / m,
        steady_samples_per_s=r.steady_samples_per_s / m)
