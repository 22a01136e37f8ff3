"""Keras variables and optimizers as the virtual workers share and update them (Keras 3.15).

The tf.Variable behind a Keras variable, the optimizer's learning-rate object (shared by
every VW's optimizer), the strategy an optimizer was made under, the optimizer whose slots
are being built, and updates written by value instead of in place.
"""

from __future__ import annotations

import re
from typing import Any

import keras
import tensorflow as tf


def variable_handle(v: Any) -> Any:
    """The tf.Variable behind a Keras variable."""
    # Reason: tf.Variable is what ops, devices and copy-on-write snapshots work on.
    return v.value if isinstance(v, keras.Variable) else v


def optimizer_learning_rate(optimizer: Any) -> Any:
    """The optimizer's learning-rate object: a Variable, a schedule or a callable."""
    # Reason: `optimizer.learning_rate` evaluates a schedule; the VWs must share the object.
    return optimizer._learning_rate


def set_optimizer_learning_rate(optimizer: Any, value: Any) -> None:
    """Make `optimizer` use `value` (another optimizer's Variable or schedule) as is."""
    # Reason: the public setter assigns a float into the optimizer's own variable instead.
    optimizer._learning_rate = value


def stand_in_for(copy: Any, original: Any) -> None:
    """Give a virtual worker's tf.Variable copy of a model variable the model variable's
    Keras `path`, which some optimizers read to choose their rule per variable (Muon's
    exclude_layers)."""
    # Reason: Keras optimizers expect Keras Variables; the copies are plain tf.Variables.
    copy.path = getattr(original, "path", original.name)


def is_auto_named(variable: Any) -> bool:
    """Whether Keras named the variable by a counter ("variable", "variable_3"), as an
    optimizer's own state made without a name (Nadam's u_product), not a slot named after
    the model variable it belongs to."""
    # Reason: Keras gives unnamed variables "variable" plus a per-process counter, so two
    # optimizers' copies of the same state carry different names.
    return re.fullmatch(r"variable(_\d+)?", variable.name) is not None


def optimizer_strategy(optimizer: Any) -> Any:
    """The tf.distribute strategy the optimizer was created under."""
    # Reason: Keras keeps it privately; an optimizer made outside our scope must be refused
    # before Keras builds its slots (TensorFlow's own error there names no fix).
    return getattr(optimizer, "_distribution_strategy", None)


def building_optimizer(frame: Any) -> Any:
    """The Keras optimizer whose slot variables are being created in `frame` or above."""
    # Reason: the model's own optimizer keeps its slots on the host (the stages train with
    # optimizers of their own); Keras builds it at fit's symbolic build, not when we ask.
    while frame is not None:
        if frame.f_code.co_name == "add_variable_from_reference":
            owner = frame.f_locals.get("self")
            if isinstance(owner, keras.optimizers.Optimizer):
                return owner
        frame = frame.f_back
    return None


def write_by_value(optimizer: Any, variables: Any) -> None:
    """Make `optimizer` update `variables` as `v.assign(v - x)` (a new buffer that the
    variable adopts) instead of `v.assign_sub(x)` (in place), for dense values. Same values,
    bit for bit. While a weight version still shares a variable's buffer, in place means
    copy-on-write: a full copy, then the update over it (3.5 vs 1.9 ms for 13 x 512x512
    variables on this project's machine, docs/performance.md)."""
    # Reason: Keras optimizers write through their own assign_add / assign_sub methods
    # (public, for backend-specific writes); the instance's pair is replaced, not the class's.
    ids = {id(variable_handle(v)) for v in variables}
    in_place_add, in_place_sub = optimizer.assign_add, optimizer.assign_sub

    def by_value(in_place, op):
        def write(variable, value):
            handle = variable_handle(variable)
            if id(handle) not in ids or isinstance(value, tf.IndexedSlices):
                return in_place(variable, value)
            handle.assign(op(handle, tf.cast(value, handle.dtype)))
        return write

    optimizer.assign_add = by_value(in_place_add, tf.add)
    optimizer.assign_sub = by_value(in_place_sub, tf.subtract)
