"""Tests of hetpipe_tf.pipeline.minibatch: a share's update scaled on its stage's device."""

import tensorflow as tf


def test_a_split_batchs_scaled_gradients_stay_on_their_stages_device():
    """A share's gradients times n_k / N (ps/split.py) are made on the stage's device: an
    unpinned eager op runs on the caller's default device (CPU:0 here, the chief in a
    cluster job, where each minibatch's gradients would cross the wire twice)."""
    from hetpipe_tf.pipeline.minibatch import Minibatch, scaled

    with tf.device("/CPU:2"):
        dense = tf.ones([3, 2])
        rows = tf.IndexedSlices(tf.ones([1, 2]), tf.constant([1]), tf.constant([3, 2]))
        delta = tf.fill([2], 4.0)
    mb = Minibatch(1, [], None, None, loss_scale=0.25)
    mb.grads[0], mb.deltas[0] = [dense, rows, None], [delta]
    grads, deltas = scaled(mb, 0, "/CPU:2")
    for t in (grads[0], grads[1].values, deltas[0]):
        assert tf.DeviceSpec.from_string(t.device).device_index == 2, t.device
    assert float(tf.reduce_sum(grads[0])) == 1.5 and float(deltas[0][0]) == 1.0
    assert float(tf.reduce_sum(grads[1].values)) == 0.5 and grads[2] is None
    mb.grads[1], mb.deltas[1] = [dense], []
    mb.loss_scale = None   # a whole batch: the gradients as they are
    assert scaled(mb, 1, "/CPU:2")[0][0] is dense
