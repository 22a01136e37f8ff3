"""What the convergence studies share: a model trained from given initial weights under a
strategy or plain Keras, an optimizer from its (class, arguments), the clock of time to
accuracy, and their Markdown tables. TensorFlow and Keras are imported when called, so
that --help stays fast."""

from __future__ import annotations

import contextlib
import time
from typing import Any, Callable, Iterator


def make_optimizer(spec: tuple[str, dict]) -> Any:
    """A Keras optimizer from (class name in keras.optimizers, keyword arguments)."""
    import keras

    cls, kwargs = spec
    return getattr(keras.optimizers, cls)(**kwargs)


@contextlib.contextmanager
def compiled(build: Callable[[], Any], optimizer: tuple[str, dict], weights0: list,
             strategy: Any = None) -> Iterator[Any]:
    """A fresh model of `build()`, compiled with the optimizer `make_optimizer(optimizer)`
    (sparse categorical cross-entropy, accuracy), both made under `strategy` (None: plain
    Keras), and set to `weights0`, so every setting starts from the same point; the
    strategy is closed on exit."""
    try:
        with strategy.scope() if strategy is not None else contextlib.nullcontext():
            model = build()
            model.compile(make_optimizer(optimizer), "sparse_categorical_crossentropy",
                          metrics=["accuracy"])
        model.set_weights(weights0)
        yield model
    finally:
        if strategy is not None:
            strategy.close()


def epoch_clock() -> Any:
    """A Keras callback: training seconds (validation excluded) from the first minibatch's
    return, and `history`, (cumulative training seconds, validation accuracy) at every
    epoch end."""
    import keras

    class Clock(keras.callbacks.Callback):
        def __init__(self):
            super().__init__()
            self.start = None
            self.train_s = 0.0
            self.epoch_t0 = None
            self.history = []

        def on_train_batch_end(self, batch, logs=None):
            if self.start is None:
                self.start = self.epoch_t0 = time.perf_counter()

        def on_epoch_begin(self, epoch, logs=None):
            if self.start is not None:
                self.epoch_t0 = time.perf_counter()

        def on_test_begin(self, logs=None):
            if self.epoch_t0 is not None:   # fit's validation: stop the epoch's clock
                self.train_s += time.perf_counter() - self.epoch_t0
                self.epoch_t0 = None

        def on_epoch_end(self, epoch, logs=None):
            self.history.append((self.train_s, float((logs or {}).get("val_accuracy", 0.0))))

    return Clock()


def to_target(history: list[tuple[float, float]], target: float):
    """(seconds, epochs) to the first epoch end at or above target, or (None, None)."""
    for e, (s, acc) in enumerate(history, start=1):
        if acc >= target:
            return s, e
    return None, None


def cell(value, spec: str) -> str:
    """A table cell: `value` formatted by `spec`, or "-" when there is none."""
    return "-" if value is None else format(value, spec)


def markdown_table(rows: list[tuple[str, ...]]) -> str:
    """rows[0] is the header; every cell a string. A Markdown table, columns padded."""
    widths = [max(len(r[i]) for r in rows) for i in range(len(rows[0]))]
    lines = ["| " + " | ".join(c.ljust(w) for c, w in zip(r, widths)) + " |" for r in rows]
    lines.insert(1, "| " + " | ".join("-" * w for w in widths) + " |")
    return "\n".join(lines)
