"""The Keras train step the strategy traces in place of the model's own (extended.py):
recognising Keras' step functions, and the `tf.py_function` that hands each batch to a
threaded executor and returns the logs of the last completed minibatch."""

from __future__ import annotations

import inspect
from typing import Callable

import keras
import numpy as np
import tensorflow as tf

from hetpipe_tf.strategy.validation import check_batch_fits


def submitting_step(runtime, training, data, refuse: Callable[[BaseException], None]
                    ) -> dict:
    """The traced step of a threaded executor: `data` goes to `runtime.submit` through a
    py_function (returning at once unless the pipeline is full); the outputs are the
    compiled metrics as of the last completed minibatch. `training`: the model's
    `build.Training`; `refuse(error)` records a batch refused inside the step, for the
    guarded fit to re-raise as itself."""
    flat = tf.nest.flatten(data)
    present = [i for i, t in enumerate(flat) if t is not None]
    structure = data
    spec = training.metrics_result()  # traced only for the logs' names, dtypes, shapes
    keys = list(spec.keys())
    dtypes = [tf.as_dtype(spec[k].dtype) for k in keys]
    shapes = [spec[k].shape for k in keys]
    np_dtypes = [d.as_numpy_dtype for d in dtypes]
    program = training.program
    # An open batch dimension (an epoch's remainder, generators): each batch is checked
    # against the planned size when it arrives; smaller ones run as they are.
    open_batch = any(flat[i].shape.rank and flat[i].shape[0] is None for i in present)

    def submit(*tensors):
        full = [None] * len(flat)
        for i, t in zip(present, tensors):
            full[i] = t
        if open_batch and tensors and tensors[0].shape.rank:
            try:
                check_batch_fits(int(tensors[0].shape[0]), training.batch_size)
            except ValueError as e:   # re-raised as itself by the guarded fit
                refuse(e)
                raise
        batch = tf.nest.pack_sequence_as(structure, full)
        x, y, sw = keras.utils.unpack_x_y_sample_weight(batch)
        runtime.submit(program.model_inputs(x), y, sw)
        logs = runtime.logs
        if logs is None:
            return [tf.zeros(s, d) for s, d in zip(shapes, dtypes)]
        # Host values (`_set_logs`): handed back as NumPy, no eager cast op per metric.
        return [np.asarray(logs[k], d) for k, d in zip(keys, np_dtypes)]

    out = tf.py_function(submit, [flat[i] for i in present], Tout=dtypes)
    for t, s in zip(out, shapes):
        t.set_shape(s)
    return dict(zip(keys, out))


def identity_or_keep(t):
    return tf.identity(t) if isinstance(t, tf.Tensor) else t


def from_keras_or_tf(fn) -> bool:
    """Whether `fn` is Keras' or TensorFlow's own (Keras' predict runs a closure of its own
    around predict_step), not a user's step function."""
    module = getattr(inspect.unwrap(fn), "__module__", None) or ""
    return module.split(".")[0] in ("keras", "tensorflow", "tf_keras")


def bound_step(fn):
    """(model, method name) when fn is a Keras model's bound step method, else (None, None)."""
    f = fn
    for _ in range(5):
        self_ = getattr(f, "__self__", None)
        if isinstance(self_, keras.Model):
            return self_, getattr(f, "__name__", None)
        nxt = getattr(f, "__wrapped__", None)
        if nxt is None:
            break
        f = nxt
    return None, None
