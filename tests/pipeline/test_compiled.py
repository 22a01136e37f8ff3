"""compiled_method: many objects each tracing once do not trip TensorFlow's retracing
warning (it counts per code object), while one object that really retraces still does."""

import logging

import numpy as np
import tensorflow as tf

from hetpipe_tf.pipeline.compiled import compiled_method


class _Holder:
    def __init__(self, wrap):
        self.fn = wrap(self._impl)

    def _impl(self, x):
        return x * 2.0


def _retracing_warnings(caplog, wrap, shapes_per_object):
    caplog.clear()
    with caplog.at_level(logging.WARNING, logger="tensorflow"):
        for shapes in shapes_per_object:
            h = _Holder(wrap)
            for n in shapes:
                assert float(tf.reduce_sum(h.fn(tf.ones((n,))))) == 2.0 * n
    return [r for r in caplog.records if "retracing" in r.getMessage()]


def test_many_objects_each_tracing_once_do_not_warn(caplog):
    # Control: a plain tf.function of the bound method warns here.
    assert _retracing_warnings(caplog, tf.function, [[1]] * 10)
    assert not _retracing_warnings(caplog, compiled_method, [[1]] * 10)


def test_one_object_really_retracing_still_warns(caplog):
    assert _retracing_warnings(caplog, compiled_method, [list(range(1, 12))])


class _Nested:
    """A method over nested arguments like a stage's: lists of tensors, None, a Python
    scalar, a dict; it counts its traces."""

    def __init__(self):
        self.traces = 0
        self.fn = compiled_method(self._impl, reduce_retracing=True)

    def _impl(self, tvals, extra, scale, named):
        self.traces += 1
        total = tf.add_n(tvals) * scale + named["b"] - named["a"]
        if extra is not None:
            total += extra
        return [total, tf.reduce_sum(total)], {"n": tf.size(total)}


def _nested_args(n=3, extra=None, scale=2.0):
    tvals = [tf.fill((n,), float(i)) for i in range(3)]
    return tvals, extra, scale, {"b": tf.ones((n,)), "a": tf.fill((n,), 0.5)}


def test_concrete_dispatch_equals_tf_function_and_traces_once_per_key():
    holder, other = _Nested(), _Nested()
    reference = tf.function(other._impl)
    for args in (_nested_args(), _nested_args(), _nested_args(extra=tf.ones(())),
                 _nested_args(n=5), _nested_args(scale=3.0), _nested_args()):
        got, ref = holder.fn(*args), reference(*args)
        tf.nest.map_structure(lambda a, b: tf.debugging.assert_equal(a, b), got, ref)
    # Keys: n=3 with extra None, extra a tensor, scale 3.0, and n=5 (reduce_retracing may
    # relax that one into a trace of its own or not): repeats reuse their concrete function.
    assert holder.traces <= 4
    assert len(holder.fn._concrete) == 4
    assert all(isinstance(c, tf.types.experimental.ConcreteFunction)   # flat calls
               for c in holder.fn._concrete.values())


def test_concrete_dispatch_records_gradients_under_a_tape():
    holder = _Nested()
    tvals, extra, scale, named = _nested_args()
    for _ in range(2):   # the second call takes the flat path
        with tf.GradientTape() as tape:
            tape.watch(tvals)
            (total, _), _ = holder.fn(tvals, extra, scale, named)
        grads = tape.gradient(total, tvals, output_gradients=tf.ones((3,)))
        for g in grads:
            tf.debugging.assert_equal(g, tf.fill((3,), 2.0))


def test_unkeyed_arguments_and_graph_calls_go_through_tf_function():
    holder = _Nested()
    v = tf.Variable(tf.ones((3,)))
    tvals, extra, scale, named = _nested_args()
    out, _ = holder.fn([v, *tvals[1:]], extra, scale, named)   # a variable: not keyed
    tf.debugging.assert_equal(out[0], tf.constant([8.5, 8.5, 8.5]))

    @tf.function
    def outer():
        return holder.fn(tvals, extra, scale, named)[0][1]
    assert float(outer()) == 3 * (0 + 1 + 2) * 2.0 + 3 * 0.5
    assert not holder.fn._concrete   # neither call took the concrete path


class _Counter:
    def __init__(self):
        self.v = tf.Variable(0.0)
        self.eager_calls = []
        self.fn = compiled_method(self._impl)

    def _impl(self, d, scale=1.0):
        self.eager_calls.append(tf.executing_eagerly())
        self.v.assign_add(d * scale)
        return self.v.read_value()


def test_calls_the_short_way_cannot_key_run_as_tf_function_runs_them():
    c = _Counter()
    d = tf.constant(1.0)
    for _ in range(3):   # a defaulted parameter left out: each call adds exactly once
        c.fn(d)
    assert float(c.v.numpy()) == 3.0
    assert float(c.fn(d, scale=2.0)) == 5.0          # keyword arguments
    for value in (0.5, 0.25):                          # a NumPy scalar is a tensor to
        c.fn(d, np.float32(value))                     # tf.function, not a Python float
    assert float(c.v.numpy()) == 5.75
    c.eager_calls.clear()
    tf.config.run_functions_eagerly(True)
    try:
        for _ in range(2):
            c.fn(d, 1.0)
    finally:
        tf.config.run_functions_eagerly(False)
    assert c.eager_calls == [True, True]               # the body ran eagerly each time
    assert float(c.v.numpy()) == 7.75
