"""Batches of any size (issue 19 point 1): an epoch's smaller last batch, validation_split,
Python generators, `keras.utils.PyDataset` and tf.data datasets with an open batch
dimension train like plain Keras; the plan is made for the largest batch and a larger one
is refused by name. Several VWs with a remainder: tests/strategy/test_virtual_workers.py."""

import keras
import numpy as np
import pytest
import tensorflow as tf

from hetpipe_tf.strategy import HetPipeStrategy, even_plan
from tests.strategy.helpers import (DEVICES, assert_weights_close, regression_data,
                                    skip_model, staleness_reference)

N, BATCH = 83, 16   # 83 rows: a remainder in training (66 rows) and in validation (17)


def _strategy(stages: int, n_m: int = 1, in_graph: bool = True) -> HetPipeStrategy:
    return HetPipeStrategy(plan=even_plan(skip_model(0), DEVICES[:stages], n_m=n_m),
                           in_graph=in_graph, compensation="none")   # the references


def _compiled(strategy=None, lr=0.05):
    def make():
        model = skip_model(0)
        model.compile(keras.optimizers.SGD(lr, momentum=0.5), "mse", metrics=["mae"])
        return model
    if strategy is None:
        return make()
    with strategy.scope():
        return make()


@pytest.mark.parametrize("stages,in_graph", [(1, True), (1, False), (2, True)])
def test_remainder_and_validation_split_equal_plain_keras(stages, in_graph):
    x, y = regression_data(N, 1)
    kw = dict(batch_size=BATCH, epochs=2, shuffle=False, verbose=0, validation_split=0.2)
    ref = _compiled()
    ref_hist = ref.fit(x, y, **kw).history
    model = _compiled(_strategy(stages, in_graph=in_graph))
    hist = model.fit(x, y, **kw).history
    assert_weights_close(model.get_weights(), ref.get_weights())
    for key, values in ref_hist.items():
        np.testing.assert_allclose(hist[key], values, rtol=1e-5, err_msg=key)


def test_n_m_2_with_a_remainder_equals_the_staleness_reference():
    x, y = regression_data(60, 2)   # batches of 8: seven full, one of 4
    model = _compiled(_strategy(2, n_m=2), lr=0.05)
    w0 = model.get_weights()
    model.fit(x, y, batch_size=8, epochs=1, shuffle=False, verbose=0)
    batches = [(x[i:i + 8], y[i:i + 8]) for i in range(0, 60, 8)]
    ref, _ = staleness_reference(lambda: skip_model(0), w0,
                                 lambda: keras.optimizers.SGD(0.05, momentum=0.5),
                                 batches, n_m=2, runs={1})
    assert_weights_close(model.get_weights(), ref)


class _Rows(keras.utils.PyDataset):
    def __init__(self, x, y, batch):
        super().__init__()
        self.x, self.y, self.batch = x, y, batch

    def __len__(self):
        return -(-len(self.x) // self.batch)

    def __getitem__(self, i):
        s = slice(i * self.batch, (i + 1) * self.batch)
        return self.x[s], self.y[s]


def _inputs(kind: str, x, y):
    if kind == "generator":
        def rows():
            for i in range(0, len(x), BATCH):
                yield x[i:i + BATCH], y[i:i + BATCH]
        return rows()
    if kind == "pydataset":
        return _Rows(x, y, BATCH)
    return tf.data.Dataset.from_tensor_slices((x, y)).batch(BATCH)   # open batch dimension


@pytest.mark.parametrize("kind", ["generator", "pydataset", "dataset"])
def test_generators_pydatasets_and_open_batch_datasets_equal_plain_keras(kind):
    x, y = regression_data(N, 3)
    ref = _compiled()
    ref.fit(_inputs(kind, x, y), epochs=1, verbose=0, shuffle=False)
    model = _compiled(_strategy(2))
    model.fit(_inputs(kind, x, y), epochs=1, verbose=0, shuffle=False)
    assert_weights_close(model.get_weights(), ref.get_weights())


def test_a_batch_larger_than_planned_is_refused_by_name():
    x, y = regression_data(64, 4)
    model = _compiled(_strategy(2))
    model.fit(x, y, batch_size=16, epochs=1, verbose=0)
    before = model.get_weights()
    with pytest.raises(ValueError, match=r"larger than the batch size .* planned for 16"):
        model.fit(x, y, batch_size=32, epochs=1, verbose=0)
    assert_weights_close(model.get_weights(), before)   # nothing trained

    def growing():   # open batch dimension: the larger batch is found when it arrives
        yield x[:16], y[:16]
        yield x[:16], y[:16]
        yield x[:32], y[:32]
    with pytest.raises(ValueError, match=r"Received: batch size 32, planned for 16"):
        model.fit(growing(), epochs=1, verbose=0)
