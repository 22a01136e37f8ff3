"""Several virtual workers under WSP (paper Section 5), trained by model.fit.

Each result is compared with an independent reference:
- a reference REBUILT FROM THE RECORDS: every minibatch's weights are recomputed as
  w_0 + (other VWs' waves the record says it saw) + (its own updates 1..p-N_m), its
  gradient recomputed with plain Keras, and the sum of all updates compared with w_global;
  the records themselves must obey the local rule exactly and WSP's global bound;
- for one stage, N_m = 1, D = 0: synchronous data-parallel SGD written by hand.
"""

import time

import keras
import numpy as np
import pytest
import tensorflow as tf

from hetpipe_tf.core import wsp
from hetpipe_tf.strategy import HetPipeStrategy, even_plan
from tests.strategy.helpers import (DEVICES, assert_weights_close, regression_data,
                                    skip_model)

BATCH, LR = 8, 0.05


def _fit(n_m, clock_distance, stages, epochs=1, slow=1.0, n=64):
    x, y = regression_data(n, 0)
    probe = skip_model(0)
    vws = [DEVICES[0:stages], DEVICES[stages:2 * stages]]
    plans = [even_plan(probe, vws[0], n_m=n_m),
             even_plan(probe, vws[1], n_m=n_m, speed_factors=[slow] * stages)]
    strategy = HetPipeStrategy(plan=plans, clock_distance=clock_distance,
                               compensation="none")   # the paper's rules: the reference
    with strategy.scope():
        model = skip_model(0)
        model.compile(keras.optimizers.SGD(LR), "mse")
    w0 = model.get_weights()
    model.fit(x, y, batch_size=BATCH, epochs=epochs, shuffle=False, verbose=0)
    batches = [(x[i:i + BATCH], y[i:i + BATCH]) for i in range(0, n, BATCH)] * epochs
    return strategy, model, w0, batches


def _grad_update(probe, weights, batch):
    probe.set_weights(weights)
    x, y = batch
    with tf.GradientTape() as tape:
        loss = keras.losses.MeanSquaredError()(y, probe(x, training=True))
    grads = tape.gradient(loss, probe.trainable_variables)
    return [-LR * g.numpy() for g in grads]


def _rebuild_from_records(strategy, model, w0, batches, n_m):
    """w_global after one run, recomputed from the records (SGD: u = -lr * gradient)."""
    coord = strategy.coordinator(model)
    probe = skip_model(0)
    updates = {}  # (vw, p) -> update

    def own(v, p):
        return [batches[coord.assignment[v][p - 1]]]

    def wave_sum(v, w):
        total = [np.zeros_like(a) for a in w0]
        count = len(coord.assignment[v])
        for k in range(w * n_m + 1, min((w + 1) * n_m, count) + 1):
            total = [a + b for a, b in zip(total, update(v, k))]
        return total

    def version(v, p):
        vec = coord.syncs[v].record[p]
        w = [a.copy() for a in w0]
        for other, waves in enumerate(vec):
            if other != v:
                for wave in range(waves):
                    w = [a + b for a, b in zip(w, wave_sum(other, wave))]
        for k in strategy.pipeline(model, v).record[p]:
            w = [a + b for a, b in zip(w, update(v, k))]
        return w

    def update(v, p):
        if (v, p) not in updates:
            updates[(v, p)] = _grad_update(probe, version(v, p), own(v, p)[0])
        return updates[(v, p)]

    final = [a.copy() for a in w0]
    for v, steps in enumerate(coord.assignment):
        for p in range(1, len(steps) + 1):
            final = [a + b for a, b in zip(final, update(v, p))]
    return final


def _assert_records_and_reference(strategy, model, w0, batches, n_m, d):
    """Each VW's records obey the local rule exactly and WSP's global bound, the clocks'
    spread stays within D + 1, and w_global equals the reference rebuilt from the records;
    then closes the strategy."""
    coord = strategy.coordinator(model)
    for v in range(2):
        rt, sync = strategy.pipeline(model, v), coord.syncs[v]
        for p in range(1, len(coord.assignment[v]) + 1):
            # Local staleness: exactly the updates 1..p-N_m of this VW.
            assert rt.record[p] == tuple(range(1, max(0, p - n_m) + 1))
            # Global bound: every VW's waves up to the one p needs are in its weights.
            need = wsp.required_global_wave(p, n_m, d)
            if need is not None:
                assert min(sync.record[p]) > need, (v, p, sync.record[p], need)
    assert coord.servers.max_clock_distance <= d + 1
    ref = _rebuild_from_records(strategy, model, w0, batches, n_m)
    assert_weights_close(model.get_weights(), ref)
    strategy.close()


# n = 92 and 90 leave a remainder batch (4 and 2 rows) at the end of the epoch.
@pytest.mark.parametrize("n_m,d,stages,slow,n", [(2, 0, 2, 0.5, 96), (2, 1, 2, 0.4, 92),
                                                 (1, 0, 1, 0.5, 90), (3, 2, 1, 0.3, 96)])
