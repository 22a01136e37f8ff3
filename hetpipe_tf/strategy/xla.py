"""`compile(jit_compile=...)` under the strategy: XLA per stage, Keras' own step without it.

What the model asks for is `model.jit_compile` as Keras resolved it: `True`, `False`, or
`"auto"` resolved by Keras 3 at `compile()` (for TensorFlow: False on a machine with no
device other than CPUs, False under any `tf.distribute` strategy, this one included, else
True when every layer `supports_jit`; a layer that does not turns an explicit True into
False with Keras' own warning). With True:

* every stage's compiled task (the forward of a non-last stage and the backward TensorFlow
  derives for it, the last stage's forward, loss, backward and metrics, a micro-batch's
  task, the in-graph stage's task) is a `tf.function(jit_compile=True)`
  (pipeline/stage.py), so XLA compiles it on the stage's device;
* Keras' own train and test functions are made WITHOUT `jit_compile`: the train step hands
  batches to the stage threads through a `tf.py_function` and evaluate's step drains the
  pipeline through one, which XLA cannot compile. Evaluate's test step itself is compiled
  with XLA around the drain (`test_step`); predict runs Keras' own function, whose
  predict step Keras compiles with XLA.

An op XLA cannot compile in a stage fails the first minibatch with TensorFlow's
`InvalidArgumentError` ("Detected unsupported operations when trying to compile graph"),
as plain Keras fails its first step with jit_compile=True; nothing is applied.
"""

from __future__ import annotations

import contextlib

import tensorflow as tf


def requested(model) -> bool:
    """Whether `model`'s stages run with XLA: its `jit_compile` as Keras resolved it."""
    return getattr(model, "jit_compile", False) is True


@contextlib.contextmanager
def keras_step_without_xla(model):
    """Within this context Keras makes its step functions without XLA (module docstring);
    the model's `jit_compile` reads as before afterwards."""
    value = model.jit_compile
    if value is not True:
        yield
        return
    model.jit_compile = False
    try:
        yield
    finally:
        model.jit_compile = value   # accepted as it was: the layers have not changed


def test_step(model, fn):
    """Keras' bound `test_step` compiled with XLA when the model asks for it, else `fn`."""
    if not requested(model):
        return fn
    return tf.function(fn, jit_compile=True, autograph=False)
