"""Staleness compensation through model.fit (strategy/compensation.py, docs/convergence.md).

PREDICT equals an independent reference of weight prediction under the local staleness
rule; MOMENTUM equals the staleness reference with the reduced momentum while the model's
optimizer keeps the user's; BOTH is the default where staleness can exist (NONE, the
paper's rules, is checked by the existing references, which ask for it by name).
"""

import keras
import numpy as np
import pytest
import tensorflow as tf

from hetpipe_tf.strategy import HetPipeStrategy, even_plan
from hetpipe_tf.strategy.compensation import (Compensation, implied_staleness,
                                              optimizer_adjustment, predictor_factory,
                                              reduced_momentum)
from tests.strategy.helpers import (DEVICES, assert_weights_close, regression_data,
                                    skip_model, staleness_reference)

BATCH, EPOCHS, N = 8, 2, 64


def test_reduced_momentum_compounds_to_the_users():
    assert reduced_momentum(0.9, 0) == 0.9
    assert reduced_momentum(0.9, 1) == pytest.approx(0.8)
    assert reduced_momentum(0.9, 3) == pytest.approx(0.6)
    assert reduced_momentum(0.9, 20) == 0.0
    # (1 - 0.8) = (1 - 0.9) * 2: the implied momentum of one late update is 1/2.
    assert optimizer_adjustment(Compensation.MOMENTUM, 1) is None
    assert optimizer_adjustment(Compensation.PREDICT, 3) is None


def test_staleness_counts_local_and_the_other_vws_waves():
    assert implied_staleness(1) == 0
    assert implied_staleness(None, num_vws=3) == 0   # no pipeline (HetSeq mode)
    assert implied_staleness(1, num_vws=4, clock_distance=0) == 0   # synchronous DP
    assert implied_staleness(1, num_vws=4, clock_distance=2) == 3   # M async workers
    assert implied_staleness(2) == 1
    assert implied_staleness(2, num_vws=2, clock_distance=0) == 3
    assert optimizer_adjustment(Compensation.MOMENTUM, 1, 4, 0) is None
    assert optimizer_adjustment(Compensation.BOTH, 2) is not None
    assert predictor_factory(Compensation.PREDICT, 1, 2)(DEVICES[0]) is None
    assert predictor_factory(Compensation.BOTH, 2, 3)(DEVICES[0]).scale == 3.0
    assert predictor_factory(Compensation.MOMENTUM, 2)(DEVICES[0]) is None


def _fit(n_m, stages, make_opt, compensation, seed=0):
    x, y = regression_data(N, seed)
    strategy = HetPipeStrategy(plan=lambda m: even_plan(m, DEVICES[:stages], n_m=n_m),
                               compensation=compensation)
    with strategy.scope():
        model = skip_model(seed)
        model.compile(make_opt(), "mse")
    w0 = model.get_weights()
    model.fit(x, y, batch_size=BATCH, epochs=EPOCHS, shuffle=False, verbose=0)
    batches = [(x[i:i + BATCH], y[i:i + BATCH]) for i in range(0, N, BATCH)] * EPOCHS
    return strategy, model, w0, batches


