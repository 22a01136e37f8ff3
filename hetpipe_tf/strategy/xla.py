"""`compile(jit_compile=...)` under the strategy: XLA per stage, Keras' own step without it.

What the model asks for is `model.jit_compile` as Keras resolved it: `True`, `False`, or
`"auto"` resolved by Keras 3 at `compile()` (for TensorFlow: False on a machine with no
device other than CPUs, False under any `tf.distribute` strategy, this one included, else
True when every layer `supports_jit`; a layer that does not turns an explicit True into
False with Keras' own warning). With True:

* every stage's forward and backward (the forward of a non-last stage and the backward
  TensorFlow derives for it; the last stage's, a micro-batch's and the in-graph stage's
  forward-loss-backward) is a `tf.function(jit_compile=True)` (pipeline/stage.py), so XLA
  compiles it on the stage's device; the metrics' updates and the optimizer's apply are
  not (their variables sit on other devices);
* Keras' own train, test and predict functions are made WITHOUT `jit_compile`: the train
  step hands batches to the stage threads through a `tf.py_function` and evaluate's step
  drains the pipeline through one, which XLA cannot compile; and evaluate's and predict's
  steps read the model's variables, which a plan puts on several devices, where one XLA
  cluster cannot read them. So evaluate and predict run as with jit_compile=False.

An op XLA cannot compile in a stage fails the first minibatch with TensorFlow's
`InvalidArgumentError` ("Detected unsupported operations when trying to compile graph"),
as plain Keras fails its first step with jit_compile=True; nothing is applied.
"""

from __future__ import annotations

import contextlib


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

