"""Per-sample input shapes for a model whose keras.Input leaves a dimension open (keras_hub
tasks: the sequence length), set by the strategy from the first batch before planning and
read when the layer graph is built."""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

import keras

# The model attribute that holds them.
_INPUT_SHAPES = "_hetpipe_input_shapes"


def set_input_shapes(model: keras.Model, shapes: Sequence[Sequence[int]]) -> None:
    """Build `model`'s layer graph (and so its plan and stages' costs) with these per-sample
    shapes of its inputs (in the order of its Input layers) where its Inputs leave a
    dimension open; later `from_model` calls of this model use them."""
    object.__setattr__(model, _INPUT_SHAPES, tuple(tuple(int(d) for d in s) for s in shapes))


def input_shapes_set(model: keras.Model) -> tuple[tuple[int, ...], ...] | None:
    """The shapes `set_input_shapes` gave `model`, or None."""
    return model.__dict__.get(_INPUT_SHAPES)


def fixed_input(tensor: Any, given: Sequence[int] | None) -> Any:
    """`tensor`'s spec with its open per-sample dimensions taken from `given`."""
    shape = tuple(tensor.shape)
    if given is None or None not in shape[1:]:
        return tensor
    if len(given) != len(shape) - 1 or any(
            d is not None and d != g for d, g in zip(shape[1:], given)):
        raise ValueError(
            "The shapes given for the model's open input dimensions do not match its Input. "
            f"Received: Input shape={shape}, per-sample shape={tuple(given)}; feed batches "
            "whose shape matches the model's Input.")
    return keras.KerasTensor((None, *given), dtype=tensor.dtype)
