"""The parts of Keras' `Trainer` (compile, fit, train_step) the pipelined step runs itself.

The compiled loss and metrics the last stage updates, whether a model overrides a Trainer
method, the model whose `compile` / `fit` is running (read from the caller's frames), the
batch size of the data `fit` iterates, the symbolic build Keras runs under a strategy, and
`train_on_batch`'s logs (Keras 3.15).

Reading the user's data starts a pass over it, and each pass of a tf.data pipeline draws
its seeded `shuffle()` and its `.map()` augmentation anew (a PyDataset with shuffle=True
draws a new order): so nothing here reads a batch where the data's structure tells what is
needed (`build_from_element_spec`, `dataset_batch_size`).
"""

from __future__ import annotations

from typing import Any

import keras
import tensorflow as tf


def compile_loss(model: keras.Model) -> Any:
    """The compiled loss alone (None if the model was compiled without one)."""
    # Reason: model.compute_loss would add the regularisation losses of the live variables,
    # not of the stage's weight version.
    return model._compile_loss


def loss_tracker(model: keras.Model) -> Any:
    # Reason: the "loss" metric that Keras' own train_step updates.
    return model._loss_tracker


def compile_metrics(model: keras.Model) -> Any:
    # Reason: the compiled metrics, updated in minibatch order by the last stage.
    return model._compile_metrics


def call_overridden(model: keras.Model, name: str) -> bool:
    """Whether the model's class overrides a Trainer method (train_step, compute_loss...)."""
    from keras.src.backend.tensorflow.trainer import TensorFlowTrainer
    from keras.src.trainers.trainer import Trainer

    # Reason: the base implementations live in these two private classes.
    impl = getattr(type(model), name, None)
    return impl is not None and impl not in (
        getattr(TensorFlowTrainer, name, None),
        getattr(Trainer, name, None),
    )


def calling_model(frame: Any, methods: tuple[str, ...] = ("compile",)) -> Any:
    """The Keras model one of whose `methods` is running in `frame` or a frame above it."""
    # Reason: compile() creates the loss tracker's variables in the strategy's scope, the
    # first moment the strategy can see the model (to guard fit against aborts); fit()
    # distributes its dataset before Keras builds the optimizer (to check it first).
    while frame is not None:
        if frame.f_code.co_name in methods:
            owner = frame.f_locals.get("self")
            if isinstance(owner, keras.Model):
                return owner
        frame = frame.f_back
    return None


def fit_first_batch(frame: Any, need_batch: bool = True) -> tuple[int | None, Any]:
    """(batch size, first batch) of the data the running `fit` iterates (its epoch
    iterator's data adapter), where the traced batch leaves a dimension open: NumPy inputs
    with a remainder, Python generators, `keras.utils.PyDataset`, a tf.data dataset batched
    without drop_remainder or padded to each batch's longest sequence. The batch size is
    the adapter's when it knows it, else the first batch's; (None, None) when no fit runs in
    `frame` or above it, or the data yields no batch. With `need_batch=False` the first
    batch is read only when the batch size needs it (None is returned for it otherwise)."""
    # Reason: the plan is made for the user's batch size and input shapes, which Keras
    # knows but does not put into the traced step's shapes when they vary.
    while frame is not None and not (frame.f_code.co_name == "fit"
                                     and "epoch_iterator" in frame.f_locals):
        frame = frame.f_back   # past a subclass's own fit that calls Keras' fit
    iterator = None if frame is None else frame.f_locals["epoch_iterator"]
    adapter = getattr(iterator, "data_adapter", None)
    if adapter is None:
        return None, None
    if not need_batch and isinstance(adapter.batch_size, int):
        return adapter.batch_size, None
    dataset = adapter.get_tf_dataset() if not need_batch else None
    if isinstance(dataset, tf.data.Dataset):
        size = dataset_batch_size(dataset)   # read from its .batch(n)
        if size is not None:
            return size, None
    first = getattr(adapter, "_first_batches", None)          # Python generator: peeked
    if first is None and getattr(adapter, "py_dataset", None) is not None:
        first = [adapter.py_dataset[0]]                        # as Keras reads it for specs
    if first is None:
        with tf.init_scope():    # NumPy and tf.data: a fresh pass of the dataset it made
            first = [element for element in adapter.get_tf_dataset().take(1)]
    size = adapter.batch_size
    if not isinstance(size, int):
        sizes = [int(t.shape[0]) for batch in first or ()
                 for t in tf.nest.flatten(batch) if getattr(t, "shape", None)]
        size = max(sizes) if sizes else None
    return size, (first[0] if first else None)


