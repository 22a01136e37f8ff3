r"""Nine small Keras programs of the kinds users write, each run plain and with the one-line
switch to HetPipeStrategy, from the same seeds and initial weights:

  python -m experiments.keras_programs
  python -m experiments.keras_programs --programs=imbalanced_mlp,augmentation --epochs=3

The programs (written here; data are generated arrays of the real shapes, 2 epochs):
a convnet on MNIST-shaped digits, a text classifier with a Transformer block, a timeseries
convnet, an imbalanced-classification MLP with `class_weight`, a convolutional
autoencoder, an LSTM seq2seq with RMSprop, the functional API's multi-input/multi-output
model, image classification with augmentation layers in the model, and a VAE whose KL term
goes through a layer's `add_loss` (a custom `train_step` is refused, docs/strategy.md).

Each runs under three settings that differ only in the strategy line:
- `plain`: no strategy;
- `default`: `HetPipeStrategy(Cluster.local(["LOCAL_CPU"] * 2))` (the planner plans at the
  first fit and chooses N_m and the compensation);
- `none`: the same with `n_m=1, compensation="none"` (docs promise plain Keras's weights).
Prints one row per program: whether the default switch ran unchanged (fit, evaluate and
predict, finite losses) and the N_m the planner chose, max |dw| of `none` against plain
Keras, and the training loss per epoch under each setting. A program that fails prints its error in its row. Asserts
nothing (tests/experiments/test_keras_programs.py asserts the promises on a subset).
"""

from __future__ import annotations

import contextlib
import dataclasses
import math
import os
import time
from typing import Callable

os.environ.setdefault("TF_CPP_MIN_LOG_LEVEL", "3")

import keras  # noqa: E402
import numpy as np  # noqa: E402
from absl import app, flags  # noqa: E402

import hetpipe_tf as hp  # noqa: E402

ROWS, BATCH = 128, 32


# --- the programs: each builds and compiles its model, and returns its fit data ----------
def mnist_convnet():
    layers = keras.layers
    model = keras.Sequential([
        keras.Input((28, 28, 1)),
        layers.Conv2D(8, 3, activation="relu"), layers.MaxPooling2D(2),
        layers.Conv2D(16, 3, activation="relu"), layers.MaxPooling2D(2),
        layers.Flatten(), layers.Dropout(0.5), layers.Dense(10, activation="softmax")])
    model.compile(keras.optimizers.Adam(1e-3), "sparse_categorical_crossentropy",
                  metrics=["accuracy"])
    x = _rs().rand(ROWS, 28, 28, 1).astype("float32")
    y = (x[:, 10:18, 10:18, 0].mean(axis=(1, 2)) * 10).astype("int32") % 10
    return model, dict(x=x, y=y)


class TokenAndPosition(keras.layers.Layer):
    """Token embedding plus a learned position embedding (a custom layer)."""

    def __init__(self, maxlen: int, vocab: int, dim: int, **kwargs):
        super().__init__(**kwargs)
        self.tokens = keras.layers.Embedding(vocab, dim)
        self.positions = keras.layers.Embedding(maxlen, dim)

    def call(self, x):
        return self.tokens(x) + self.positions(keras.ops.arange(keras.ops.shape(x)[-1]))


def transformer_text():
    layers = keras.layers
    maxlen, vocab, dim = 32, 200, 16
    x_in = keras.Input((maxlen,), dtype="int32")
    h = TokenAndPosition(maxlen, vocab, dim)(x_in)
    att = layers.MultiHeadAttention(num_heads=2, key_dim=dim)(h, h)
    h = layers.LayerNormalization(epsilon=1e-6)(h + layers.Dropout(0.1)(att))
    ffn = layers.Dense(dim)(layers.Dense(32, activation="relu")(h))
    h = layers.LayerNormalization(epsilon=1e-6)(h + layers.Dropout(0.1)(ffn))
    h = layers.Dropout(0.1)(layers.GlobalAveragePooling1D()(h))
    h = layers.Dropout(0.1)(layers.Dense(20, activation="relu")(h))
    model = keras.Model(x_in, layers.Dense(2, activation="softmax")(h))
    model.compile("adam", "sparse_categorical_crossentropy", metrics=["accuracy"])
    x = _rs().randint(0, vocab, (ROWS, maxlen)).astype("int32")
    y = (x[:, :4].mean(axis=1) > vocab / 2).astype("int32")
    return model, dict(x=x, y=y)


