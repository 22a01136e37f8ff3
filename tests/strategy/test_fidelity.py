"""Plain Keras's numbers at N_m = 1 with the planner: planning and the first fit leave
every random state (layers' seed generators, the input pipeline's shuffle and `.map()`
augmentation) as plain Keras would, so weights after 2 epochs equal plain Keras's.

`python -m tests.strategy.test_fidelity` prints the table: model kind x max |dw|.
"""

from __future__ import annotations

import numpy as np
import keras
import pytest
import tensorflow as tf

import hetpipe_tf as hp

EPOCHS = 2
BATCH = 8
ROWS = 48


def _dense(units, seed, **kw):
    return keras.layers.Dense(units, kernel_initializer=keras.initializers.GlorotUniform(seed),
                              **kw)


def _conv2d(filters, seed):
    return keras.layers.Conv2D(filters, 3, padding="same", activation="relu",
                               kernel_initializer=keras.initializers.GlorotUniform(seed))


def _dropout():
    x = keras.Input((8,))
    h = _dense(16, 1, activation="relu")(x)
    h = keras.layers.Dropout(0.3)(h)
    h = _dense(16, 2, activation="relu")(h)
    h = keras.layers.Dropout(0.3)(h)
    return keras.Model(x, _dense(1, 3)(h)), (8,)


def _spatial_1d():
    x = keras.Input((6, 4))
    h = keras.layers.Conv1D(8, 3, padding="same", activation="relu",
                            kernel_initializer=keras.initializers.GlorotUniform(1))(x)
    h = keras.layers.SpatialDropout1D(0.3)(h)
    h = keras.layers.Flatten()(h)
    return keras.Model(x, _dense(1, 2)(h)), (6, 4)


def _spatial_2d():
    x = keras.Input((6, 6, 2))
    h = _conv2d(4, 1)(x)
    h = keras.layers.SpatialDropout2D(0.3)(h)
    h = keras.layers.Flatten()(h)
    return keras.Model(x, _dense(1, 2)(h)), (6, 6, 2)


def _gaussian_noise():
    x = keras.Input((8,))
    h = keras.layers.GaussianNoise(0.2)(x)
    h = _dense(16, 1, activation="tanh")(h)
    h = keras.layers.GaussianNoise(0.1)(h)
    return keras.Model(x, _dense(1, 2)(h)), (8,)


def _augmentation():
    x = keras.Input((6, 6, 1))
    h = keras.layers.RandomFlip("horizontal")(x)
    h = keras.layers.RandomContrast(0.3)(h)
    h = _conv2d(4, 1)(h)
    h = keras.layers.Flatten()(h)
    return keras.Model(x, _dense(1, 2)(h)), (6, 6, 1)


MODELS = {"Dropout": _dropout, "SpatialDropout1D": _spatial_1d,
          "SpatialDropout2D": _spatial_2d, "GaussianNoise": _gaussian_noise,
          "RandomFlip + RandomContrast": _augmentation}


def _data(shape):
    rs = np.random.RandomState(0)
    x = rs.randn(ROWS, *shape).astype("float32")
    y = np.tanh(x.reshape(ROWS, -1)[:, :1] + 0.5 * x.reshape(ROWS, -1)[:, 1:2]).astype("float32")
    return x, y


def _dataset(x, y, kind):
    """A tf.data pipeline with the user's own seeded randomness."""
    ds = tf.data.Dataset.from_tensor_slices((x, y))
    if kind in ("shuffle", "both"):
        ds = ds.shuffle(ROWS, seed=7)
    ds = ds.batch(BATCH)
    if kind in ("augment", "both"):
        noise = keras.layers.GaussianNoise(0.3, seed=3)
        ds = ds.map(lambda a, b: (noise(a, training=True), b))
    return ds