# Datasets that pass every element on unchanged in size (a `.map()` may change a batch's
# size: a larger batch than planned is then refused by name when it arrives).
_SIZE_KEEPING = frozenset({
    "_MapDataset", "_ParallelMapDataset", "_PrefetchDataset", "_ShuffleDataset",
    "_RepeatDataset", "_TakeDataset", "_SkipDataset", "CacheDataset", "_FilterDataset",
    "_OptionsDataset", "_IgnoreErrorsDataset", "_AssertCardinalityDataset",
    "_ShardDataset", "_MaxIntraOpParallelismDataset", "_PrivateThreadPoolDataset",
    "DatasetV1Adapter"})
_BATCHING = frozenset({"_BatchDataset", "_ParallelBatchDataset", "_PaddedBatchDataset"})


def dataset_batch_size(dataset: Any) -> int | None:
    """The n of the `.batch(n)` / `.padded_batch(n)` that makes `dataset`'s elements, read
    from the pipeline's structure (no element is read), or None when a step between that
    batching and the end may change the size (unbatch, rebatch, flat_map, ...) or none is
    found."""
    # Reason: tf.data keeps the batch size only in its private dataset classes'
    # `_batch_size` and links each dataset to its input by `_input_dataset`.
    while dataset is not None:
        name = type(dataset).__name__
        if name in _BATCHING:
            value = tf.get_static_value(getattr(dataset, "_batch_size", None))
            return int(value) if value is not None and int(value) > 0 else None
        if name not in _SIZE_KEEPING:
            return None
        dataset = getattr(dataset, "_input_dataset", getattr(dataset, "_dataset", None))
    return None


def build_from_element_spec(model: keras.Model) -> None:
    """Make Keras' symbolic build under a strategy (installed by a running fit) take the
    shapes and dtypes from the data's `element_spec` instead of reading a first batch, as
    plain Keras (no strategy, no symbolic build) reads none. Installed once per model."""
    # Reason: TensorFlowTrainer._maybe_symbolic_build starts a pass over the data (one
    # batch) only to make KerasTensors of its shapes; that pass draws the data's seeded
    # shuffle and augmentation once more than plain Keras, so the epochs that follow see
    # other orders and masks. The element spec gives the same shapes without a pass.
    if "_maybe_symbolic_build" in vars(model):
        return
    original = model._maybe_symbolic_build

    def build(iterator: Any = None, data_batch: Any = None) -> Any:
        if iterator is not None and data_batch is None:
            spec = getattr(getattr(iterator, "_distributed_dataset", None), "element_spec",
                           None)
            if spec is not None and all(isinstance(s, tf.TensorSpec) and s.shape.rank
                                        is not None for s in tf.nest.flatten(spec)):
                batch = tf.nest.map_structure(
                    lambda s: keras.KerasTensor(tuple(s.shape), s.dtype.name), spec)
                return original(data_batch=batch)
        return original(iterator=iterator, data_batch=data_batch)

    model._maybe_symbolic_build = build


def pythonify_logs(logs: Any) -> dict:
    """Logs as `train_on_batch` returns them (Python floats, nested dicts flattened)."""
    # Reason: the strategy recomputes train_on_batch's logs after draining the pipeline.
    from keras.src.utils.python_utils import pythonify_logs as pythonify
    return pythonify(logs)


def flatten_logs(model: Any, logs: dict) -> Any:
    """Logs as a list in the order of `model.metrics_names` (train_on_batch's default)."""
    # Reason: the same; Keras' own ordering of its return value.
    return model._flatten_metrics_in_order(logs)


# --- what the strategy prints at a model's first fit (strategy/summary.py) ---------------
def fit_verbose(frame: Any) -> Any:
    """The `verbose` argument of the Keras `fit` running in `frame` or a frame above it;
    None when no fit runs (train_on_batch, a call outside fit)."""
    # Reason: the strategy's block is printed at the first traced train step, silenced as
    # fit's progress bar is, and only Keras fit's frame holds its `verbose`.
    while frame is not None:
        if frame.f_code.co_name == "fit" and "epoch_iterator" in frame.f_locals:
            return frame.f_locals.get("verbose")
        frame = frame.f_back
    return None


def print_msg(message: str) -> None:
    """Print `message` as Keras prints its progress (stdout, or absl logging when
    `keras.config.disable_interactive_logging()` is in force)."""
    # Reason: Keras' own output function is not public.
    from keras.src.utils.io_utils import print_msg as keras_print_msg
    keras_print_msg(message)
