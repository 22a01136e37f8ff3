"""compiled_method: many objects each tracing once do not trip TensorFlow's retracing
warning (it counts per code object), while one object that really retraces still does."""

import logging

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