def prediction_reference(weights0, make_opt, batches, n_m, runs):
    """Local staleness with weight prediction, written independently: minibatch p's
    gradient is taken at W[v] + (p - 1 - v) * gate * (W[v] - W[v - 1]) (v = the last update
    its version reflects, W[q] = the weights after update q; per tensor, gate = 1 where
    that step was predicted by the step before with at most half the squared error of no
    prediction, else 0; no look-ahead from a version taken at a run's start, where d
    restarts from zero) and applied to the newest weights."""
    live, probe = skip_model(0), skip_model(0)
    live.set_weights(weights0)
    opt = make_opt()
    opt.build(live.trainable_variables)
    loss_fn = keras.losses.MeanSquaredError()
    after = {0: [w.copy() for w in live.get_weights()]}
    run_last = 0
    for p, (x, y) in enumerate(batches, start=1):
        if p in runs:
            run_last = p - 1
        v = max(run_last, p - n_m)
        def step(q):
            return ([a - b for a, b in zip(after[q], after[q - 1])] if q > run_last
                    else [np.zeros_like(a) for a in after[0]])
        u, before = step(v), step(v - 1)
        gate = [2 * np.sum((x - y) ** 2) < np.sum(x ** 2) for x, y in zip(u, before)]
        probe.set_weights([a + (p - 1 - v) * g * d for a, d, g in zip(after[v], u, gate)])
        with tf.GradientTape() as tape:
            loss = loss_fn(y, probe(x, training=True))
        grads = tape.gradient(loss, probe.trainable_variables)
        opt.apply_gradients(zip(grads, live.trainable_variables))
        after[p] = [w.copy() for w in live.get_weights()]
    return live.get_weights()


@pytest.mark.parametrize("n_m,stages,opt", [
    (2, 2, lambda: keras.optimizers.SGD(0.05, momentum=0.9)),
    (3, 3, lambda: keras.optimizers.Adam(0.01)),
    (2, 2, lambda: keras.optimizers.AdamW(0.01, weight_decay=0.05)),
], ids=["momentum_nm2", "adam_nm3", "adamw_nm2"])
def test_predict_equals_the_prediction_reference(n_m, stages, opt):
    strategy, model, w0, batches = _fit(n_m, stages, opt, Compensation.PREDICT)
    runs = set(strategy.pipeline(model).run_starts)
    assert_weights_close(model.get_weights(),
                         prediction_reference(w0, opt, batches, n_m, runs), atol=2e-5)
    # ...and prediction changed training (against the plain staleness rule).
    plain, _ = staleness_reference(lambda: skip_model(0), w0, opt, batches, n_m, runs)
    assert max(np.abs(a - b).max() for a, b in zip(model.get_weights(), plain)) > 1e-3
    strategy.close()


def test_momentum_equals_the_staleness_reference_with_reduced_momentum():
    user = lambda: keras.optimizers.SGD(0.05, momentum=0.9)  # noqa: E731
    strategy, model, w0, batches = _fit(2, 2, user, "momentum")
    runs = set(strategy.pipeline(model).run_starts)
    ref, _ = staleness_reference(lambda: skip_model(0), w0,
                                 lambda: keras.optimizers.SGD(0.05, momentum=0.8), batches,
                                 2, runs)
    assert_weights_close(model.get_weights(), ref)
    assert model.optimizer.momentum == 0.9   # the model's optimizer: the user's setting
    strategy.close()


def test_adam_beta_1_is_reduced_on_the_stages_only():
    strategy, model, _, _ = _fit(3, 2, lambda: keras.optimizers.Adam(0.01), "momentum")
    stage_opts = [s.optimizer for s in strategy.pipeline(model).versions.stages]
    assert [o.beta_1 for o in stage_opts] == [pytest.approx(0.7)] * 2
    assert model.optimizer.beta_1 == 0.9
    strategy.close()


def test_two_virtual_workers_train_with_each_compensation():
    """Several VWs under WSP (D = 1): every compensation trains (finite, changes weights)."""
    x, y = regression_data(N, 0)
    for c in (Compensation.PREDICT, Compensation.MOMENTUM, Compensation.BOTH,
              Compensation.BOTH_DC, Compensation.BOTH_GA):
        strategy = HetPipeStrategy(
            plan=[even_plan(skip_model(0), DEVICES[w * 2:w * 2 + 2], n_m=2)
                  for w in range(2)], clock_distance=1, compensation=c)
        with strategy.scope():
            model = skip_model(0)
            model.compile(keras.optimizers.SGD(0.005, momentum=0.9), "mse")
        w0 = model.get_weights()
        hist = model.fit(x, y, batch_size=BATCH, epochs=2, shuffle=False, verbose=0)
        assert np.isfinite(hist.history["loss"]).all()
        assert hist.history["loss"][-1] < hist.history["loss"][0]
        assert max(np.abs(a - b).max() for a, b in zip(model.get_weights(), w0)) > 1e-3
        strategy.close()