def test_wsp_equals_the_reference_rebuilt_from_records(n_m, d, stages, slow, n):
    strategy, model, w0, batches = _fit(n_m, d, stages, slow=slow, n=n)
    coord = strategy.coordinator(model)
    assert sorted(s for a in coord.assignment for s in a) == list(range(len(batches)))
    _assert_records_and_reference(strategy, model, w0, batches, n_m, d)


def test_d0_n_m_1_one_stage_is_synchronous_data_parallel_sgd():
    epochs = 2
    strategy, model, w0, batches = _fit(1, 0, 1, epochs=epochs)
    coord = strategy.coordinator(model)
    per_epoch = len(batches) // epochs
    # Each clock, each VW trains one minibatch at the same weights; updates are summed.
    assert [len(a) for a in coord.assignment] == [per_epoch] * 2
    probe = skip_model(0)
    w = [a.copy() for a in w0]
    for c in range(per_epoch):
        us = [_grad_update(probe, w, batches[coord.assignment[v][c]]) for v in range(2)]
        w = [a + b + c_ for a, b, c_ in zip(w, *us)]
    assert_weights_close(model.get_weights(), w)
    assert coord.servers.max_clock_distance <= 1
    strategy.close()


def test_global_weights_reach_keras_and_a_new_fit_starts_from_them():
    strategy, model, w0, batches = _fit(2, 0, 2)
    coord = strategy.coordinator(model)
    values, _ = coord.servers.pull()
    for v, x in zip(coord.model_variables, values):
        np.testing.assert_array_equal(v.numpy(), x.numpy())
    # A weight change between fits (as a callback or the user makes) reaches every VW.
    model.set_weights(w0)
    model.fit(*[np.concatenate(a) for a in zip(*batches[:2])], batch_size=BATCH, epochs=1,
              shuffle=False, verbose=0)
    assert coord.run_starts[-1] == len(batches)
    # Whichever VW takes them, both minibatches are among the first N_m = 2 of their VW's
    # run, so both start from w_0 and w_global ends at w_0 + u_1 + u_2.
    probe = skip_model(0)
    u = [_grad_update(probe, w0, batches[i]) for i in range(2)]
    assert_weights_close(model.get_weights(), [a + b + c for a, b, c in zip(w0, *u)])
    assert np.isfinite(model.evaluate(batches[0][0], batches[0][1], verbose=0))
    strategy.close()


def test_bad_virtual_worker_arguments_are_refused_before_training():
    probe = skip_model(0)
    a = even_plan(probe, DEVICES[0:2], n_m=2)
    b = even_plan(probe, DEVICES[2:4], n_m=3)
    with pytest.raises(ValueError, match=r"same N_m.*n_m=\[2, 3\]"):
        HetPipeStrategy(plan=[a, b])
    with pytest.raises(ValueError, match="clock_distance.*Received: clock_distance=-1"):
        HetPipeStrategy(plan=[a, a], clock_distance=-1)
    with pytest.raises(ValueError, match="allocation.*cannot be combined"):
        HetPipeStrategy(plan=[a, a], allocation="ED")
    with pytest.raises(ValueError, match="Received: plan\\[1\\]='x'"):
        HetPipeStrategy(plan=[a, "x"])
    strategy = HetPipeStrategy(plan=[a, a], placement="ed_local")
    with strategy.scope():
        model = skip_model(0)
        model.compile(keras.optimizers.SGD(LR), "mse")
    w0 = model.get_weights()
    x, y = regression_data(16, 0)
    with pytest.raises(ValueError, match="ED-local placement needs the cluster"):
        model.fit(x, y, batch_size=BATCH, epochs=1, verbose=0)
    assert_weights_close(model.get_weights(), w0)


def test_ed_local_keeps_each_stage_parameters_on_its_own_host():
    from hetpipe_tf.cluster.spec import Cluster
    from hetpipe_tf.strategy import StageSpec, manual_plan
    cluster = Cluster.local(["LOCAL_CPU"] * 4, hosts=2)   # host0: CPU:0,1; host1: CPU:2,3
    dev = {d.name: d.tf_device for d in cluster.devices}
    probe = skip_model(0)
    plans = [manual_plan(probe, [StageSpec(dev[f"host0/cpu{w}"], 3, name=f"host0/cpu{w}"),
                                 StageSpec(dev[f"host1/cpu{w}"], 2, name=f"host1/cpu{w}")], 2)
             for w in range(2)]
    strategy = HetPipeStrategy(cluster, plan=plans, placement="ed_local")
    with strategy.scope():
        model = skip_model(0)
        model.compile(keras.optimizers.SGD(LR), "mse")
    x, y = regression_data(32, 0)
    model.fit(x, y, batch_size=BATCH, epochs=1, verbose=0)
    coord = strategy.coordinator(model)
    dev = {k: _short(v) for k, v in dev.items()}
    where = {v.name.split("/")[1]: _short(v.device) for v in coord.servers.variables}
    # Stage 0 = d1, d2, d3 on host0 (its PS: CPU:0); stage 1 = add, out on host1 (CPU:2).
    assert {where[k] for k in ("d1", "d2", "d3")} == {dev["host0/cpu0"]}
    assert where["out"] == dev["host1/cpu0"]
    for w, sync in enumerate(coord.syncs):   # w_local on the VW's own stage devices
        assert {_short(v.device) for v in sync.local} == {dev[f"host0/cpu{w}"],
                                                          dev[f"host1/cpu{w}"]}
    strategy.close()


