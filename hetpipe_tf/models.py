"""Named Keras models for the binaries, examples and tests (all built with weights=None).

The keras.applications models are the paper's (VGG-19, ResNet-152) and their smaller
siblings; the small ones train in seconds on a CPU and still have the structures the
runtime must handle (skip connections, BatchNorm, Dropout).
"""

from __future__ import annotations

from typing import Callable

import keras

_APPLICATIONS: dict[str, Callable[..., keras.Model]] = {
    "vgg16": keras.applications.VGG16,
    "vgg19": keras.applications.VGG19,
    "resnet50": keras.applications.ResNet50,
    "resnet101": keras.applications.ResNet101,
    "resnet152": keras.applications.ResNet152,
}


def _mlp(input_size: int, num_classes: int) -> keras.Model:
    inputs = keras.Input((input_size,), name="features")
    x = keras.layers.Dense(64, activation="relu", name="dense_1")(inputs)
    x = keras.layers.Dense(64, activation="relu", name="dense_2")(x)
    x = keras.layers.Dense(64, activation="relu", name="dense_3")(x)
    outputs = keras.layers.Dense(num_classes, activation="softmax", name="predictions")(x)
    return keras.Model(inputs, outputs, name="mlp")


def _small_cnn(input_size: int, num_classes: int) -> keras.Model:
    inputs = keras.Input((input_size, input_size, 3), name="images")
    x = keras.layers.Conv2D(16, 3, padding="same", activation="relu", name="conv_1")(inputs)
    x = keras.layers.MaxPooling2D(name="pool_1")(x)
    x = keras.layers.Conv2D(32, 3, padding="same", activation="relu", name="conv_2")(x)
    x = keras.layers.MaxPooling2D(name="pool_2")(x)
    x = keras.layers.Flatten(name="flatten")(x)
    x = keras.layers.Dense(64, activation="relu", name="dense")(x)
    x = keras.layers.Dropout(0.2, name="dropout")(x)
    outputs = keras.layers.Dense(num_classes, activation="softmax", name="predictions")(x)
    return keras.Model(inputs, outputs, name="small_cnn")


def _small_resnet(input_size: int, num_classes: int) -> keras.Model:
    """Two residual blocks with BatchNorm: skip connections that can cross stage cuts."""
    inputs = keras.Input((input_size, input_size, 3), name="images")
    x = keras.layers.Conv2D(16, 3, padding="same", name="stem_conv")(inputs)
    x = keras.layers.BatchNormalization(name="stem_bn")(x)
    x = keras.layers.ReLU(name="stem_relu")(x)
    for b in range(2):
        y = keras.layers.Conv2D(16, 3, padding="same", name=f"block{b}_conv1")(x)
        y = keras.layers.BatchNormalization(name=f"block{b}_bn1")(y)
        y = keras.layers.ReLU(name=f"block{b}_relu1")(y)
        y = keras.layers.Conv2D(16, 3, padding="same", name=f"block{b}_conv2")(y)
        y = keras.layers.BatchNormalization(name=f"block{b}_bn2")(y)
        x = keras.layers.Add(name=f"block{b}_add")([x, y])
        x = keras.layers.ReLU(name=f"block{b}_out")(x)
    x = keras.layers.GlobalAveragePooling2D(name="pool")(x)
    outputs = keras.layers.Dense(num_classes, activation="softmax", name="predictions")(x)
    return keras.Model(inputs, outputs, name="small_resnet")


_SMALL: dict[str, Callable[[int, int], keras.Model]] = {
    "mlp": _mlp, "small_cnn": _small_cnn, "small_resnet": _small_resnet,
}
MODEL_NAMES = tuple(sorted(_APPLICATIONS) + sorted(_SMALL))
DEFAULT_INPUT_SIZE = {"mlp": 32, "small_cnn": 32, "small_resnet": 32}


def build_model(name: str, *, input_size: int | None = None, num_classes: int = 1000
                ) -> keras.Model:
    """A fresh, randomly initialised model by name (see MODEL_NAMES).

    `input_size` is the image side (or feature count for "mlp"); None = the model's default
    (224 for keras.applications models, 32 for the small ones).
    """
    key = name.lower()
    if key in _APPLICATIONS:
        size = input_size or 224
        return _APPLICATIONS[key](weights=None, input_shape=(size, size, 3),
                                  classes=num_classes)
    if key in _SMALL:
        return _SMALL[key](input_size or DEFAULT_INPUT_SIZE[key], num_classes)
    raise ValueError(f"Unknown model name. Received: name={name!r}; use one of "
                     f"{', '.join(MODEL_NAMES)}.")
