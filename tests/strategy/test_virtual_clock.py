"""The virtual clock (docs/virtual_clock.md): several VWs under WSP trained in the order and
at the virtual time of a cluster model, checked three ways:

- three runs give bit-identical weights, virtual times and orders;
- the order a run logged (`coordinator.actions`), replayed through an independent NumPy
  model of WSP (pushes summed into w_global in that order, the pull rule of
  `ParameterServers.pull_wave`, w_local rebased by pulls, every minibatch's gradient
  recomputed with plain Keras at weights reflecting exactly the local updates 1..p-N_m)
  gives the same weights; the records obey local staleness and WSP's bound;
- the virtual time per minibatch equals the cluster model's (`simulate`) for the plans.
"""

import dataclasses

import keras
import numpy as np
import pytest
import tensorflow as tf

from hetpipe_tf.cluster.spec import paper_cluster
from hetpipe_tf.core import wsp
from hetpipe_tf.core.schedule import TaskKind
from hetpipe_tf.core.virtual_time import ActionKind
from hetpipe_tf.sim import VirtualClock
from hetpipe_tf.strategy import HetPipeStrategy, even_plan
from tests.strategy.helpers import DEVICES, assert_weights_close, regression_data, skip_model

BATCH, LR = 8, 0.05
CLOCK = VirtualClock(paper_cluster())
# Two VWs of the paper's cluster: a TITAN V + TITAN RTX pair and a slower RTX 2060 +
# Quadro P4000 pair (stage seconds per minibatch of this small model, by hand).
VWS = (((0, 1), (0.004, 0.005)), ((2, 3), (0.009, 0.011)))


def _plans(n_m, stages):
    probe = skip_model(0)
    out = []
    for v, (hosts, times) in enumerate(VWS):
        p = even_plan(probe, DEVICES[stages * v:stages * (v + 1)], n_m=n_m, batch_size=BATCH)
        st = tuple(dataclasses.replace(s, device=f"host{h}/gpu0", compute_s=t)
                   for s, h, t in zip(p.stages, hosts, times))
        out.append(dataclasses.replace(p, stages=st))
    return out


def _fit(n_m, d, stages, epochs=1, n=64, callbacks=()):
    x, y = regression_data(n, 0)
    strategy = HetPipeStrategy(plan=_plans(n_m, stages), clock_distance=d,
                               compensation="none", clock=CLOCK)
    with strategy.scope():
        model = skip_model(0)
        model.compile(keras.optimizers.SGD(LR), "mse")
    w0 = model.get_weights()
    history = model.fit(x, y, batch_size=BATCH, epochs=epochs, shuffle=False, verbose=0,
                        callbacks=list(callbacks))
    batches = [(x[i:i + BATCH], y[i:i + BATCH]) for i in range(0, n, BATCH)] * epochs
    return strategy, model, w0, batches, history


def _update(probe, weights, batch):
    probe.set_weights(weights)
    x, y = batch
    with tf.GradientTape() as tape:
        loss = keras.losses.MeanSquaredError()(y, probe(x, training=True))
    return [-LR * g.numpy() for g in tape.gradient(loss, probe.trainable_variables)]


