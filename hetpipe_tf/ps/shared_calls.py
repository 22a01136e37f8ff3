"""A `tf.function` that several VW threads share under one lock, called so that a frozen
remote task blocks only the VW that uses it (docs/cluster_jobs.md)."""

from __future__ import annotations

from typing import Callable


def shapes_first(fn: Callable) -> Callable:
    """`fn(*args)` once every eager tensor among `args` has its shape, returning once every
    tensor it returns has its own: for a `tf.function` several VW threads share under one
    lock (the model's metrics update, strategy/build.py).

    Shapes first: `tf.function` looks a call's trace up by the arguments' shapes while
    holding the function's own lock, and an eager tensor's shape is known only when the op
    that makes it has run; one from a remote op of a frozen task (SIGSTOP) never gets it.
    Asked here, outside that lock, the wait blocks only the calling VW's thread, not every
    other VW's call of the function (docs/cluster_jobs.md). Free otherwise: tf.function
    asks the same next.

    Outputs last: called under a remote stage's device, the function is shipped to that
    task as one asynchronous op and the call returns before it ran. Keras' metrics update
    their state by read-then-assign (`assign_add` is `assign(self + value)`), so two VWs'
    updates must not run at once on two tasks (each would lose the other's counts,
    tests/ps/test_metrics.py). The outputs' shapes are known once the whole call ran, its
    assignments included, so the caller's lock orders the updates themselves; no value
    moves."""

    def call(*args):
        import tensorflow as tf

        if not tf.executing_eagerly():
            return fn(*args)
        _wait_for_shapes(args)
        out = fn(*args)
        _wait_for_shapes(out)
        return out

    return call


def _wait_for_shapes(values) -> None:
    import tensorflow as tf

    for t in tf.nest.flatten(values):
        if isinstance(t, tf.Tensor):
            _ = t.shape   # blocks until the producing op ran (or raises its error)