def timeseries_convnet():
    layers = keras.layers
    x_in = keras.Input((100, 1))
    h = x_in
    for _ in range(2):
        h = layers.ReLU()(layers.BatchNormalization()(layers.Conv1D(16, 3, padding="same")(h)))
    h = layers.GlobalAveragePooling1D()(h)
    model = keras.Model(x_in, layers.Dense(2, activation="softmax")(h))
    model.compile("adam", "sparse_categorical_crossentropy", metrics=["sparse_categorical_accuracy"])
    t = _rs().randn(ROWS, 100, 1).astype("float32")
    return model, dict(x=t, y=(t[:, :50].mean(axis=(1, 2)) > 0).astype("int32"))


def imbalanced_mlp():
    layers = keras.layers
    model = keras.Sequential([
        keras.Input((30,)), layers.Dense(64, activation="relu"),
        layers.Dense(64, activation="relu"), layers.Dropout(0.3),
        layers.Dense(64, activation="relu"), layers.Dropout(0.3),
        layers.Dense(1, activation="sigmoid")])
    model.compile(keras.optimizers.Adam(1e-2), "binary_crossentropy",
                  metrics=[keras.metrics.Precision(), keras.metrics.Recall()])
    x = _rs().randn(ROWS, 30).astype("float32")
    y = (x[:, 0] + 0.3 * x[:, 1] > 1.3).astype("float32")   # about 1 in 10 positive
    return model, dict(x=x, y=y, class_weight={0: 1.0, 1: 10.0})


def conv_autoencoder():
    layers = keras.layers
    x_in = keras.Input((28, 28, 1))
    h = layers.MaxPooling2D(2, padding="same")(layers.Conv2D(8, 3, activation="relu",
                                                             padding="same")(x_in))
    h = layers.MaxPooling2D(2, padding="same")(layers.Conv2D(8, 3, activation="relu",
                                                             padding="same")(h))
    h = layers.Conv2DTranspose(8, 3, strides=2, activation="relu", padding="same")(h)
    h = layers.Conv2DTranspose(8, 3, strides=2, activation="relu", padding="same")(h)
    model = keras.Model(x_in, layers.Conv2D(1, 3, activation="sigmoid", padding="same")(h))
    model.compile("adam", "binary_crossentropy")
    x = _digits()
    return model, dict(x=x, y=x)


def lstm_seq2seq():
    layers = keras.layers
    enc_tokens, dec_tokens, latent = 20, 24, 32
    enc_in = keras.Input((None, enc_tokens))
    _, state_h, state_c = layers.LSTM(latent, return_state=True)(enc_in)
    dec_in = keras.Input((None, dec_tokens))
    dec, _, _ = layers.LSTM(latent, return_sequences=True, return_state=True)(
        dec_in, initial_state=[state_h, state_c])
    model = keras.Model([enc_in, dec_in], layers.Dense(dec_tokens, activation="softmax")(dec))
    model.compile(keras.optimizers.RMSprop(), "categorical_crossentropy", metrics=["accuracy"])
    rs = _rs()
    src = rs.randint(0, enc_tokens, (ROWS, 12))
    tgt = (src[:, ::-1][:, :10] + 1) % dec_tokens
    eye_e, eye_d = np.eye(enc_tokens, dtype="float32"), np.eye(dec_tokens, dtype="float32")
    dec_input = np.concatenate([np.zeros((ROWS, 1), int), tgt[:, :-1]], axis=1)
    return model, dict(x=[eye_e[src], eye_d[dec_input]], y=eye_d[tgt])


def multi_io():
    layers = keras.layers
    words, tags, departments = 100, 12, 4
    title = keras.Input((None,), name="title")
    body = keras.Input((None,), name="body")
    tags_in = keras.Input((tags,), name="tags")
    t = layers.LSTM(16)(layers.Embedding(words, 16)(title))
    b = layers.LSTM(8)(layers.Embedding(words, 16)(body))
    h = layers.concatenate([t, b, tags_in])
    model = keras.Model([title, body, tags_in],
                        {"priority": layers.Dense(1, name="priority")(h),
                         "department": layers.Dense(departments, name="department")(h)})
    model.compile(keras.optimizers.RMSprop(1e-3),
                  loss={"priority": keras.losses.BinaryCrossentropy(from_logits=True),
                        "department": keras.losses.CategoricalCrossentropy(from_logits=True)},
                  loss_weights={"priority": 1.0, "department": 0.2})
    rs = _rs()
    x = {"title": rs.randint(words, size=(ROWS, 10)), "body": rs.randint(words, size=(ROWS, 50)),
         "tags": rs.randint(2, size=(ROWS, tags)).astype("float32")}
    y = {"priority": rs.random_sample((ROWS, 1)).astype("float32"),
         "department": np.eye(departments, dtype="float32")[rs.randint(departments, size=ROWS)]}
    return model, dict(x=x, y=y)


