"""pipeline/tied.py by itself: what an owner lends, what borrowers get, and how their
gradients reach the owner (end to end against plain Keras: tests/strategy/
test_tied_weights.py)."""

import types

import numpy as np
import pytest
import tensorflow as tf

from hetpipe_tf.pipeline import tied


def _stages():
    v, w = tf.Variable(tf.zeros((4, 2))), tf.Variable(tf.zeros((2,)))
    owner = types.SimpleNamespace(index=0, trainable=[w, v], borrowed=[], lent=[v],
                                  device="/CPU:0")
    first = types.SimpleNamespace(index=1, trainable=[], borrowed=[v], lent=[],
                                  device="/CPU:1")
    second = types.SimpleNamespace(index=2, trainable=[], borrowed=[v], lent=[],
                                   device="/CPU:2")
    return owner, first, second


def test_borrowers_get_the_owners_version_and_their_gradients_sum_into_the_owners():
    owner, first, second = _stages()
    lent, grads = {}, {}
    version = [tf.fill((2,), 5.0), tf.fill((4, 2), 7.0)]
    assert tied.with_borrowed(owner, lent, version) == version       # nothing borrowed
    got = tied.with_borrowed(first, lent, [])
    assert len(got) == 1 and got[0] is version[1]                     # the owner's tensor
    assert tied.own_grads(first, grads, lent, [tf.ones((4, 2))]) == []
    assert tied.own_grads(second, grads, lent, [2 * tf.ones((4, 2))]) == []
    # The owner's own gradient of v is a gather's (IndexedSlices): summed densely.
    own_v = tf.IndexedSlices(tf.ones((1, 2)), tf.constant([3]), tf.constant([4, 2]))
    w_grad, v_grad = tied.own_grads(owner, grads, lent, [tf.ones((2,)), own_v])
    np.testing.assert_array_equal(w_grad, [1.0, 1.0])
    np.testing.assert_array_equal(v_grad, [[3, 3], [3, 3], [3, 3], [4, 4]])
    assert grads == {} and lent == {}   # the owner let go of what it lent


def test_a_borrower_without_gradient_leaves_the_owners_alone():
    owner, first, _ = _stages()
    lent, grads = {}, {}
    tied.with_borrowed(owner, lent, [tf.zeros((2,)), tf.zeros((4, 2))])
    tied.own_grads(first, grads, lent, [None])
    own = tied.own_grads(owner, grads, lent, [None, tf.ones((4, 2))])
    np.testing.assert_array_equal(own[1], np.ones((4, 2)))
    assert own[0] is None


def test_executors_without_borrowing_refuse_a_split_by_name():
    owner, first, _ = _stages()
    tied.refuse_borrowed([owner], "the GPIPE schedule")   # nothing borrowed: fine
    with pytest.raises(ValueError, match=r"not supported with the GPIPE schedule yet. "
                                         r"Received: stage 1 borrows"):
        tied.refuse_borrowed([owner, first], "the GPIPE schedule")
