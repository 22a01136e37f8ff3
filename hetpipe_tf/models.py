"""Named Keras models for the binaries, examples and tests (all built with weights=None),
and the workloads of the programs in benchmarks/ and experiments/ (their models and data).

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

from hetpipe_tf import model_names

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
MODEL_NAMES = model_names.MODEL_NAMES   # the names built here (tests/test_model_names.py)
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


# --- the programs' workloads (benchmarks/, experiments/) ----------------------------------
# Layer names are explicit, so a plan made on one instance matches another.
def skip_net(seed: int = 0, name: str = "skipnet") -> keras.Model:
    """A small Functional regression model (8 features -> 1) whose skip connection
    crosses stage boundaries (5 nodes); seeded, so two builds start equal."""
    init = lambda s: keras.initializers.GlorotUniform(seed=seed + s)  # noqa: E731
    inp = keras.Input((8,), name="x")
    h1 = keras.layers.Dense(16, activation="tanh", kernel_initializer=init(1), name="d1")(inp)
    h2 = keras.layers.Dense(16, activation="tanh", kernel_initializer=init(2), name="d2")(h1)
    h3 = keras.layers.Dense(16, activation="tanh", kernel_initializer=init(3), name="d3")(h2)
    s = keras.layers.Add(name="add")([h1, h3])
    out = keras.layers.Dense(1, kernel_initializer=init(4), name="out")(s)
    return keras.Model(inp, out, name=name)


def dense_stack(depth: int, width: int, name: str = "dense_stack") -> keras.Model:
    """`depth` x Dense(width, relu) on `width` features, then a 10-way softmax."""
    inputs = keras.Input((width,), name="features")
    h = inputs
    for i in range(depth):
        h = keras.layers.Dense(width, activation="relu", name=f"dense{i}")(h)
    outputs = keras.layers.Dense(10, activation="softmax", name="logits")(h)
    return keras.Model(inputs, outputs, name=name)


def random_features(width: int, batch: int, batches: int):
    """`batches` fixed minibatches of random features and 10-class labels, repeated."""
    import numpy as np
    import tensorflow as tf

    rs = np.random.RandomState(0)
    n = batch * batches
    x = rs.randn(n, width).astype("float32")
    y = rs.randint(0, 10, n).astype("int32")
    return tf.data.Dataset.from_tensor_slices((x, y)).batch(batch, drop_remainder=True).repeat()


def random_inputs(model: keras.Model, batch_size: int, num_classes: int):
    """4 minibatches of random inputs of the model's shape and labels below num_classes,
    repeated (offline; for throughput, not accuracy)."""
    import tensorflow as tf

    shape = tuple(model.inputs[0].shape[1:])
    n = batch_size * 4
    x = tf.random.stateless_normal((n, *shape), seed=(1, 2))
    y = tf.random.stateless_uniform((n,), seed=(3, 4), maxval=num_classes, dtype=tf.int32)
    return tf.data.Dataset.from_tensor_slices((x, y)).batch(
        batch_size, drop_remainder=True).repeat()


def spirals(n: int, seed: int = 0, turns: float = 2.2, noise: float = 0.08):
    """(features, labels): four interleaved spirals in 2-D, lifted to 16 features. The angle
    grows by `turns` radians per unit radius (radius 0.3..3.3); `noise` is the standard
    deviation of the Gaussian noise on each point."""
    import numpy as np

    rs = np.random.RandomState(seed)
    classes = rs.randint(0, 4, n)
    t = rs.rand(n) * 3.0 + 0.3
    angle = t * turns + classes * (np.pi / 2)
    xy = np.stack([t * np.cos(angle), t * np.sin(angle)], 1) + noise * rs.randn(n, 2)
    feats = np.concatenate([xy, np.sin(xy * 1.7), np.cos(xy * 1.3), xy ** 2 / 4,
                            np.sin(xy[:, :1] * xy[:, 1:] * 0.8), rs.randn(n, 7) * 0.1], 1)
    return feats.astype("float32"), classes.astype("int32")


def spiral_resmlp(width: int = 128, depth: int = 6) -> keras.Model:
    """The spirals' residual MLP: skip connections that may cross stage cuts."""
    inp = keras.Input((16,), name="features")
    h = keras.layers.Dense(width, activation="relu", name="dense_in")(inp)
    for i in range(depth):
        r = keras.layers.Dense(width, activation="relu", name=f"block{i}_a")(h)
        r = keras.layers.Dense(width, name=f"block{i}_b")(r)
        h = keras.layers.Add(name=f"block{i}_add")([h, r])
        h = keras.layers.Activation("relu", name=f"block{i}_relu")(h)
    out = keras.layers.Dense(4, activation="softmax", name="classes")(h)
    return keras.Model(inp, out, name="spiral_resmlp")


def digits():
    """(x_train, y_train, x_val, y_val): scikit-learn's 8x8 digits (shipped inside
    scikit-learn, no download), pixels in [0, 1], a fixed 80/20 split."""
    import numpy as np

    try:
        from sklearn.datasets import load_digits
    except ImportError:
        raise ValueError("The digits task needs scikit-learn. Received: no sklearn "
                         "module; pip install -e \".[bench]\".") from None
    x, y = load_digits(return_X_y=True)
    x, y = (x / 16.0).astype("float32"), y.astype("int32")
    order = np.random.RandomState(1234).permutation(len(x))
    x, y = x[order], y[order]
    split = int(0.8 * len(x))
    return x[:split], y[:split], x[split:], y[split:]


