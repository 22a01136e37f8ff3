"""TensorFlow's eager context as threads of a cluster job need it (TF 2.21).

Which task this process is, and an eager executor per thread, so that a lost or frozen
remote task blocks only the thread that talks to it (`ps/faults.py`, `ps/coordinator.py`,
`pipeline/executor.py`).
"""

from __future__ import annotations

import contextlib
from typing import Any

import tensorflow as tf
from tensorflow.python import pywrap_tfe as _pywrap_tfe   # own_executor
from tensorflow.python.eager import executor as _tf_executor   # own_executor


def host_task() -> str:
    """This process's task, e.g. "/job:chief/replica:0/task:0" ("/job:localhost/..." when
    not connected): TensorFlow has no public way to ask, and once connected
    `tf.config.list_logical_devices()` lists every task's devices (pipeline/transport.py)."""
    # Reason: the eager context knows its task; no public getter.
    from tensorflow.python.eager import context

    return context.context().host_address_space()


@contextlib.contextmanager
def own_executor() -> Any:
    """A context manager: this thread's eager ops run in an executor of their own (sync).

    After a remote task dies, TensorFlow's shared default executor keeps waiting for it
    and every later remote op issued from it blocks; the same op in another executor
    runs. TensorFlow's own ClusterCoordinator gives each worker thread one executor for
    the same reason (`context.executor_scope(executor.new_executor(enable_async=False))`,
    tensorflow/python/distribute/coordinator/cluster_coordinator.py). Public TF has no
    per-thread executor, hence private `context` / `executor`.

    Not TF's `executor_scope` itself: it reads the previous executor as a new Python
    wrapper and drops it at exit, and `Executor.__del__` waits for every op pending in
    that executor: the process's default one, where a remote op of another thread for a
    frozen task (SIGSTOP) never ends, so every thread leaving its own executor hung (the
    chief; tests/ps/test_continue.py). That wrapper is dropped here without the wait (it
    never owns the executor it points to). On leaving, a lost task's error left in this
    executor is cleared: the thread has already raised or dropped it, and `__del__` would
    print it as "Exception ignored ... UnavailableError" at exit.
    """
    from tensorflow.python.eager import context, executor

    own = executor.new_executor(enable_async=False)
    ctx = context.context()
    previous = ctx.executor   # a wrapper that does not own the executor
    previous.__class__ = _UnwaitedExecutor
    ctx.executor = own
    try:
        yield own
    finally:
        try:
            own.wait()
        except tf.errors.OpError:
            own.clear_error()
        ctx.executor = previous


class _UnwaitedExecutor(_tf_executor.Executor):
    """A wrapper of an executor it does not own: dropped without waiting for its ops."""

    __slots__ = ()

    def __del__(self) -> None:
        try:
            _pywrap_tfe.TFE_DeleteExecutor(self._handle)   # the wrapper only
        except TypeError:   # interpreter shutdown, as Executor.__del__
            pass
