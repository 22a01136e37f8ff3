"""Split batches over virtual workers under WSP (ps/split.py), trained by model.fit.

References, computed by hand with plain Keras on one model:
- N_m = 1, D = 0, SGD: each wave equals ONE SGD step on the whole batch (and the logged
  loss equals the whole batches' loss), remainder batch included;
- D > 0, pipelined VWs: w_global rebuilt from the records, each VW's update being
  -lr x n_k / N x the gradient of its share at the version the records say it used; the
  records obey the local rule and WSP's global bound.
"""

import keras
import numpy as np
import pytest
import tensorflow as tf

from hetpipe_tf.cluster.spec import Cluster
from hetpipe_tf.core import wsp
from hetpipe_tf.ps.split import SplitCoordinator
from hetpipe_tf.strategy import HetPipeStrategy, even_plan
from tests.strategy.helpers import (DEVICES, assert_weights_close, regression_data,
                                    skip_model)

BATCH, LR = 8, 0.05


def _fit(n_m, d, stages, slow, n, epochs=1, shares=None):
    x, y = regression_data(n, 0)
    probe = skip_model(0)
    plans = [even_plan(probe, DEVICES[0:stages], n_m=n_m),
             even_plan(probe, DEVICES[stages:2 * stages], n_m=n_m,
                       speed_factors=[slow] * stages)]
    strategy = HetPipeStrategy(plan=plans, clock_distance=d, data_parallel="wsp_split",
                               shares=shares, compensation="none")   # the paper's rules
    with strategy.scope():
        model = skip_model(0)
        model.compile(keras.optimizers.SGD(LR), "mse", metrics=["mae"])
    w0 = model.get_weights()
    hist = model.fit(x, y, batch_size=BATCH, epochs=epochs, shuffle=False, verbose=0)
    batches = [(x[i:i + BATCH], y[i:i + BATCH]) for i in range(0, n, BATCH)] * epochs
    return strategy, model, w0, batches, hist


def _grad(probe, weights, batch):
    probe.set_weights(weights)
    x, y = batch
    with tf.GradientTape() as tape:
        loss = keras.losses.MeanSquaredError()(y, probe(x, training=True))
    return [g.numpy() for g in tape.gradient(loss, probe.trainable_variables)], float(loss)


def _share(coord, batches, step, v):
    sizes = coord.splits[step]
    a = sum(sizes[:v])
    x, y = batches[step]
    return (x[a:a + sizes[v]], y[a:a + sizes[v]]), sizes[v] / len(x)


def test_d0_n_m_1_split_is_one_sgd_step_on_the_whole_batch_and_logs_its_metrics():
    # 90 rows: the epoch's last batch has 2 rows, split [1, 1].
    strategy, model, w0, batches, hist = _fit(1, 0, 1, 0.5, 90, epochs=2)
    coord = strategy.coordinator(model)
    assert isinstance(coord, SplitCoordinator)
    assert coord.shares.sizes[0] > coord.shares.sizes[1]   # the faster VW's share is larger
    assert sum(coord.shares.sizes) == BATCH
    assert coord.splits[11] == (1, 1)
    # Every VW took a share of every batch.
    assert [list(a) for a in coord.assignment] == [list(range(len(batches)))] * 2
    probe = skip_model(0)
    w = [a.copy() for a in w0]
    per_epoch = len(batches) // 2
    losses, errors = [], []
    for step, batch in enumerate(batches):
        g, loss = _grad(probe, w, batch)
        losses.append((loss, len(batch[0])))
        errors.append(np.abs(batch[1] - probe(batch[0]).numpy()))
        w = [a - LR * b for a, b in zip(w, g)]
    assert_weights_close(model.get_weights(), w)
    for e in range(2):
        part = losses[e * per_epoch:(e + 1) * per_epoch]
        ref = sum(l * m for l, m in part) / sum(m for _, m in part)
        np.testing.assert_allclose(hist.history["loss"][e], ref, rtol=1e-4)
        mae = np.concatenate(errors[e * per_epoch:(e + 1) * per_epoch]).mean()
        np.testing.assert_allclose(hist.history["mae"][e], mae, rtol=1e-4)
    assert coord.servers.max_clock_distance <= 1
    strategy.close()


@pytest.mark.parametrize("n_m,d,stages,slow,n,shares", [(2, 1, 2, 0.5, 92, None),
                                                        (1, 2, 1, 0.3, 64, [6, 2])])
def test_d_above_0_equals_the_reference_rebuilt_from_records(n_m, d, stages, slow, n,
                                                              shares):
    strategy, model, w0, batches, _ = _fit(n_m, d, stages, slow, n, shares=shares)
    coord = strategy.coordinator(model)
    if shares is not None:
        assert coord.shares.sizes == tuple(shares)
    probe = skip_model(0)
    updates = {}

    def version(v, p):
        w = [a.copy() for a in w0]
        for other, waves in enumerate(coord.syncs[v].record[p]):
            if other != v:
                for k in range(1, min(waves * n_m, len(coord.assignment[other])) + 1):
                    w = [a + b for a, b in zip(w, update(other, k))]
        for k in strategy.pipeline(model, v).record[p]:
            w = [a + b for a, b in zip(w, update(v, k))]
        return w

    def update(v, p):
        if (v, p) not in updates:
            share, scale = _share(coord, batches, coord.assignment[v][p - 1], v)
            g, _ = _grad(probe, version(v, p), share)
            updates[(v, p)] = [-LR * scale * a for a in g]
        return updates[(v, p)]

    final = [a.copy() for a in w0]
    for v in range(2):
        rt, sync = strategy.pipeline(model, v), coord.syncs[v]
        assert len(coord.assignment[v]) == len(batches)
        for p in range(1, len(batches) + 1):
            assert rt.record[p] == tuple(range(1, max(0, p - n_m) + 1))
            need = wsp.required_global_wave(p, n_m, d)
            if need is not None:
                assert min(sync.record[p]) > need, (v, p, sync.record[p], need)
            final = [a + b for a, b in zip(final, update(v, p))]
    assert coord.servers.max_clock_distance <= d + 1
    assert_weights_close(model.get_weights(), final)
    strategy.close()


