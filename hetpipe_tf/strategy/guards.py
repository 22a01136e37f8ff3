"""The wrappers the strategy installs on a Keras model compiled in its scope.

`fit`/`evaluate`/`predict`: an exception or interrupt aborts the model's executor (nothing in
flight is applied after the call raised; the state is the last applied one) and a stage's
error is re-raised as itself; a fit after `strategy.close()` is refused by name.
`save`/`save_weights`/`get_weights`/`set_weights` drain first, and `load_weights` drains and
builds the optimizer first, so the model and its optimizer hold the whole training state
when read or written (docs/state.md). `make_train_function`: each Keras train function binds
to the runtime its trace built, so an in-graph runtime opens its run before a call and
records the call after it; it, `make_test_function` and `make_predict_function` make
Keras' functions without XLA (strategy/xla.py). `get_metrics_result` (installed at each build) drains first, so
epoch-end logs, validation and callbacks see every minibatch.

What a train step shows (`StepLogs`): a threaded executor's step returns while its
minibatch is still in flight, so the step hands Keras (the progress bar, batch callbacks)
the logs as of the latest minibatch whose loss and metrics the last stage computed since
the metrics were last reset (each epoch, each evaluate, each train_on_batch), and no values
at all before there is one: never zeros, never the previous epoch's. Keras keeps an epoch's metrics from
`get_metrics_result` only where the last step's logs have the same keys, so an empty last
step's logs are filled with the drained metrics when Keras reads them at the epoch's end.
"""

from __future__ import annotations

import contextlib
import functools
import inspect
import threading
import time
from typing import Any

import tensorflow as tf

from hetpipe_tf import _shim as _keras_shim
from hetpipe_tf.pipeline.executor import thread_scope
from hetpipe_tf.pipeline.in_graph import InGraphRuntime
from hetpipe_tf.pipeline.runtime import PipelineError
from hetpipe_tf.strategy import training_state, xla
from hetpipe_tf.strategy.build import compiled_state, same_compile


class StepLogs:
    """The logs a threaded executor's train step shows Keras (module docstring)."""

    def __init__(self):
        self._stale: Any = None     # the executor's logs when the metrics were last reset
        self._empty: dict | None = None   # the last step's empty logs, until filled
        self._evaluating = 0        # evaluate/predict calls open (nested in fit or not)

    @contextlib.contextmanager
    def evaluating(self):
        """An evaluate or predict runs: the metrics it reads are not the training step's."""
        self._evaluating += 1
        try:
            yield
        finally:
            self._evaluating -= 1

    def reset(self, executor) -> None:
        """The model's metrics were reset: logs held so far are not this epoch's."""
        self._stale = None if executor is None else executor.logs
        # An empty last step's logs stay to be filled: an evaluate from a batch callback
        # resets the metrics between that step and the epoch's end.

    def shown(self, executor, out: Any) -> Any:
        """What the train function returns for Keras' step outputs `out`."""
        if (executor is None or isinstance(executor, InGraphRuntime)
                or not isinstance(out, dict)):
            return out   # in graph: Keras' own step computed them
        # Read now, after the step: the step's own read may predate a completion.
        logs = executor.logs
        if logs is None or logs is self._stale:
            self._empty = {}
            return self._empty
        self._empty = None
        return {k: logs[k] for k in out if k in logs}

    def fill(self, result: dict) -> None:
        """The metrics were read (drained): an empty last step's logs get them, unless an
        evaluate read them (one started from a batch callback mid-epoch, or validation)."""
        if self._empty is not None and not self._evaluating:
            self._empty.update(result)
            self._empty = None


def _step_logs(model) -> StepLogs:
    logs = model.__dict__.get("_hetpipe_step_logs")
    if logs is None:
        logs = StepLogs()
        object.__setattr__(model, "_hetpipe_step_logs", logs)
    return logs


