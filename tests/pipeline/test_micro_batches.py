"""Tests of hetpipe_tf.pipeline.micro_batches."""

import tensorflow as tf

from hetpipe_tf.pipeline.micro_batches import Adder, split, split_sizes


def test_split_sizes():
    assert split_sizes(16, 4) == [4, 4, 4, 4]
    assert split_sizes(6, 4) == [2, 2, 1, 1]
    assert split_sizes(3, 4) == [1, 1, 1]


def test_split_cuts_nests_by_rows_and_adder_sums_sparse_side_by_side():
    x = {"a": tf.reshape(tf.range(6.0), (3, 2)), "b": None}
    parts = split(x, [2, 1])
    assert [p["a"].shape[0] for p in parts] == [2, 1] and parts[1]["b"] is None
    assert split(None, [2, 1]) == [None, None]
    dense = tf.ones((2, 2))
    sparse = tf.IndexedSlices(tf.ones((1, 2)), tf.constant([1]), tf.constant([2, 2]))
    total = Adder()([dense, None], [sparse, tf.ones(())])
    assert tf.math.reduce_sum(tf.convert_to_tensor(total[0])).numpy() == 6.0
    assert total[1].numpy() == 1.0
