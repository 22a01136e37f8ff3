"""`tf.function` of one object's method, counted as a function of its own.

TensorFlow warns about "excessive retracing" per Python code object, so N objects of one
class that each trace their method once (the stages of several virtual workers, their
weights, the parameter servers) look like one function retracing N times, and users see
the warning although nothing retraces. A partial of the method is keyed by itself: each
object's compiled method is counted alone, and real retracing of one still warns.
"""

from __future__ import annotations

import functools
from typing import Any, Callable

import tensorflow as tf


def compiled_method(method: Callable[..., Any], **kwargs: Any) -> Callable[..., Any]:
    """`tf.function(method, **kwargs)` for a bound method, tracked per object."""
    return tf.function(functools.partial(method.__func__, method.__self__), **kwargs)