def guard_model(extended, model) -> None:
    """Wrap the model's fit/evaluate/predict and the *_on_batch calls (abort on an
    exception; evaluate, predict, test_on_batch and predict_on_batch drain first, so what
    was in flight neither misses their weights nor adds to their fresh metrics;
    train_on_batch drains after its batch and returns that batch's logs), save/
    save_weights/get_weights/set_weights (drain first) and load_weights (drain, build the
    optimizer first). Once."""
    if model.__dict__.get("_hetpipe_guarded"):
        return

    def may_drain() -> bool:
        # Not while tracing, and never from a stage thread (a callback run by a stage).
        return tf.executing_eagerly() and threading.get_ident() not in extended._runtime_threads

    def guarded(name, drain_first=False):
        original = getattr(model, name)

        @functools.wraps(original)
        def call(*args, **kwargs):
            t = extended.pipelines.get(id(model))
            if (name == "fit" and t is not None and t.executor.closed
                    and same_compile(t.compiled, compiled_state(model))):
                raise PipelineError(
                    f"The strategy training {model.name!r} was closed, so it takes no "
                    "more minibatches. Received: fit() after strategy.close() (or after "
                    "leaving `with strategy:`); call compile() again in "
                    "`strategy.scope()` to train on, or keep the strategy open.")
            try:
                if drain_first and may_drain():   # a stage's error aborts as in the call
                    extended.drain()
                # Cluster jobs: the caller's ops off TensorFlow's default executor, where a
                # frozen task's pending ops would hold tf.data's and Keras' waits on it
                # (docs/cluster_jobs.md "Going on without a lost VW").
                # evaluate, predict, test_on_batch, predict_on_batch: they drain first
                evaluating = (_step_logs(model).evaluating() if drain_first
                              else contextlib.nullcontext())
                with thread_scope(), evaluating:
                    result = original(*args, **kwargs)
                if name == "fit":
                    _check_tasks(extended, model)
                return result
            except BaseException as e:
                stage_error = extended.abort(model)
                refused = extended.refused.pop(id(model), None)
                if refused is not None and refused is not e:
                    raise refused from e
                if stage_error is not None and stage_error is not e:
                    raise stage_error from e
                raise
        return call

    def own_logs(train_on_batch):
        signature = inspect.signature(train_on_batch)

        @functools.wraps(train_on_batch)
        def call(*args, **kwargs):
            bound = signature.bind(*args, **kwargs)
            return_dict = bound.arguments.get("return_dict", False)
            bound.arguments["return_dict"] = True
            logs = train_on_batch(*bound.args, **bound.kwargs)
            t = extended.pipelines.get(id(model))
            if may_drain() and not isinstance(getattr(t, "executor", None), InGraphRuntime):
                # The step handed back the logs of the last completed minibatch; this
                # batch's are there once it is applied (in graph they already are).
                extended.drain()
                logs = _keras_shim.pythonify_logs(model.get_metrics_result())
            return logs if return_dict else _keras_shim.flatten_logs(model, logs)
        return call

    def drained(name):
        original = getattr(model, name)

        @functools.wraps(original)
        def call(*args, **kwargs):
            if (tf.executing_eagerly()
                    and threading.get_ident() not in extended._runtime_threads):
                extended.drain()
            return original(*args, **kwargs)
        return call

    def load_weights(*args, _original=model.load_weights, **kwargs):
        if (tf.executing_eagerly()
                and threading.get_ident() not in extended._runtime_threads):
            # Mid-run (a callback): end the run first, so the loaded weights and
            # optimizer state seed the next run instead of being merged over.
            extended.drain()
        if getattr(model, "optimizer", None) is not None:
            training_state.build_canonical(model)
        return _original(*args, **kwargs)

    def make_train_function(*args, _original=model.make_train_function, **kwargs):
        with xla.keras_step_without_xla(model):   # XLA compiles the stages instead
            _original(*args, **kwargs)   # sets model.train_function (returns None)
        fn = model.train_function
        if fn is None or getattr(fn, "_hetpipe_calls", False):
            return fn
        bound: list = []   # the runtime this Keras function was traced with
        step_logs = _step_logs(model)

        def train_function(iterator):
            # An in-graph runtime opens its run before a call (refusing when closed)
            # and records the call after it.
            rt = bound[0] if bound else None
            if rt is not None:
                rt.begin_call()
            t0 = time.perf_counter()
            extended._called_before[id(model)] = bool(bound)
            try:
                out = fn(iterator)
            finally:
                # Bound at the first trace, rebound should a retrace build a new one.
                if id(model) in extended._traced:
                    bound[:] = [extended._traced[id(model)]]
                    rt = bound[0]
            if rt is not None:
                rt.end_call(t0, model.steps_per_execution)
            t = extended.pipelines.get(id(model))
            return step_logs.shown(None if t is None else t.executor, out)

        train_function._hetpipe_calls = True
        model.train_function = train_function
        return train_function

    def without_xla(name):
        original = getattr(model, name)

        @functools.wraps(original)
        def call(*args, **kwargs):
            with xla.keras_step_without_xla(model):   # strategy/xla.py
                return original(*args, **kwargs)
        return call

    def reset_metrics(*args, _original=model.reset_metrics, **kwargs):
        t = extended.pipelines.get(id(model))
        vw_metrics = getattr(t, "vw_metrics", None)
        if vw_metrics is not None:   # the VWs' copies count from here (vw_metrics.py)
            vw_metrics.reset()
        _step_logs(model).reset(None if t is None else t.executor)
        return _original(*args, **kwargs)

    object.__setattr__(model, "fit", guarded("fit"))
    for name in ("evaluate", "predict", "test_on_batch", "predict_on_batch"):
        object.__setattr__(model, name, guarded(name, drain_first=True))
    object.__setattr__(model, "train_on_batch", own_logs(guarded("train_on_batch")))
    object.__setattr__(model, "make_train_function", make_train_function)
    for name in ("make_test_function", "make_predict_function"):
        object.__setattr__(model, name, without_xla(name))
    object.__setattr__(model, "reset_metrics",
                       functools.wraps(model.reset_metrics)(reset_metrics))
    if model.__dict__.get("train_function") is not None:
        # Guarded during the first trace (compiled outside the scope): Keras reads
        # model.train_function before every call, so the wrapper serves from the next.
        make_train_function()
    for name in ("save", "save_weights", "get_weights", "set_weights"):
        object.__setattr__(model, name, drained(name))
    object.__setattr__(model, "load_weights",
                       functools.wraps(model.load_weights)(load_weights))
    object.__setattr__(model, "_hetpipe_guarded", True)
    extended._guarded.add(model)


