"""hetpipe_tf/ps/shared_calls.py: `shapes_first` keeps a call whose argument is not ready
(a frozen task's remote op) out of a shared tf.function's lock."""

import threading
import time

import pytest
import tensorflow as tf


@pytest.mark.parametrize("first", [False, True])
def test_shapes_first_keeps_a_frozen_argument_out_of_tf_functions_lock(first):
    """The chief's hang under SIGSTOP (docs/cluster_jobs.md): tf.function looks a trace up
    by its arguments' shapes under its own lock, so a thread whose argument is not ready (a
    frozen task's remote op; here an async executor's py_function that waits) holds every
    other thread's call of the shared function. `shapes_first` waits before the lock."""
    from tensorflow.python.eager import context, executor   # an op whose output waits

    from hetpipe_tf.ps.shared_calls import shapes_first

    release = threading.Event()

    def frozen_op(x):
        release.wait()
        return x

    shared = tf.function(lambda x: x * 2.0, reduce_retracing=True)
    call = shapes_first(shared) if first else shared
    call(tf.ones([3]))   # traced: later calls only look the trace up
    stuck_out: list = []

    def stuck() -> None:
        with context.executor_scope(executor.new_executor(enable_async=True)):
            t = tf.py_function(frozen_op, [tf.ones([3])], Tout=tf.float32)
            stuck_out.append(call(t).numpy())

    other_done = threading.Event()

    def other() -> None:
        call(tf.ones([3]))
        other_done.set()

    a = threading.Thread(target=stuck, daemon=True)
    a.start()
    time.sleep(0.5)   # `stuck` is waiting for its argument now
    threading.Thread(target=other, daemon=True).start()
    try:
        assert other_done.wait(5 if first else 1.5) is first
    finally:
        release.set()
    a.join(10)
    assert other_done.wait(10) and stuck_out and list(stuck_out[0]) == [2.0] * 3
