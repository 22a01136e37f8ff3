"""GPipe's synchronous micro-batch schedule (GPipe Section 2.2), for comparison.

A minibatch is split into M = `config.n_m` micro-batches; a micro-batch's task on a stage
takes the minibatch's time / M (times scale linearly with the batch, as in
`ModelProfile.scaled`). Per minibatch: forward of micro-batches 1..M on every stage
(F[j][m] after F[j-1][m] and F[j][m-1]), then backward of 1..M (B[j][m] after B[j+1][m]
and B[j][m-1]; the last stage starts backward after its last forward), gradients are
accumulated and applied once; the next minibatch starts when stage 0 finished its last
backward (a pipeline flush). The last stage runs forward and backward as separate tasks.
With equal task times the idle ("bubble") fraction of every stage is (K-1)/(M+K-1).

Events number micro-batches globally: micro-batch m of minibatch b is (b-1)*M + m. Several
VWs are simulated independently (no parameter servers in this mode); `num_waves` is the
number of minibatches.
"""

from __future__ import annotations

from typing import Sequence

from hetpipe_tf.cluster.spec import Cluster
from hetpipe_tf.sim.model import SimConfig, VirtualWorker
from hetpipe_tf.core.schedule import Event, Task, TaskKind


def gpipe_events(forward_s: Sequence[float], backward_s: Sequence[float], micro_batches: int,
                 num_minibatches: int, update_s: Sequence[float] | None = None) -> list[Event]:
    """Events of one VW under the GPipe schedule; times are per MINIBATCH per stage.

    `update_s[j]`: stage j's update, once per minibatch after its last backward (an APPLY
    event); the next minibatch starts when every stage has updated."""
    k, m_n = len(forward_s), micro_batches
    upd = list(update_s) if update_s is not None else [0.0] * k
    fwd = [f / m_n for f in forward_s]
    bwd = [b / m_n for b in backward_s]
    events: list[Event] = []
    t0 = 0.0
    for b in range(num_minibatches):
        base = b * m_n
        f_end = [[0.0] * (m_n + 1) for _ in range(k)]  # f_end[j][m], m from 1
        for m in range(1, m_n + 1):
            for j in range(k):
                ready = max(t0 if j == 0 else f_end[j - 1][m], t0)
                start = max(ready, f_end[j][m - 1] if m > 1 else t0)
                f_end[j][m] = start + fwd[j]
                events.append(Event(Task(j, base + m, TaskKind.FORWARD), ready, start,
                                    f_end[j][m]))
        b_end = [[0.0] * (m_n + 1) for _ in range(k)]
        for m in range(1, m_n + 1):
            for j in reversed(range(k)):
                ready = b_end[j + 1][m] if j < k - 1 else f_end[j][m_n]
                start = max(ready, b_end[j][m - 1] if m > 1 else f_end[j][m_n])
                b_end[j][m] = start + bwd[j]
                events.append(Event(Task(j, base + m, TaskKind.BACKWARD), ready, start,
                                    b_end[j][m]))
        t0 = b_end[0][m_n]
        for j in range(k):
            if upd[j] > 0:
                done = b_end[j][m_n]
                events.append(Event(Task(j, base + m_n, TaskKind.APPLY), done, done,
                                    done + upd[j]))
                t0 = max(t0, done + upd[j])
    events.sort(key=lambda e: (e.start, e.task.stage))
    return events


def simulate_gpipe(vws: Sequence[VirtualWorker], config: SimConfig, cluster: Cluster):
    """`engine.simulate` in GPIPE mode: SimResult with micro-batch events."""
    import dataclasses

    from hetpipe_tf.sim.result import summarise

    runs = [gpipe_events(vw.forward_times, vw.backward_times, config.n_m, config.num_waves,
                         vw.update_times) for vw in vws]
    gates = [[0.0] * config.num_minibatches for _ in vws]
    r = summarise(vws, config, cluster, runs, gates, ())
    m = config.n_m  # summarise counts micro-batches; report minibatches
    return dataclasses.replace(
        r, minibatches=r.minibatches // m, samples=r.samples // m,
        steady_minibatches_per_s=r.steady_minibatches_per_s / m,
        steady_samples_per_s=r.steady_samples_per_s / m)