def test_hetseq_with_clock_distance_trains_one_device_vws_on_split_batches(capsys):
    cluster = Cluster.local(["LOCAL_CPU"] * 2, emulated_speed_factors=[1, 0.5])
    strategy = HetPipeStrategy(cluster, data_parallel="hetseq", clock_distance=1)
    with strategy.scope():
        model = skip_model(0)
        model.compile(keras.optimizers.SGD(LR), "mse")
    x, y = regression_data(40, 0)
    model.fit(x, y, batch_size=16, epochs=1, shuffle=False, verbose=0)
    coord = strategy.coordinator(model)
    assert isinstance(coord, SplitCoordinator)
    assert [p.num_stages for p in strategy.extended.plans] == [1, 1]
    sizes = coord.shares.sizes
    assert sum(sizes) == 16 and sizes[0] > sizes[1]   # the emulated 0.5x device takes less
    assert coord.splits[-1] == coord.shares.split(8, minimum=1)
    out = capsys.readouterr().out
    assert "Split batches" in out and f"{sizes[0]:5}" in out
    assert coord.servers.max_clock_distance <= 2
    assert all(np.isfinite(w).all() for w in model.get_weights())
    strategy.close()


def test_split_batches_bad_input_is_refused():
    probe = skip_model(0)
    plans = [even_plan(probe, DEVICES[0:1], n_m=1), even_plan(probe, DEVICES[1:2], n_m=1)]
    strategy = HetPipeStrategy(plan=plans, data_parallel="wsp_split", shares=[4, 2, 2])
    with strategy.scope():
        model = skip_model(0)
        model.compile(keras.optimizers.SGD(LR), "mse")
    x, y = regression_data(16, 0)
    with pytest.raises(ValueError, match=r"one share per virtual worker.*shares=\[4, 2, 2\]"):
        model.fit(x, y, batch_size=BATCH, epochs=1, verbose=0)
    strategy.close()
    strategy = HetPipeStrategy(plan=plans, data_parallel="wsp_split", shares=[4, 2])
    with strategy.scope():
        model = skip_model(0)
        model.compile(keras.optimizers.SGD(LR), "mse")
    with pytest.raises(ValueError, match=r"do not sum.*batch_size=8"):
        model.fit(x, y, batch_size=BATCH, epochs=1, verbose=0)
    strategy.close()


def test_pipelined_vws_of_an_allocation_get_shares_by_their_plans_throughput(capsys):
    # NP over 2 hosts: VW 0 = the fast host's 2 devices, VW 1 = the slow host's 2 (0.5x).
    cluster = Cluster.local(["LOCAL_CPU"] * 4, hosts=2, emulated_speed_factors=[1, 1, .5, .5])
    strategy = HetPipeStrategy(cluster, allocation="NP", data_parallel="wsp_split",
                               clock_distance=1)
    with strategy.scope():
        model = skip_model(0)
        model.compile(keras.optimizers.SGD(LR), "mse")
    x, y = regression_data(48, 0)
    model.fit(x, y, batch_size=16, epochs=1, shuffle=False, verbose=0)
    coord = strategy.coordinator(model)
    assert isinstance(coord, SplitCoordinator)
    assert [p.num_stages for p in strategy.extended.plans] == [2, 2]
    pace = [p.predicted_stage_time_s for p in strategy.extended.plans]
    assert pace[0] < pace[1]
    sizes = coord.shares.sizes
    assert sum(sizes) == 16 and sizes[0] > sizes[1]
    assert coord.splits == [sizes] * 3
    out = capsys.readouterr().out
    assert "Split batches" in out and "samples/s with split batches against" in out
    assert coord.servers.max_clock_distance <= 2
    assert all(np.isfinite(w).all() for w in model.get_weights())
    strategy.close()


def test_the_default_dispatch_says_what_split_batches_would_predict(caplog):
    # Two one-stage VWs, one at 0.5x: a sample costs 1 and 2; whole batches of 8 run at
    # the slow VW's pace (2 x 8 / 16 = 1 sample a unit), split [6, 2] at 8 / 6.
    probe = skip_model(0)
    plans = [even_plan(probe, DEVICES[0:1], n_m=1),
             even_plan(probe, DEVICES[1:2], n_m=1, speed_factors=[0.5])]
    strategy = HetPipeStrategy(plan=plans)
    with strategy.scope():
        model = skip_model(0)
        model.compile(keras.optimizers.SGD(LR), "mse")
    x, y = regression_data(16, 0)
    with caplog.at_level("INFO", logger="hetpipe_tf.strategy.build"):
        model.fit(x, y, batch_size=BATCH, epochs=1, verbose=0)
    note = next(r.getMessage() for r in caplog.records if "wsp_split" in r.getMessage())
    assert "shares [6, 2]" in note and ": 1.33x." in note, note
    assert not isinstance(strategy.coordinator(model), SplitCoordinator)
    strategy.close()