@pytest.mark.parametrize("compensation", ["both_dc", "both_ga"])
def test_corrected_gradients_with_adam(compensation):
    """BOTH_DC / BOTH_GA: the stages' predictors are delay-compensating / gap-aware
    (pipeline/delay_compensation.py and gap_aware.py hold the reference tests of the rules),
    beta_1 is reduced, and training differs from BOTH's (the correction is applied)."""
    from hetpipe_tf.pipeline.delay_compensation import DelayCompensatedPredictor
    from hetpipe_tf.pipeline.gap_aware import GapAwarePredictor

    kind = GapAwarePredictor if compensation == "both_ga" else DelayCompensatedPredictor
    adam = lambda: keras.optimizers.Adam(0.01)  # noqa: E731
    strategy, model, _, _ = _fit(2, 2, adam, compensation)
    stages = strategy.pipeline(model).versions.stages
    assert all(type(s.predictor) is kind for s in stages)
    assert [s.optimizer.beta_1 for s in stages] == [pytest.approx(0.8)] * 2
    dc = model.get_weights()
    assert all(np.isfinite(w).all() for w in dc)
    strategy.close()
    strategy, model, _, _ = _fit(2, 2, adam, "both")
    assert max(np.abs(a - b).max() for a, b in zip(model.get_weights(), dc)) > 1e-4
    strategy.close()


def test_bad_compensation_is_refused_before_training():
    with pytest.raises(ValueError, match="compensation="):
        HetPipeStrategy(plan=even_plan(skip_model(0), DEVICES[:1], n_m=1),
                        compensation="weight-prediction")


def test_the_default_is_both_and_named_in_the_log_where_it_acts(caplog):
    """No compensation given: BOTH, with a log line naming it and the ways to the paper's
    rules and to the user's momentum; the stage optimizers' momentum is lowered, the
    model's kept; nothing is logged where nothing is stale (N_m = 1, one VW)."""
    x, y = regression_data(N, 3)
    for n_m, logged in ((2, True), (1, False)):
        strategy = HetPipeStrategy(plan=even_plan(skip_model(0), DEVICES[:2], n_m=n_m))
        assert strategy.extended.compensation == Compensation.BOTH
        with strategy.scope():
            model = skip_model(0)
            model.compile(keras.optimizers.SGD(0.05, momentum=0.9), "mse")
        caplog.clear()
        with caplog.at_level("INFO", logger="hetpipe_tf.strategy.compensation"):
            model.fit(x, y, batch_size=BATCH, epochs=1, shuffle=False, verbose=0)
        text = caplog.text
        assert ("Staleness compensation BOTH (the default)" in text) is logged, text
        stages = strategy.pipeline(model).versions.stages
        if logged:
            assert 'compensation="none"' in text and "N_m=2" in text and '"predict"' in text
            assert all(s.predictor is not None and s.predictor.predicted > 0 for s in stages)
        # s = N_m - 1: 0.9 -> 0.8 on the stages at N_m = 2; untouched at N_m = 1.
        assert [s.optimizer.momentum for s in stages] == [pytest.approx(
            0.8 if logged else 0.9)] * 2
        assert model.optimizer.momentum == pytest.approx(0.9)
        strategy.close()


def test_hetseq_defaults_to_none_and_still_refuses_a_compensation_by_name():
    from hetpipe_tf.cluster.spec import Cluster
    cluster = Cluster.local(["LOCAL_CPU"] * 2)
    strategy = HetPipeStrategy(cluster, data_parallel="hetseq")
    assert strategy.extended.compensation == Compensation.NONE
    with pytest.raises(ValueError, match="compensation='both'"):
        HetPipeStrategy(cluster, data_parallel="hetseq", compensation="both")
