"""The synthetic workload the speed and memory binaries share: a stack of Dense layers on
random features, and timing work on several threads at once (the machine's ceiling).

Layer names are explicit, so a plan made on one instance matches another.
"""

from __future__ import annotations

import threading
import time
from typing import Any, Callable, Sequence


def dense_stack(keras: Any, name: str, depth: int, width: int) -> Any:
    """`depth` x Dense(width, relu) on `width` features, then a 10-way softmax."""
    inputs = keras.Input((width,), name="features")
    h = inputs
    for i in range(depth):
        h = keras.layers.Dense(width, activation="relu", name=f"dense{i}")(h)
    outputs = keras.layers.Dense(10, activation="softmax", name="logits")(h)
    return keras.Model(inputs, outputs, name=name)


def random_features(tf: Any, np: Any, width: int, batch: int, batches: int) -> Any:
    """`batches` fixed minibatches of random features and 10-class labels, repeated."""
    rs = np.random.RandomState(0)
    n = batch * batches
    x = rs.randn(n, width).astype("float32")
    y = rs.randint(0, 10, n).astype("int32")
    return tf.data.Dataset.from_tensor_slices((x, y)).batch(batch, drop_remainder=True).repeat()


def seconds_at_once(work: Sequence[Callable[[], object]]) -> float:
    """Wall seconds to run every callable of `work` at once, one thread each."""
    threads = [threading.Thread(target=w) for w in work]
    start = time.perf_counter()
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    return time.perf_counter() - start
