"""Training semantics of one virtual worker under model.fit (Section 4).

N_m = 1 equals plain Keras training on one device; N_m > 1 equals an independent reference
of the local staleness rule (tests/strategy/helpers.py); the runtime's per-minibatch record
and its task trace obey the rules of hetpipe_tf.core.schedule.
"""

import keras
import numpy as np
import pytest

from hetpipe_tf.core import schedule
from hetpipe_tf.strategy import HetPipeStrategy, even_plan
from tests.strategy.helpers import (DEVICES, assert_weights_close, regression_data,
                                    skip_model, staleness_reference)

OPTIMIZERS = {
    "sgd": lambda: keras.optimizers.SGD(0.05),
    "adam": lambda: keras.optimizers.Adam(0.01),
}
BATCH, EPOCHS = 8, 2


def _train(n_m, num_stages, opt, seed=0):
    x, y = regression_data(64, seed)
    strategy = HetPipeStrategy(plan=lambda m: even_plan(m, DEVICES[:num_stages], n_m=n_m),
                               compensation="none")   # the paper's rule: the reference
    with strategy.scope():
        model = skip_model(seed)
        model.compile(OPTIMIZERS[opt](), "mse")
    w0 = model.get_weights()
    hist = model.fit(x, y, batch_size=BATCH, epochs=EPOCHS, shuffle=False, verbose=0)
    return strategy, model, w0, hist, (x, y)


@pytest.mark.parametrize("opt", ["sgd", "adam"])
def test_n_m_1_equals_plain_keras_on_one_device(opt):
    strategy, model, w0, hist, (x, y) = _train(1, 3, opt)
    ref = skip_model(0)
    ref.set_weights(w0)
    ref.compile(OPTIMIZERS[opt](), "mse")
    ref_hist = ref.fit(x, y, batch_size=BATCH, epochs=EPOCHS, shuffle=False, verbose=0)
    assert_weights_close(model.get_weights(), ref.get_weights())
    np.testing.assert_allclose(hist.history["loss"], ref_hist.history["loss"], rtol=1e-5)
    # Adam's counter advanced once per minibatch, as in plain Keras.
    assert int(model.optimizer.iterations.numpy()) == EPOCHS * 64 // BATCH
    strategy.close()


@pytest.mark.parametrize("n_m,num_stages,opt", [(2, 2, "sgd"), (3, 3, "adam"), (2, 1, "sgd")])
def test_n_m_above_1_equals_staleness_reference(n_m, num_stages, opt):
    strategy, model, w0, _, (x, y) = _train(n_m, num_stages, opt)
    steps = 64 // BATCH
    batches = [(x[i:i + BATCH], y[i:i + BATCH]) for i in range(0, 64, BATCH)] * EPOCHS
    runtime = strategy.pipeline(model)
    # The pipeline drains at each epoch end: one run per epoch.
    assert runtime.run_starts == [1 + e * steps for e in range(EPOCHS)]
    ref_w, ref_record = staleness_reference(lambda: skip_model(0), w0, OPTIMIZERS[opt],
                                            batches, n_m, set(runtime.run_starts))
    assert_weights_close(model.get_weights(), ref_w)
    # The record of which updates each minibatch's weights reflected equals the rule.
    record = runtime.record
    assert sorted(record) == list(range(1, EPOCHS * steps + 1))
    for p, updates in record.items():
        run_start = max(s for s in runtime.run_starts if s <= p)
        assert updates == schedule.reflected_updates(p, n_m, run_start)
        assert len(updates) == ref_record[p]
    # The runtime's task trace obeys the Section 4 scheduling rules.
    order = schedule.per_stage_order(
        schedule.Event(e.task, e.start, e.start, e.end) for e in runtime.trace)
    schedule.check_trace(order, num_stages, n_m, runtime.completions)
    assert len(runtime.trace) == EPOCHS * steps * (2 * num_stages - 1)
    # One timed update per minibatch (the work outside the task spans, for the simulator).
    assert len(runtime.update_s) == EPOCHS * steps and min(runtime.update_s) > 0
    strategy.close()


def test_staleness_really_changes_training():
    """Guard against a vacuous reference: N_m = 3 differs from sequential training."""
    strategy, model, w0, _, (x, y) = _train(3, 2, "sgd")
    batches = [(x[i:i + BATCH], y[i:i + BATCH]) for i in range(0, 64, BATCH)] * EPOCHS
    seq_w, _ = staleness_reference(lambda: skip_model(0), w0, OPTIMIZERS["sgd"], batches, 1,
                                   {1})
    assert max(np.abs(a - b).max() for a, b in zip(model.get_weights(), seq_w)) > 1e-3
    strategy.close()
