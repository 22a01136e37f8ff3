"""Micro-batches of a synchronous schedule: a minibatch cut along the batch axis, and the
sums of their gradients.

`split_sizes` gives the rows of each micro-batch (an uneven split gives the first ones a row
more; a batch of B < M rows is B micro-batches), `split` cuts a nest of tensors by them,
and an `Adder` sums two lists of tensors in one compiled call per stage (IndexedSlices side
by side, as TensorFlow aggregates them).
"""

from __future__ import annotations

import tensorflow as tf

from hetpipe_tf.pipeline.compiled import compiled_method


def split_sizes(rows: int, micro_batches: int) -> list[int]:
    """Rows of each micro-batch: min(M, rows) parts, the first ones one row longer."""
    m = max(1, min(micro_batches, rows))
    base, extra = divmod(rows, m)
    return [base + (1 if i < extra else 0) for i in range(m)]


def split(x, sizes: list[int]) -> list:
    """`x` (a nest of tensors, or None) cut along the batch axis into `sizes` rows."""
    if x is None:
        return [None] * len(sizes)
    if len(sizes) == 1:
        return [x]
    flat = tf.nest.flatten(x)
    pieces = [tf.split(t, sizes, axis=0) if t is not None else [None] * len(sizes)
              for t in flat]
    return [tf.nest.pack_sequence_as(x, [p[i] for p in pieces]) for i in range(len(sizes))]


def add(x, y):
    """x + y; for sparse gradients (an Embedding's IndexedSlices, which have no `+`) their
    rows side by side, as TensorFlow aggregates them (the optimizer sums repeated rows)."""
    if isinstance(x, tf.IndexedSlices) or isinstance(y, tf.IndexedSlices):
        x, y = (t if isinstance(t, tf.IndexedSlices) else tf.IndexedSlices(
            t, tf.range(tf.shape(t, out_type=tf.int64)[0]), tf.shape(t, out_type=tf.int64))
            for t in (x, y))
        return tf.IndexedSlices(tf.concat([x.values, y.values], 0),
                                tf.concat([tf.cast(x.indices, tf.int64),
                                           tf.cast(y.indices, tf.int64)], 0),
                                x.dense_shape)
    return x + y


class Adder:
    """Element-wise sums of tensor lists in one compiled call (None where a term is None)."""

    def __init__(self):
        self._fn = compiled_method(self._impl, reduce_retracing=True)

    def _impl(self, a, b):
        return [x if y is None else y if x is None else add(x, y) for x, y in zip(a, b)]

    def __call__(self, a, b):
        if a is None:
            return list(b)
        if not a:
            return a
        return self._fn(list(a), list(b))
