"""train_on_batch returns its own batch's logs and every call after it (test_on_batch,
evaluate, predict, get_weights, callbacks) sees that batch applied and metrics holding
only its own batches (issue 19 point 1), equal to plain Keras: N_m = 2, one VW of two
stages and two VWs of two stages (one minibatch per run: sequential training)."""

import keras
import numpy as np
import pytest

from hetpipe_tf.strategy import HetPipeStrategy, even_plan
from tests.strategy.helpers import DEVICES, assert_weights_close, regression_data, skip_model


def _model(strategy=None):
    def make():
        model = skip_model(0)
        model.compile(keras.optimizers.SGD(0.05, momentum=0.9), "mse", metrics=["mae"])
        return model
    if strategy is None:
        return make()
    with strategy.scope():
        return make()


def _strategy(vws: int) -> HetPipeStrategy:
    plans = [even_plan(skip_model(0), DEVICES[2 * v:2 * v + 2], n_m=2) for v in range(vws)]
    # The default compensation (BOTH) lowers the stages' momentum for the configured N_m,
    # also in these one-minibatch runs (docs/convergence.md "The defaults"): compared with
    # plain Keras, none.
    return HetPipeStrategy(plan=plans if vws > 1 else plans[0], compensation="none")


def _sequence(model, x, y, rounds=8):
    out = []
    for i in range(rounds):
        s = slice(8 * i, 8 * i + 8)
        out += model.train_on_batch(x[s], y[s])
        out += list(model.train_on_batch(x[s], y[s], return_dict=True).values())
        out += model.test_on_batch(x[:16], y[:16])
        out += model.evaluate(x[:16], y[:16], batch_size=8, verbose=0)
        out.append(float(np.sum(model.predict_on_batch(x[:4]))))
        out.append(float(np.sum(model.predict(x[:4], verbose=0))))
    return np.array(out, dtype="float64"), model.get_weights()


@pytest.mark.parametrize("vws", [1, 2])
def test_on_batch_sequence_equals_plain_keras(vws):
    x, y = regression_data(64, 5)
    ref, ref_w = _sequence(_model(), x, y)
    strategy = _strategy(vws)
    got, got_w = _sequence(_model(strategy), x, y)
    np.testing.assert_allclose(got, ref, rtol=1e-5, atol=1e-6)
    assert_weights_close(got_w, ref_w)
    strategy.close()


class _EvaluateAt(keras.callbacks.Callback):
    def __init__(self, x, y, at):
        super().__init__()
        self.x, self.y, self.at, self.seen = x, y, at, []

    def on_train_batch_end(self, batch, logs=None):
        if batch in self.at:
            loss = self.model.evaluate(self.x, self.y, batch_size=8, verbose=0)[0]
            self.seen.append((loss, self.model.get_weights()))


@pytest.mark.parametrize("vws", [1, 2])
def test_evaluate_from_a_batch_callback_sees_the_weights_it_returns(vws):
    x, y = regression_data(64, 6)
    strategy = _strategy(vws)
    model = _model(strategy)
    probe = skip_model(0)
    probe.compile(loss="mse")
    callback = _EvaluateAt(x[:16], y[:16], at={2, 5})
    model.fit(x, y, batch_size=8, epochs=1, shuffle=False, verbose=0, callbacks=[callback])
    assert len(callback.seen) == 2
    for loss, weights in callback.seen:
        probe.set_weights(weights)
        expected = probe.evaluate(x[:16], y[:16], batch_size=8, verbose=0)
        np.testing.assert_allclose(loss, expected, rtol=1e-5)
    strategy.close()