def _replay(coord, w0, batches, n_m, d):
    """w_global after one run, from the logged order alone (module docstring)."""
    probe = skip_model(0)
    nv = len(coord.assignment)
    add = lambda a, b: [x + y for x, y in zip(a, b)]   # noqa: E731
    sub = lambda a, b: [x - y for x, y in zip(a, b)]   # noqa: E731
    w_global, pushed, snap = [a.copy() for a in w0], [0] * nv, None
    local = [{0: w0} for _ in range(nv)]   # w_local right after update q
    base = [w0] * nv
    pending, pulled = {}, {}
    for a in coord.actions:
        v = a.vw
        if a.kind is ActionKind.TASK:
            if a.stage != 0 or a.task is TaskKind.FORWARD:
                continue   # only the commits (stage 0's last task of p) change weights
            p = a.minibatch
            u = _update(probe, local[v][max(0, p - n_m)], batches[coord.assignment[v][p - 1]])
            local[v][p] = add(local[v][p - 1], u)
            if p % n_m == 0:
                pending[(v, p // n_m - 1)] = sub(local[v][p], base[v])
                base[v] = local[v][p]
        elif a.kind is ActionKind.PUSH:
            before = min(pushed)
            w_global = add(w_global, pending.pop((v, a.wave)))
            pushed[v] = a.wave + 1
            if min(pushed) > before:
                snap = ([x.copy() for x in w_global], tuple(pushed))
        elif a.kind is ActionKind.PULL_READ:
            r = a.wave - d
            if min(pushed) > r:   # ParameterServers.pull_wave's rule
                ok = snap is not None and min(snap[1]) > r and snap[1][v] == pushed[v]
                pulled[(v, a.wave)] = snap[0] if ok else [x.copy() for x in w_global]
        else:
            got = pulled.pop((v, a.wave), None)
            if got is not None:
                q = (a.wave + 1) * n_m
                shift = sub(got, local[v][q])
                for k in [k for k in local[v] if k >= q]:
                    local[v][k] = add(local[v][k], shift)
                base[v] = local[v][q]
    for v in range(nv):   # flush: the unfinished wave of each VW
        last = len(coord.assignment[v])
        if last % n_m:
            w_global = add(w_global, sub(local[v][last], base[v]))
    return w_global


@pytest.mark.parametrize("n_m,d,stages", [(2, 1, 2), (1, 0, 1), (3, 2, 1)])
def test_order_replayed_by_a_numpy_reference_gives_the_weights(n_m, d, stages):
    strategy, model, w0, batches, _ = _fit(n_m, d, stages)
    coord = strategy.coordinator(model)
    assert sorted(s for a in coord.assignment for s in a) == list(range(len(batches)))
    assert_weights_close(model.get_weights(), _replay(coord, w0, batches, n_m, d))
    # Every WSP and staleness invariant holds in the records.
    for v in range(2):
        rt, sync = strategy.pipeline(model, v), coord.syncs[v]
        for p in range(1, len(coord.assignment[v]) + 1):
            assert rt.record[p] == tuple(range(1, max(0, p - n_m) + 1))
            need = wsp.required_global_wave(p, n_m, d)
            if need is not None:
                assert min(sync.record[p]) > need, (v, p, sync.record[p], need)
    assert coord.servers.max_clock_distance <= d + 1
    strategy.close()


def test_three_runs_are_bit_identical():
    runs = []
    for _ in range(3):
        strategy, model, _, _, history = _fit(2, 1, 2, epochs=2)
        coord = strategy.coordinator(model)
        runs.append((model.get_weights(), history.history, list(coord.actions),
                     [list(a) for a in coord.assignment]))
        strategy.close()
    for w, h, actions, assignment in runs[1:]:
        assert all(np.array_equal(a, b) for a, b in zip(w, runs[0][0]))
        assert h == runs[0][1]
        assert actions == runs[0][2] and assignment == runs[0][3]
    times = runs[0][1]["virtual_time_s"]
    assert len(times) == 2 and 0 < times[0] < times[1]


def test_virtual_time_per_minibatch_is_the_cluster_models():
    n_m, d, stages, n = 2, 1, 2, 160
    strategy, model, _, _, history = _fit(n_m, d, stages, n=BATCH * n)
    coord = strategy.coordinator(model)
    plans = _plans(n_m, stages)
    param_bytes = [[int(sum(np.prod(v.shape) * 4 for v in s.trainable)) for s in
                    strategy.pipeline(model, v).stages] for v in range(2)]
    # The cluster model's run of as many minibatches, each VW as many waves: its
    # throughput (ramp-up and ramp-down included, as in the virtual run, which gives the
    # faster VW a minibatch or two more within WSP's bound).
    sim = CLOCK.simulate(plans, n_m, d, param_bytes, num_waves=n // (2 * n_m))
    per_minibatch = history.history["virtual_time_s"][-1] / n
    assert abs(per_minibatch * sim.minibatches_per_s - 1) < 0.02, (
        per_minibatch, 1 / sim.minibatches_per_s)
    # Every task ran at the cluster model's time for it.
    model_times = {(e.vw, e.task.stage, e.task.minibatch, e.task.kind): (e.start, e.end)
                   for e in CLOCK.simulate(plans, n_m, d, param_bytes, 64).events}
    for a in coord.actions:
        if a.kind is ActionKind.TASK:
            assert model_times[(a.vw, a.stage, a.minibatch, a.task)] == (a.time, a.end)
    strategy.close()


class _StopAt(keras.callbacks.Callback):
    def __init__(self, seconds):
        super().__init__()
        self.seconds = seconds

    def on_epoch_end(self, epoch, logs=None):
        if logs["virtual_time_s"] >= self.seconds:
            self.model.stop_training = True


def test_callbacks_stop_on_the_virtual_time_and_evaluate_shows_it():
    strategy, model, _, _, history = _fit(2, 1, 2, epochs=10, callbacks=[_StopAt(0.05)])
    times = history.history["virtual_time_s"]
    assert len(times) < 10 and times[-1] >= 0.05 > times[-2]
    x, y = regression_data(16, 1)   # evaluate reads the clock, never moves it
    assert model.evaluate(x, y, batch_size=BATCH, verbose=0,
                          return_dict=True)["virtual_time_s"] == times[-1]
    strategy.close()


@pytest.mark.parametrize("kwargs,match", [
    (dict(clock="virtual"), "VirtualClock"),
    (dict(clock=CLOCK, schedule="gpipe", micro_batches=2), "synchronous schedule"),
    (dict(clock=CLOCK, data_parallel="wsp_split"), "data_parallel"),
])
def test_what_it_does_not_train_is_refused_before_training(kwargs, match):
    with pytest.raises(ValueError, match=match):
        HetPipeStrategy(plan=_plans(1, 1), **kwargs)


def test_one_virtual_worker_is_refused():
    with pytest.raises(ValueError, match="one virtual worker"):
        HetPipeStrategy(plan=_plans(1, 1)[:1], clock=CLOCK)
