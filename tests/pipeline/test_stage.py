"""A non-last stage's tape path: `Stage.forward` watches its weight version and inputs with
`tf_eager.watch_flat` and `Stage.backward` differentiates with `gradient_flat` (the
tape's C++ path without GradientTape's per-tensor Python). Both must give exactly what
GradientTape.watch / GradientTape.gradient give, unconnected sources and other dtypes
included, and keep the tape's one-use rule."""

import numpy as np
import pytest
import tensorflow as tf

from hetpipe_tf._shim import tf_eager


@tf.function
def _stage(w1, w2, unused, x):
    h = tf.nn.relu(tf.matmul(x, w1))
    out = tf.matmul(h, w2)
    return out, tf.reduce_sum(tf.square(w1)), tf.cast(out, tf.float16)


def _values(seed):
    rng = np.random.default_rng(seed)
    return [tf.constant(rng.normal(size=s).astype(np.float32))
            for s in ((4, 6), (6, 3), (5,), (8, 4))]


def _forward(watch, values):
    tape = tf.GradientTape(watch_accessed_variables=False)
    with tape:
        watch(tape, values)
        outs = _stage(*values)
    return tape, outs


def test_flat_path_equals_gradient_tape():
    values = _values(0)
    g_out = tf.constant(np.random.default_rng(1).normal(size=(8, 3)).astype(np.float32))
    g_half = tf.cast(g_out * 0.5, tf.float16)
    one = tf.ones(())

    tape, (out, extra, half) = _forward(lambda t, v: t.watch(v), values)
    want = tape.gradient([out, extra, half], values, output_gradients=[g_out, one, g_half])

    tape, (out, extra, half) = _forward(tf_eager.watch_flat, values)
    got = tf_eager.gradient_flat(tape, [out, extra, half], values, [g_out, one, g_half])

    assert len(got) == len(want) == 4
    assert want[2] is None and got[2] is None          # `unused` is not connected
    for a, b in zip(got, want):
        if b is not None:
            np.testing.assert_array_equal(a.numpy(), b.numpy())


def test_flat_gradient_keeps_the_tapes_rules():
    values = _values(2)
    tape = tf.GradientTape(watch_accessed_variables=False)
    with tape:
        tf_eager.watch_flat(tape, values)
        out, extra, _ = _stage(*values)
        with pytest.raises(RuntimeError, match="stopped recording"):
            tf_eager.gradient_flat(tape, [extra], values, [tf.ones(())])
    grads = tf_eager.gradient_flat(tape, [extra], values, [tf.ones(())])
    np.testing.assert_allclose(grads[0].numpy(), 2 * values[0].numpy(), rtol=1e-6)
    with pytest.raises(RuntimeError, match="taken already"):
        tf_eager.gradient_flat(tape, [extra], values, [tf.ones(())])


def test_flat_path_hands_other_values_to_the_tape_and_refuses_a_persistent_one():
    v = tf.Variable([1.0, 2.0])
    tape = tf.GradientTape(watch_accessed_variables=False)
    with tape:
        tf_eager.watch_flat(tape, [v])               # a variable: tape.watch's way
        y = tf.reduce_sum(v * v)
    (g,) = tf_eager.gradient_flat(tape, [y], [v], [tf.ones(())])
    np.testing.assert_array_equal(g.numpy(), [2.0, 4.0])
    with tf.GradientTape(persistent=True) as tape:
        tape.watch(v)
        y = tf.reduce_sum(v)
    with pytest.raises(ValueError, match="non-persistent"):
        tf_eager.gradient_flat(tape, [y], [v], [tf.ones(())])