def _check_tasks(extended, model) -> None:
    """A cluster job's fit returns once every remote task answered a probe sent at its end,
    else raises the lost task's TaskLostError within the bound (ps/faults.py
    `FaultGuard.check_alive`): a task lost after its last work of the fit is reported by it."""
    executor = getattr(extended.pipelines.get(id(model)), "executor", None)
    guard = getattr(executor, "guard", None)
    if guard is not None:
        guard.check_alive()


def install_draining_metrics(extended, model, original) -> None:
    """Replace the model's `get_metrics_result` (the class's own, bound: `original`) by one
    that drains first: Keras reads the metrics at the end of every epoch (and of evaluate),
    so they, the validation that follows and epoch-end callbacks see every minibatch; an
    empty last step's logs get them (`StepLogs.fill`). With the metric state per VW
    (strategy/vw_metrics.py) the VWs' summed states are assigned to the model's metrics
    after the drain; a reset of the model's metrics resets the VWs' too."""
    def get_metrics_result():
        if tf.executing_eagerly() and threading.get_ident() not in extended._runtime_threads:
            extended.drain()
            vw_metrics = getattr(extended.pipelines.get(id(model)), "vw_metrics", None)
            if vw_metrics is not None:   # the VWs' states summed into the model's metrics
                vw_metrics.publish()
            result = original()
            _step_logs(model).fill(result)
            return result
        return original()

    object.__setattr__(model, "get_metrics_result", get_metrics_result)
