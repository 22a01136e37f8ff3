"""Named Keras models for the binaries, examples and tests (all built with weights=None).

The keras.applications models are the paper's (VGG-19, ResNet-152) and their smaller
siblings; the small ones train in seconds on a CPU and still have the structures the
runtime must handle (skip connections, BatchNorm, Dropout). The nested ones are built as
users build them: "resnet50_transfer" wraps a ResNet50 base as one layer, "gpt_decoder" is
a keras_hub-style CausalLM (a Functional backbone of Functional transformer layers under an
LM head); plans cut inside their nested parts.
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


def _resnet50_transfer(input_size: int, num_classes: int) -> keras.Model:
    """Transfer learning as Keras documents it: a ResNet50 base used as one layer of the
    model, under a new head (the base is nested; plans cut inside it)."""
    base = keras.applications.ResNet50(include_top=False, weights=None,
                                       input_shape=(input_size, input_size, 3))
    inputs = keras.Input((input_size, input_size, 3), name="images")
    x = base(inputs)
    x = keras.layers.GlobalAveragePooling2D(name="pool")(x)
    outputs = keras.layers.Dense(num_classes, activation="softmax", name="predictions")(x)
    return keras.Model(inputs, outputs, name="resnet50_transfer")


class PositionEmbedding(keras.layers.Layer):
    """A learned embedding of each position, added to its input (as GPT-2's)."""

    def __init__(self, max_length: int, **kwargs):
        super().__init__(**kwargs)
        self.max_length = max_length

    def build(self, input_shape):
        self.embeddings = self.add_weight(shape=(self.max_length, input_shape[-1]),
                                          initializer="glorot_uniform", name="embeddings")

    def call(self, x):
        return x + self.embeddings[: keras.ops.shape(x)[1]]

    def get_config(self):
        return {**super().get_config(), "max_length": self.max_length}


def _decoder_block(index: int, width: int, heads: int) -> keras.Model:
    """A pre-norm causal self-attention + MLP block, as a Functional model of its own."""
    x = keras.Input((None, width))
    h = keras.layers.LayerNormalization(name="attn_norm")(x)
    h = keras.layers.MultiHeadAttention(heads, width // heads, name="attention")(
        h, h, use_causal_mask=True)
    x1 = keras.layers.Add(name="attn_residual")([x, h])
    h = keras.layers.LayerNormalization(name="mlp_norm")(x1)
    h = keras.layers.Dense(4 * width, activation="gelu", name="mlp_in")(h)
    h = keras.layers.Dense(width, name="mlp_out")(h)
    return keras.Model(x, keras.layers.Add(name="mlp_residual")([x1, h]),
                       name=f"transformer_layer_{index}")


def gpt_decoder(sequence_length: int = 64, vocabulary_size: int = 1000, num_layers: int = 4,
                width: int = 128, heads: int = 4) -> keras.Model:
    """A small GPT-style decoder made like a keras_hub CausalLM: a Functional backbone with
    an open sequence length (token embedding, positions, transformer layers that are
    Functional models themselves, a final norm) used as one layer under an LM head."""
    tokens = keras.Input((None,), dtype="int32", name="token_ids")
    x = keras.layers.Embedding(vocabulary_size, width, name="token_embedding")(tokens)
    x = PositionEmbedding(max(sequence_length, 1024), name="position_embedding")(x)
    for i in range(num_layers):
        x = _decoder_block(i, width, heads)(x)
    x = keras.layers.LayerNormalization(name="final_norm")(x)
    backbone = keras.Model(tokens, x, name="gpt_backbone")
    inputs = keras.Input((sequence_length,), dtype="int32", name="token_ids")
    logits = keras.layers.Dense(vocabulary_size, name="lm_head")(backbone(inputs))
    return keras.Model(inputs, logits, name="gpt_decoder")


_SMALL: dict[str, Callable[[int, int], keras.Model]] = {
    "mlp": _mlp, "small_cnn": _small_cnn, "small_resnet": _small_resnet,
    "resnet50_transfer": _resnet50_transfer,
    "gpt_decoder": lambda size, classes: gpt_decoder(size, classes),
}
MODEL_NAMES = tuple(sorted(_APPLICATIONS) + sorted(_SMALL))
# Image side, feature count (mlp) or sequence length (gpt_decoder; num_classes = vocabulary).
DEFAULT_INPUT_SIZE = {"mlp": 32, "small_cnn": 32, "small_resnet": 32,
                      "resnet50_transfer": 224, "gpt_decoder": 64}


def build_model(name: str, *, input_size: int | None = None, num_classes: int = 1000
                ) -> keras.Model:
    """A fresh, randomly initialised model by name (see MODEL_NAMES).

    `input_size` is the image side (feature count for "mlp", sequence length for
    "gpt_decoder", whose vocabulary is `num_classes`); None = the model's default
    (DEFAULT_INPUT_SIZE; 224 for keras.applications models).
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