def synthetic_digits(n: int, seed: int = 0, noise: float = 0.2):
    """n synthetic 8x8 'digits' (64 features in [0, 1]) and labels 0..9, without
    scikit-learn: each class a fixed pattern of three strokes, shifted by up to 2 pixels,
    scaled and noised."""
    import numpy as np

    rs = np.random.RandomState(1234)   # the 10 class patterns never change
    patterns = np.zeros((10, 10, 10))
    for c in range(10):
        for _ in range(3):             # three strokes per class
            (r0, c0), (r1, c1) = rs.randint(1, 9, (2, 2))
            for t in np.linspace(0, 1, 12):
                patterns[c, int(round(r0 + t * (r1 - r0))), int(round(c0 + t * (c1 - c0)))] = 1
    rs = np.random.RandomState(seed)
    y = rs.randint(0, 10, n)
    dr, dc = rs.randint(0, 3, n), rs.randint(0, 3, n)
    x = np.stack([patterns[k, r:r + 8, c:c + 8] for k, r, c in zip(y, dr, dc)])
    x = x * rs.uniform(0.6, 1.0, (n, 1, 1)) + noise * rs.randn(n, 8, 8)
    return np.clip(x, 0, 1).reshape(n, 64).astype("float32"), y.astype("int32")


def digits_mlp(widths: tuple[int, ...] = (128, 64, 64)) -> keras.Model:
    """An MLP on the 64 pixels of a digit: Dense(w, relu) per entry of `widths` (layers
    h1, h2, ...), then a 10-way softmax."""
    layers = [keras.Input((64,), name="pixels")]
    layers += [keras.layers.Dense(w, activation="relu", name=f"h{i + 1}")
               for i, w in enumerate(widths)]
    layers.append(keras.layers.Dense(10, activation="softmax", name="digits"))
    return keras.Sequential(layers, name="digits_mlp")


# --- recurrent workloads (experiments/time_to_accuracy.py --mode=recurrent) ---------------
def seq2seq_data(n: int, seed: int = 0, source_tokens: int = 40, target_tokens: int = 57,
                 source_length: int = 12, target_length: int = 14):
    """((encoder inputs, decoder inputs), targets) of a generated translation task, one-hot
    as Keras' character-level LSTM seq2seq example feeds them: each target sequence counts
    from a start token by a stride, both read from the source's first two tokens (so the
    decoder needs the encoder's state), with the previous target token as the decoder's
    input (teacher forcing). The untrained loss is log(target_tokens)."""
    import numpy as np

    rs = np.random.RandomState(seed)
    src = rs.randint(1, source_tokens, (n, source_length))
    stride = src[:, 0] % 5 + 1
    steps = np.arange(target_length)[None]
    tgt = (src[:, 1:2] + stride[:, None] * steps) % (target_tokens - 2) + 2
    dec = np.concatenate([np.zeros((n, 1), int), tgt[:, :-1]], 1)
    return ((np.eye(source_tokens, dtype="float32")[src],
             np.eye(target_tokens, dtype="float32")[dec]), tgt.astype("int32"))


def lstm_seq2seq(latent: int = 128, source_tokens: int = 40, target_tokens: int = 57
                 ) -> keras.Model:
    """An LSTM encoder whose final states start an LSTM decoder, a softmax per target step
    (the shape of Keras' lstm_seq2seq example; the states cross a stage cut)."""
    enc_in = keras.Input((None, source_tokens), name="encoder_inputs")
    _, h, c = keras.layers.LSTM(latent, return_state=True, name="encoder")(enc_in)
    dec_in = keras.Input((None, target_tokens), name="decoder_inputs")
    seq = keras.layers.LSTM(latent, return_sequences=True, name="decoder")(
        dec_in, initial_state=[h, c])
    out = keras.layers.Dense(target_tokens, activation="softmax", name="next_token")(seq)
    return keras.Model([enc_in, dec_in], out, name="lstm_seq2seq")


def tagging_data(n: int, seed: int = 0, vocabulary: int = 50, length: int = 20):
    """(token ids, tags): each token's tag (12 classes) is a function of the token and the
    one before it, so a tagger must carry state along the sequence."""
    import numpy as np

    rs = np.random.RandomState(seed)
    x = rs.randint(1, vocabulary, (n, length))
    prev = np.concatenate([np.zeros((n, 1), int), x[:, :-1]], 1)
    return x.astype("int32"), ((x % 4) * 3 + prev % 3).astype("int32")


def gru_tagger(units: int = 64, vocabulary: int = 50, length: int = 20) -> keras.Model:
    """Embedding, two GRUs over the sequence, a 12-way softmax per token."""
    tokens = keras.Input((length,), dtype="int32", name="tokens")
    h = keras.layers.Embedding(vocabulary, 32, name="embedding")(tokens)
    h = keras.layers.GRU(units, return_sequences=True, name="gru1")(h)
    h = keras.layers.GRU(units, return_sequences=True, name="gru2")(h)
    out = keras.layers.Dense(12, activation="softmax", name="tags")(h)
    return keras.Model(tokens, out, name="gru_tagger")