def train(build, data: str = "numpy", strategy_fn=None):
    """Final weights after EPOCHS epochs, every seed set first (same initial weights and
    layer seeds in every run)."""
    keras.utils.set_random_seed(0)
    strategy = strategy_fn() if strategy_fn else None
    scope = strategy.scope() if strategy else _null()
    with scope:
        model, shape = build()
        model.compile(keras.optimizers.SGD(0.05), "mse")
    x, y = _data(shape)
    if data == "numpy":
        model.fit(x, y, batch_size=BATCH, epochs=EPOCHS, verbose=0)
    elif data == "PyDataset(shuffle=True)":
        model.fit(_Batches(x, y), epochs=EPOCHS, verbose=0, shuffle=True)
    else:
        model.fit(_dataset(x, y, data), epochs=EPOCHS, verbose=0)
    weights = model.get_weights()
    if strategy is not None and hasattr(strategy, "close"):
        strategy.close()
    return weights


class _null:
    def __enter__(self):
        return self

    def __exit__(self, *exc):
        return False


def planner_strategy():
    return hp.HetPipeStrategy(hp.Cluster.local(["LOCAL_CPU"] * 2), n_m=1,
                              compensation="none")


def max_dw(a, b) -> float:
    return max(float(np.max(np.abs(u - v))) for u, v in zip(a, b))


@pytest.mark.parametrize("kind", list(MODELS))
def test_random_layers_with_the_planner_equal_plain_keras(kind):
    plain = train(MODELS[kind])
    ours = train(MODELS[kind], strategy_fn=planner_strategy)
    assert max_dw(plain, ours) <= 1e-6


@pytest.mark.parametrize("data", ["shuffle", "augment", "both"])
def test_seeded_input_pipeline_equals_plain_keras(data):
    plain = train(_dropout, data)
    ours = train(_dropout, data, strategy_fn=planner_strategy)
    assert max_dw(plain, ours) <= 1e-6


class _Batches(keras.utils.PyDataset):
    def __init__(self, x, y, **kwargs):
        super().__init__(**kwargs)
        self.x, self.y = x, y

    def __len__(self):
        return len(self.x) // BATCH

    def __getitem__(self, i):
        return self.x[i * BATCH:(i + 1) * BATCH], self.y[i * BATCH:(i + 1) * BATCH]


def test_a_shuffled_py_dataset_equals_plain_keras():
    """Keras shuffles a PyDataset's order with Python's random at each pass: no pass more
    than plain Keras's (MirroredStrategy makes one, docs/strategy.md)."""
    data = "PyDataset(shuffle=True)"
    assert max_dw(train(_dropout, data), train(_dropout, data, planner_strategy)) <= 1e-6


def test_the_batch_size_of_a_pipeline_is_read_from_its_structure():
    from hetpipe_tf._shim import dataset_batch_size

    ds = tf.data.Dataset.range(20).shuffle(20, seed=1)
    assert dataset_batch_size(ds.batch(8).map(lambda v: v * 2).prefetch(2).repeat()) == 8
    assert dataset_batch_size(ds.padded_batch(6).cache().take(2)) == 6
    assert dataset_batch_size(ds.batch(8).unbatch().batch(4)) == 4
    assert dataset_batch_size(ds.batch(8).unbatch()) is None   # elements, not batches
    assert dataset_batch_size(ds) is None


def main() -> None:
    rows = [(kind, "numpy", MODELS[kind]) for kind in MODELS]
    rows += [("Dropout", data, _dropout)
             for data in ("shuffle", "augment", "both", "PyDataset(shuffle=True)")]
    print("| model | input | max abs dw vs plain Keras (planner, N_m=1, none, 2 epochs) |")
    print("| --- | --- | --- |")
    for kind, data, build in rows:
        d = max_dw(train(build, data), train(build, data, strategy_fn=planner_strategy))
        print(f"| {kind} | {data} | {d:.2g} |", flush=True)


if __name__ == "__main__":
    from tests import conftest  # noqa: F401  (4 logical CPUs before TF starts)
    main()
