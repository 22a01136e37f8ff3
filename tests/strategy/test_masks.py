"""Keras masks (Embedding(mask_zero=True), Masking) train as in plain Keras however the model
is cut: the mask crosses a stage boundary with its tensor, the loss and the metrics weigh
the masked steps out (pipeline/program.py, docs/strategy.md "Keras masks")."""

import keras
import numpy as np
import pytest

from hetpipe_tf.cluster.spec import Cluster
from hetpipe_tf.partitioner.layer_graph import LayerGraph, TensorRef
from hetpipe_tf.core.sync_schedule import Schedule
from hetpipe_tf.strategy import HetPipeStrategy, even_plan, manual_plan
from tests.strategy.helpers import DEVICES, assert_weights_close


def _tokens(seed=0, n=96, steps=10):
    rng = np.random.default_rng(seed)
    x = rng.integers(1, 30, size=(n, steps))
    for i in range(n):   # padded at the end, to lengths 3..steps
        x[i, rng.integers(3, steps + 1):] = 0
    return x, (x > 15).astype("int32")   # a label per token


def tagger(seed=0):
    """Embedding(mask_zero) -> LSTM -> Dense -> per-token softmax: the mask is made by a
    `not_equal` node after the embedding, read explicitly by the LSTM and implicitly (from
    the tensor) by the Dense layers, and weighs the loss and metrics."""
    keras.utils.set_random_seed(seed)
    x = keras.Input((10,), dtype="int32")
    h = keras.layers.Embedding(30, 6, mask_zero=True, name="emb")(x)
    h = keras.layers.LSTM(6, return_sequences=True, name="lstm")(h)
    h = keras.layers.Dense(6, activation="tanh", name="mid")(h)
    return keras.Model(x, keras.layers.Dense(2, activation="softmax", name="out")(h))


def masked_classifier(seed=0):
    """Masking (padding value 0) -> LSTM -> Dense: one label per sequence."""
    keras.utils.set_random_seed(seed)
    x = keras.Input((10, 3))
    h = keras.layers.Masking(0.0, name="masking")(x)
    h = keras.layers.LSTM(6, name="lstm")(h)
    h = keras.layers.Dense(6, activation="tanh", name="mid")(h)
    return keras.Model(x, keras.layers.Dense(1, activation="sigmoid", name="out")(h))


def _data(make):
    tokens, tags = _tokens()
    if make is tagger:
        return tokens, tags, "sparse_categorical_crossentropy"
    rng = np.random.default_rng(1)
    x = rng.normal(size=(*tokens.shape, 3)).astype("float32") * (tokens > 0)[..., None]
    return x, (x[:, 0, :1] > 0).astype("float32"), "binary_crossentropy"


def _fit(make, strategy=None):
    x, y, loss = _data(make)
    if strategy is None:
        model = make()
        model.compile(keras.optimizers.SGD(0.1), loss, metrics=["accuracy"])
    else:
        with strategy.scope():
            model = make()
            model.compile(keras.optimizers.SGD(0.1), loss, metrics=["accuracy"])
    history = model.fit(x, y, batch_size=16, epochs=1, shuffle=False, verbose=0).history
    return history, model.get_weights(), model.evaluate(x, y, verbose=0)


_REFERENCE: dict = {}


def _reference(make):
    """Plain Keras' (history, weights, evaluate) of `make`, fitted once in this module (the
    tests only read it)."""
    if make not in _REFERENCE:
        _REFERENCE[make] = _fit(make)
    return _REFERENCE[make]


def _assert_same(got, want):
    (h, w, ev), (h_ref, w_ref, ev_ref) = got, want
    for key in h_ref:
        np.testing.assert_allclose(h[key], h_ref[key], rtol=1e-5, atol=1e-6, err_msg=key)
    assert_weights_close(w, w_ref, atol=1e-5)
    np.testing.assert_allclose(ev, ev_ref, rtol=1e-5, atol=1e-6)


@pytest.mark.parametrize("make", [tagger, masked_classifier])
def test_masks_cross_every_cut_as_in_plain_keras(make):
    """One VW at N_m = 1 equals plain Keras for one stage, every 2-stage cut and 3 stages:
    the loss, the accuracy (a metric that reads y_pred's mask), the weights, evaluate."""
    reference = _reference(make)
    layers = len(make().layers) - 1   # without the Input
    nodes = len(LayerGraph.from_model(make()))
    assert nodes > layers   # the ops making the mask are nodes too
    for cut in range(1, nodes):   # the first stage holds `cut` nodes
        plan = lambda m, c=cut: manual_plan(m, [(DEVICES[0], c), (DEVICES[1], nodes - c)],
                                            n_m=1)
        _assert_same(_fit(make, HetPipeStrategy(plan=plan, n_m=1)), reference)
    for k in (1, 3):   # one stage runs inside Keras' own train function
        strategy = HetPipeStrategy(plan=lambda m: even_plan(m, DEVICES[:k], n_m=1), n_m=1)
        _assert_same(_fit(make, strategy), reference)


def test_masks_with_hetseq_and_gpipe_as_in_plain_keras():
    """HetSeq's shares (their metrics updated in calls of their own) and GPipe's
    micro-batches run the masked model as plain Keras does. (With a masked OUTPUT, each
    share or micro-batch averages its loss over its own unmasked steps, as
    MirroredStrategy's replicas do: docs/strategy.md "Keras masks".)"""
    reference = _reference(masked_classifier)
    hetseq = HetPipeStrategy(Cluster.local(["LOCAL_CPU"] * 2), data_parallel="hetseq",
                             shares=[8, 8])
    _assert_same(_fit(masked_classifier, hetseq), reference)
    gpipe = HetPipeStrategy(plan=lambda m: even_plan(m, DEVICES[:2], n_m=1),
                            schedule=Schedule.GPIPE, micro_batches=2)
    _assert_same(_fit(masked_classifier, gpipe), reference)


def test_the_graph_carries_each_mask_with_its_tensor():
    """LayerGraph.masks names the tensor holding each tensor's mask; a node reading a masked
    tensor reads its mask too, so a cut between them carries both (bytes included)."""
    graph = LayerGraph.from_model(tagger())
    names = [n.name for n in graph.nodes]
    emb, mid, out = (TensorRef(names.index(k), 0) for k in ("emb", "mid", "out"))
    mask = graph.masks[emb]
    assert graph.nodes[mask.node].class_name != "Embedding"   # an op made by Keras
    assert graph.masks[mid] == graph.masks[out] == mask
    assert mask in graph.nodes[names.index("mid")].inputs
    cut = names.index("lstm")
    assert mask in graph.cut_tensors(cut)
    assert graph.cut_bytes_per_sample(cut) == 10 * 6 * 4 + 10   # float32 steps + bool mask
