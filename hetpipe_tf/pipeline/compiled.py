"""`tf.function` of one object's method, counted as a function of its own and called
through its concrete functions.

TensorFlow warns about "excessive retracing" per Python code object, so N objects of one
class that each trace their method once (the stages of several virtual workers, their
weights, the parameter servers) look like one function retracing N times, and users see
the warning although nothing retraces. A partial of the method is keyed by itself: each
object's compiled method is counted alone, and real retracing of one still warns.

Dispatch: `tf.function.__call__` spends about 0.13 ms of Python per call building the
arguments' trace types before it finds its concrete function (docs/performance.md, "Session
6"); a stage makes two to three such calls per minibatch on the pipeline's critical path.
The wrapper keys the arguments itself (containers, tensor dtypes and shapes, Python
scalars; one walk that also collects the tensors) and calls the `ConcreteFunction` that
`tf.function` traced for that key on the arguments' tensors in `tf.nest` order (checked
against the concrete function's own binding when the key is first seen; binding on every
call cost about another 0.1 ms). A new key
goes through `tf.function` (tracing, retracing warnings) first. Only eager,
positional calls outside a distribution strategy's scope take the short way: there
`tf.function` keys on the arguments alone (in a graph or a strategy's scope it keys on
more, e.g. the device). Everything else goes through `tf.function` as before: keyword
arguments, `tf.config.run_functions_eagerly(True)`, arguments the wrapper cannot key
(other than tensors, None, Python scalars and strings of exactly those types, and lists,
tuples and dicts of these), a key whose binding is not the flat one, and new keys past 64
(shapes that `reduce_retracing` folds into one trace).
"""

from __future__ import annotations

import functools
from typing import Any, Callable

import tensorflow as tf

from hetpipe_tf._shim import tf_eager

_UNKEYED = object()   # an argument the wrapper does not key: call tf.function
_BY_FUNCTION = object()   # a key whose calls go through tf.function (see __call__)
_SCALARS = (type(None), bool, int, float, str)   # exact types: tf.function keys these by value
_MAX_KEYS = 64   # more argument keys than this (shapes under reduce_retracing): tf.function


def _key(x, tensors: list) -> Any:
    """`x`'s key; its tensors are appended to `tensors` in `tf.nest` order (dict keys
    sorted), so one walk gives both."""
    if isinstance(x, tf.Tensor) and not isinstance(x, tf.Variable):
        tensors.append(x)
        return (x.dtype, tuple(x.shape))
    if type(x) in _SCALARS:   # not subclasses: tf.function takes a NumPy float as a tensor
        return (type(x), x)
    if type(x) in (list, tuple):
        parts = tuple(_key(e, tensors) for e in x)
        return _UNKEYED if _UNKEYED in parts else (type(x), parts)
    if type(x) is dict and all(type(k) is str for k in x):
        parts = tuple((k, _key(x[k], tensors)) for k in sorted(x))
        return _UNKEYED if any(p[1] is _UNKEYED for p in parts) else (dict, parts)
    return _UNKEYED


class CompiledMethod:
    """A `tf.function` called through a concrete function per argument key."""

    def __init__(self, function, name: str):
        self.function = function
        self._name = name   # the profiler's annotation, as tf.function's own calls have
        # key -> the concrete function, called on the flat tensors; or _BY_FUNCTION where
        # that is not the concrete function's own binding of the arguments.
        self._concrete: dict = {}

    def __call__(self, *args, **kwargs):
        if (kwargs or not tf.executing_eagerly() or tf.config.functions_run_eagerly()
                or tf.distribute.has_strategy()):
            return self.function(*args, **kwargs)
        flat: list = []
        key = _key(args, flat)
        if key is _UNKEYED:
            return self.function(*args)
        concrete = self._concrete.get(key)
        if concrete is None:
            out = self.function(*args)   # traces (and warns about retracing) here
            if len(self._concrete) < _MAX_KEYS:
                self._concrete[key] = self._flat_callable(args, flat)
            return out
        if concrete is _BY_FUNCTION:
            return self.function(*args)
        with tf.profiler.experimental.Trace(self._name, tf_function_call="concrete"):
            return tf_eager.call_concrete_flat(concrete, flat)

    def _flat_callable(self, args: tuple, flat: list):
        """The concrete function for `args` if it binds them as the tensors `flat` (what
        `_key` collected), else _BY_FUNCTION (also if finding out fails: the call itself
        already ran)."""
        try:
            concrete = self.function.get_concrete_function(*args)
            bound = tf_eager.concrete_flat_inputs(concrete, args)
        except Exception:  # noqa: BLE001 - only the short way is lost
            return _BY_FUNCTION
        if len(bound) == len(flat) and all(a is b for a, b in zip(bound, flat)):
            return concrete
        return _BY_FUNCTION

    def get_concrete_function(self, *args, **kwargs):
        return self.function.get_concrete_function(*args, **kwargs)


def compiled_method(method: Callable[..., Any], **kwargs: Any) -> CompiledMethod:
    """`tf.function(method, **kwargs)` for a bound method, tracked per object."""
    return CompiledMethod(tf.function(functools.partial(method.__func__, method.__self__),
                                      **kwargs), method.__qualname__)