def _short(device: str) -> str:
    """'/job:localhost/replica:0/task:0/device:CPU:2' and '/device:CPU:2' -> 'CPU:2'."""
    return device.rsplit("device:", 1)[-1]


def test_a_failing_stage_stops_training_with_its_error_and_no_hang():
    x, y = regression_data(64, 0)
    probe = skip_model(0)
    plans = [even_plan(probe, DEVICES[0:1], n_m=1), even_plan(probe, DEVICES[1:2], n_m=1)]
    strategy = HetPipeStrategy(plan=plans, clock_distance=0)
    with strategy.scope():
        model = skip_model(0)
        model.compile(keras.optimizers.SGD(LR), "mse")
    model.fit(x[:16], y[:16], batch_size=BATCH, epochs=1, verbose=0)   # builds the VWs
    stage = strategy.pipeline(model, 1).stages[0]

    def broken(*args, **kwargs):
        raise RuntimeError("device lost")

    # VW 1's only stage fails from now on (its task, with or without its update inside).
    stage.forward_backward = broken
    strategy.pipeline(model, 1).versions.stages[0].apply_in_task = broken
    with pytest.raises(Exception, match="device lost"):
        model.fit(x, y, batch_size=BATCH, epochs=1, verbose=0)
    # VW 0 stops waiting for the waves VW 1 will never push: all it took completes.
    vw0 = strategy.pipeline(model, 0)
    deadline = time.monotonic() + 30
    while vw0.completed < vw0.submitted and time.monotonic() < deadline:
        time.sleep(0.05)
    assert vw0.completed == vw0.submitted
    strategy.close()


def _full_waves_joined(rt, n_m: int) -> bool:
    """Every full wave of VW `rt`'s runs but each run's last ran in one call: at least
    N_m - 1 of each such wave's minibatches joined its first's call."""
    ends = [*list(rt.run_starts)[1:], rt.completed + 1]
    full = sum(max((end - start) // n_m - 1, 0) for start, end in zip(rt.run_starts, ends))
    return rt.joined >= full * (n_m - 1)


def test_a_waves_minibatches_joined_in_one_call_still_equal_the_reference():
    """One-stage VWs with their own metric state run a wave in one call: the stage waits
    until the rest of p's wave is queued and runs it in p's call
    (`PipelineRuntime._wave_rest`, `_take_queued`). The records still obey the local rule
    exactly and WSP's bound, and w_global equals the reference rebuilt from them."""
    n_m, d = 3, 1
    strategy, model, w0, batches = _fit(n_m, d, 1, n=144)
    coord = strategy.coordinator(model)
    assert all(rt._per_vw_metrics for rt in coord.runtimes)
    assert all(_full_waves_joined(rt, n_m) for rt in coord.runtimes), [
        (rt.joined, rt.completed) for rt in coord.runtimes]
    _assert_records_and_reference(strategy, model, w0, batches, n_m, d)


def test_a_stage_waits_for_its_wave_when_kerass_step_is_slower_and_a_run_ends_mid_wave():
    """Keras' step slower than the stage (a batch callback that sleeps): each stage still
    runs its waves in one call each, waiting for the rest of a wave rather than running
    what it has; a run whose last wave is short (13 batches, 2 VWs, N_m = 3) ends: the
    drain lets the stage run the short wave one call a minibatch. The results equal the
    reference."""
    n_m, d = 3, 1
    slow_step = keras.callbacks.LambdaCallback(
        on_train_batch_end=lambda batch, logs: time.sleep(0.02))
    x, y = regression_data(13 * BATCH, 0)
    probe = skip_model(0)
    strategy = HetPipeStrategy(plan=[even_plan(probe, DEVICES[0:1], n_m=n_m),
                                     even_plan(probe, DEVICES[1:2], n_m=n_m)],
                               clock_distance=d, compensation="none")
    with strategy.scope():
        model = skip_model(0)
        model.compile(keras.optimizers.SGD(LR), "mse")
    w0 = model.get_weights()
    model.fit(x, y, batch_size=BATCH, epochs=1, shuffle=False, verbose=0,
              callbacks=[slow_step])
    batches = [(x[i:i + BATCH], y[i:i + BATCH]) for i in range(0, len(x), BATCH)]
    coord = strategy.coordinator(model)
    assert sum(rt.completed for rt in coord.runtimes) == 13
    assert all(rt._per_vw_metrics and _full_waves_joined(rt, n_m) and rt.joined
               for rt in coord.runtimes), [(rt.joined, rt.completed) for rt in coord.runtimes]
    _assert_records_and_reference(strategy, model, w0, batches, n_m, d)
