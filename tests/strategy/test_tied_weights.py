"""Tied weights split across stages (issue 19 point 3, pipeline/tied.py): the first stage
that uses the weight owns it, a later one borrows the owner's version of each minibatch,
and the borrower's gradient is summed into the owner's before its one update. Checked
against independent references: the staleness reference at N_m = 2, synchronous
data-parallel SGD for two VWs, and plain Keras for keras_hub's GPT2CausalLM over 4 stages.
(Split at N_m = 1 against plain Keras: tests/strategy/test_nested_models.py.)"""

import keras
import keras_hub
import numpy as np
import pytest
import tensorflow as tf

from hetpipe_tf.core.sync_schedule import Schedule
from hetpipe_tf.strategy import HetPipeStrategy, StageSpec, even_plan, manual_plan
from tests.strategy.helpers import (DEVICES, assert_weights_close, regression_data,
                                    staleness_reference, tied_model)

SPLIT = [2, 2]   # stage 0: tied, mid; stage 1: tied@1 (borrowed), out


def _plan(devices, n_m):
    return lambda m: manual_plan(m, [StageSpec(d, k) for d, k in zip(devices, SPLIT)], n_m=n_m)


def test_split_tied_weights_at_n_m_2_equal_the_staleness_reference():
    x, y = regression_data(64, 7)
    strategy = HetPipeStrategy(plan=_plan(DEVICES[:2], 2),
                               compensation="none")   # the paper's rule: the reference
    with strategy.scope():
        model = tied_model()
        model.compile(keras.optimizers.SGD(0.05, momentum=0.5), "mse")
    w0 = model.get_weights()
    model.fit(x, y, batch_size=8, epochs=1, shuffle=False, verbose=0)
    assert [len(s.borrowed) for s in strategy.pipeline(model).stages] == [0, 2]
    batches = [(x[i:i + 8], y[i:i + 8]) for i in range(0, 64, 8)]
    ref, _ = staleness_reference(tied_model, w0,
                                 lambda: keras.optimizers.SGD(0.05, momentum=0.5),
                                 batches, n_m=2, runs={1})
    assert_weights_close(model.get_weights(), ref)
    strategy.close()


def test_two_virtual_workers_with_split_tied_weights_are_synchronous_sgd_at_d0():
    x, y = regression_data(64, 8)
    plans = [_plan(DEVICES[2 * w:2 * w + 2], 1)(tied_model()) for w in range(2)]
    strategy = HetPipeStrategy(plan=plans, clock_distance=0)
    with strategy.scope():
        model = tied_model()
        model.compile(keras.optimizers.SGD(0.05), "mse")
    w = [a.copy() for a in model.get_weights()]
    model.fit(x, y, batch_size=8, epochs=1, shuffle=False, verbose=0)
    coord = strategy.coordinator(model)
    probe = tied_model()
    batches = [(x[i:i + 8], y[i:i + 8]) for i in range(0, 64, 8)]

    def update(weights, batch):
        probe.set_weights(weights)
        with tf.GradientTape() as tape:
            loss = keras.losses.MeanSquaredError()(batch[1], probe(batch[0], training=True))
        return [-0.05 * g.numpy() for g in tape.gradient(loss, probe.trainable_variables)]

    for c in range(len(coord.assignment[0])):   # each clock: both VWs at the same weights
        us = [update(w, batches[coord.assignment[v][c]]) for v in range(2)]
        w = [a + b + d for a, b, d in zip(w, *us)]
    assert_weights_close(model.get_weights(), w)
    strategy.close()


def test_a_synchronous_schedule_refuses_split_tied_weights_by_name():
    x, y = regression_data(32, 9)
    strategy = HetPipeStrategy(plan=_plan(DEVICES[:2], 1), schedule=Schedule.GPIPE,
                               micro_batches=2)
    with strategy.scope():
        model = tied_model()
        model.compile(keras.optimizers.SGD(0.05), "mse")
    w0 = model.get_weights()
    with pytest.raises(ValueError, match=r"Tied weights split across stages are not "
                                         r"supported with the GPIPE schedule yet"):
        model.fit(x, y, batch_size=8, epochs=1, verbose=0)
    assert_weights_close(model.get_weights(), w0, atol=0)
    strategy.close()


SEQ, VOCAB = 12, 64


def _gpt2(lr=1e-3):
    keras.utils.set_random_seed(0)
    backbone = keras_hub.models.GPT2Backbone(
        vocabulary_size=VOCAB, num_layers=2, num_heads=2, hidden_dim=16,
        intermediate_dim=32, max_sequence_length=SEQ, dropout=0.0)
    model = keras_hub.models.GPT2CausalLM(backbone=backbone, preprocessor=None)
    model.compile(optimizer=keras.optimizers.Adam(lr),
                  loss=keras.losses.SparseCategoricalCrossentropy(from_logits=True))
    return model


def _tokens(n=40):
    """Sequences that count up from a random start (mod VOCAB): learnable next tokens."""
    start = np.random.RandomState(0).randint(1, VOCAB, (n, 1))
    tok = ((start + np.arange(SEQ + 1)) % VOCAB).astype("int32")
    return {"token_ids": tok[:, :-1], "padding_mask": np.ones((n, SEQ), "int32")}, tok[:, 1:]


def test_gpt2_causal_lm_over_four_stages_equals_plain_keras():
    """keras_hub's GPT2CausalLM as it is (open sequence length, token embedding tied to
    the LM head), its causal_lm.fit with a remainder batch: 4 stages at N_m = 1."""
    x, y = _tokens()
    ref = _gpt2()
    ref_hist = ref.fit(x, y, batch_size=16, epochs=2, shuffle=False, verbose=0)
    strategy = HetPipeStrategy(plan=lambda m: even_plan(m, DEVICES[:4], n_m=1))
    with strategy.scope():
        model = _gpt2()
    hist = model.fit(x, y, batch_size=16, epochs=2, shuffle=False, verbose=0)
    stages = strategy.pipeline(model).stages
    assert len(stages) == 4 and stages[-1].borrowed and stages[0].lent
    assert_weights_close(model.get_weights(), ref.get_weights(), atol=1e-5)
    np.testing.assert_allclose(hist.history["loss"], ref_hist.history["loss"], rtol=1e-5)
    assert len(model.weights) == len(ref.weights)   # one copy of the tied embedding
    strategy.close()


def test_gpt2_causal_lm_trains_with_two_virtual_workers():
    x, y = _tokens(64)
    strategy = HetPipeStrategy(
        plan=lambda m: [even_plan(m, DEVICES[2 * w:2 * w + 2], n_m=2) for w in range(2)],
        clock_distance=1)
    with strategy.scope():
        model = _gpt2(lr=1e-2)
    before = model.evaluate(x, y, batch_size=16, verbose=0)[0]
    model.fit(x, y, batch_size=8, epochs=5, shuffle=False, verbose=0)
    after = model.evaluate(x, y, batch_size=16, verbose=0)[0]
    assert [bool(s.borrowed) for s in strategy.pipeline(model, 1).stages] == [False, True]
    # Which VW's push lands first varies run to run: 4.16 -> 2.39-2.74 in 3 runs on an idle
    # machine, 3.16 beside a full suite and 3 other jobs on 2 cores (at 3 epochs 3.14-3.72),
    # so the bound leaves room for that spread; a model that does not learn stays at 4.16.
    assert after < before - 0.5, (before, after)
    strategy.close()