def augmentation():
    layers = keras.layers
    augment = keras.Sequential([layers.RandomFlip("horizontal"), layers.RandomRotation(0.1)])
    x_in = keras.Input((32, 32, 3))
    h = layers.Rescaling(1.0 / 255)(augment(x_in))
    h = layers.Activation("relu")(layers.BatchNormalization()(
        layers.Conv2D(16, 3, strides=2, padding="same")(h)))
    residual = h
    h = layers.Activation("relu")(layers.BatchNormalization()(
        layers.SeparableConv2D(32, 3, padding="same")(h)))
    h = layers.MaxPooling2D(3, strides=2, padding="same")(h)
    h = layers.add([h, layers.Conv2D(32, 1, strides=2, padding="same")(residual)])
    h = layers.Dropout(0.25)(layers.GlobalAveragePooling2D()(h))
    model = keras.Model(x_in, layers.Dense(1)(h))
    model.compile(keras.optimizers.Adam(3e-4), keras.losses.BinaryCrossentropy(from_logits=True),
                  metrics=[keras.metrics.BinaryAccuracy(name="acc")])
    x = (_rs().rand(ROWS, 32, 32, 3) * 255).astype("float32")
    return model, dict(x=x, y=(x[:, :, :16].mean(axis=(1, 2, 3)) > 127.5).astype("float32"))


def vae():
    layers, ops = keras.layers, keras.ops
    latent = 2

    class Sampling(layers.Layer):
        """z = mean + exp(log_var / 2) * eps; adds the KL term through `add_loss`."""

        def __init__(self, **kw):
            super().__init__(**kw)
            self.seed_generator = keras.random.SeedGenerator(1337)

        def call(self, inputs):
            mean, log_var = inputs
            kl = -0.5 * (1 + log_var - ops.square(mean) - ops.exp(log_var))
            self.add_loss(ops.mean(ops.sum(kl, axis=1)))
            eps = keras.random.normal(ops.shape(mean), seed=self.seed_generator)
            return mean + ops.exp(0.5 * log_var) * eps

    x_in = keras.Input((28, 28, 1))
    h = layers.Conv2D(16, 3, strides=2, padding="same", activation="relu")(x_in)
    h = layers.Conv2D(32, 3, strides=2, padding="same", activation="relu")(h)
    h = layers.Dense(16, activation="relu")(layers.Flatten()(h))
    z = Sampling()([layers.Dense(latent)(h), layers.Dense(latent)(h)])
    h = layers.Reshape((7, 7, 32))(layers.Dense(7 * 7 * 32, activation="relu")(z))
    h = layers.Conv2DTranspose(32, 3, strides=2, padding="same", activation="relu")(h)
    h = layers.Conv2DTranspose(16, 3, strides=2, padding="same", activation="relu")(h)
    model = keras.Model(x_in, layers.Conv2DTranspose(1, 3, padding="same",
                                                     activation="sigmoid")(h))
    # Reconstruction summed over pixels (as the Keras example), KL through add_loss.
    model.compile(keras.optimizers.Adam(), lambda y, p: 784 * keras.losses.binary_crossentropy(
        ops.reshape(y, (-1, 784)), ops.reshape(p, (-1, 784))))
    x = _digits()
    return model, dict(x=x, y=x)


PROGRAMS: dict[str, Callable] = {f.__name__: f for f in (
    mnist_convnet, transformer_text, timeseries_convnet, imbalanced_mlp, conv_autoencoder,
    lstm_seq2seq, multi_io, augmentation, vae)}

_PROGRAMS = flags.DEFINE_list("programs", list(PROGRAMS), "Programs to run: " +
                              ", ".join(PROGRAMS) + ".")
_EPOCHS = flags.DEFINE_integer("epochs", 2, "Epochs of every fit.", lower_bound=1)


# --- running a program under a setting ----------------------------------------------------
def _rs():
    return np.random.RandomState(1)


