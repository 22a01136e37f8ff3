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
scalars) and calls the `ConcreteFunction` that `tf.function` traced for that key on the
arguments' tensors in `tf.nest` order (checked against the concrete function's own binding
when the key is first seen; binding on every call cost about another 0.1 ms). A new key
goes through `tf.function` (tracing, retracing warnings) first. Only eager calls
outside a distribution strategy's scope take the short way: there `tf.function` keys on the
arguments alone (in a graph or a strategy's scope it keys on more, e.g. the device).
Arguments the wrapper cannot key (other than tensors, None, Python scalars, strings and
lists, tuples and dicts of these) go through `tf.function` too.
"""

from __future__ import annotations

import functools
from typing import Any, Callable

import tensorflow as tf

from hetpipe_tf import _keras_shim as keras_shim

_UNKEYED = object()   # an argument the wrapper does not key: call tf.function


def _key(x) -> Any:
    if isinstance(x, tf.Tensor) and not isinstance(x, tf.Variable):
        return (x.dtype, tuple(x.shape))
    if x is None or isinstance(x, (bool, int, float, str)):
        return (type(x), x)
    if isinstance(x, (list, tuple)):
        parts = tuple(_key(e) for e in x)
        return _UNKEYED if _UNKEYED in parts else (type(x), parts)
    if isinstance(x, dict) and all(isinstance(k, str) for k in x):
        parts = tuple((k, _key(x[k])) for k in sorted(x))
        return _UNKEYED if any(p[1] is _UNKEYED for p in parts) else (dict, parts)
    return _UNKEYED


class CompiledMethod:
    """A `tf.function` called through a concrete function per argument key."""

    def __init__(self, function):
        self.function = function
        # key -> (concrete function, flat call: True if binding the arguments is the same
        # as flattening them, checked when the key is first seen)
        self._concrete: dict = {}

    def __call__(self, *args):
        if not tf.executing_eagerly() or tf.distribute.has_strategy():
            return self.function(*args)
        key = _key(args)
        if key is _UNKEYED:
            return self.function(*args)
        found = self._concrete.get(key)
        if found is None:
            out = self.function(*args)   # traces (and warns about retracing) here
            concrete = self.function.get_concrete_function(*args)
            bound = keras_shim.concrete_flat_inputs(concrete, args)
            flat = _tensors(args)
            self._concrete[key] = (concrete, len(bound) == len(flat)
                                   and all(a is b for a, b in zip(bound, flat)))
            return out
        concrete, flat_call = found
        if flat_call:
            return keras_shim.call_concrete_flat(concrete, _tensors(args))
        return concrete(*args)

    def get_concrete_function(self, *args):
        return self.function.get_concrete_function(*args)


def _tensors(args: tuple) -> list:
    """The tensors of keyed `args` in `tf.nest` order (what a concrete function takes)."""
    return [x for x in tf.nest.flatten(args) if isinstance(x, tf.Tensor)]


def compiled_method(method: Callable[..., Any], **kwargs: Any) -> CompiledMethod:
    """`tf.function(method, **kwargs)` for a bound method, tracked per object."""
    return CompiledMethod(tf.function(functools.partial(method.__func__, method.__self__),
                                      **kwargs))