def _digits() -> np.ndarray:
    """MNIST-shaped images in [0, 1], digit-like: mostly dark, a fifth of the pixels lit."""
    rs = _rs()
    return ((rs.rand(ROWS, 28, 28, 1) > 0.8) * rs.rand(ROWS, 28, 28, 1)).astype("float32")


SETTINGS = ("plain", "default", "none")


def make_strategy(setting: str):
    """The one line that differs between the settings (None: plain Keras)."""
    cluster = hp.Cluster.local(["LOCAL_CPU"] * 2)
    if setting == "plain":
        return None
    if setting == "default":
        return hp.HetPipeStrategy(cluster)
    if setting == "none":
        return hp.HetPipeStrategy(cluster, n_m=1, compensation="none")
    raise ValueError(f"Unknown setting. Received: setting={setting!r}; use one of {SETTINGS}.")


@dataclasses.dataclass(frozen=True)
class Result:
    weights: list
    losses: list          # training loss per epoch
    evaluate: float       # evaluate()'s loss on the training data
    predict_finite: bool  # predict() returned finite values
    seconds: float
    n_m: int | None       # the strategy's N_m (None: plain Keras)


def run(name: str, setting: str, epochs: int = 2) -> Result:
    """Builds, compiles and fits program `name` under `setting`, then evaluates and
    predicts; the same seeds (and so the same initial weights) in every setting."""
    strategy = make_strategy(setting)
    start = time.perf_counter()
    keras.utils.set_random_seed(0)
    try:
        with (strategy.scope() if strategy else contextlib.nullcontext()):
            model, data = PROGRAMS[name]()
        history = model.fit(**data, batch_size=BATCH, epochs=epochs, verbose=0)
        weights = model.get_weights()
        evaluate = model.evaluate(data["x"], data["y"], batch_size=BATCH, verbose=0)
        predicted = model.predict(data["x"], batch_size=BATCH, verbose=0)
        n_m = strategy.n_m if strategy is not None else None
    finally:
        if strategy is not None:
            strategy.close()
    flat = [np.asarray(p) for p in keras.tree.flatten(predicted)]
    return Result(weights, [float(v) for v in history.history["loss"]],
                  float(np.ravel(evaluate)[0]), all(np.all(np.isfinite(p)) for p in flat),
                  time.perf_counter() - start, n_m)


def max_dw(a: list, b: list) -> float:
    return max(float(np.max(np.abs(np.asarray(u) - np.asarray(v)))) for u, v in zip(a, b))


def runs_unchanged(r: Result) -> bool:
    return (all(math.isfinite(v) for v in r.losses) and math.isfinite(r.evaluate)
            and r.predict_finite)


def _losses(r) -> str:
    if isinstance(r, BaseException):
        return f"FAILS: {type(r).__name__}: {str(r).splitlines()[0][:60]}"
    return " / ".join(f"{v:.4g}" for v in r.losses)


def _row(name: str, results: dict) -> str:
    default, none, plain = results["default"], results["none"], results["plain"]
    unchanged = ("no: " + _losses(default) if isinstance(default, BaseException)
                 else f"yes (N_m={default.n_m})" if runs_unchanged(default)
                 else "no: non-finite values")
    if isinstance(none, BaseException) or isinstance(plain, BaseException):
        dw = "-"
    else:
        dw = f"{max_dw(plain.weights, none.weights):.2g}"
    return (f"| {name} | {unchanged} | {dw} | {_losses(plain)} | {_losses(default)} | "
            f"{_losses(none)} |")


def main(argv) -> None:
    del argv
    hp.configure_logical_devices(2)
    unknown = [p for p in _PROGRAMS.value if p not in PROGRAMS]
    if unknown:
        raise app.UsageError(f"Unknown programs. Received: --programs={unknown}; use names "
                             f"from {list(PROGRAMS)}.")
    print(f"| program | runs unchanged (default switch) | max abs dw, N_m=1, none vs plain "
          f"| loss per epoch, plain | default | N_m=1, none |")
    print("| --- | --- | --- | --- | --- | --- |")
    for name in _PROGRAMS.value:
        results = {}
        for setting in SETTINGS:
            try:
                results[setting] = run(name, setting, _EPOCHS.value)
            except Exception as e:  # noqa: BLE001  (printed in the table)
                results[setting] = e
        print(_row(name, results), flush=True)


if __name__ == "__main__":
    app.run(main)
