"""How the speed binaries time: the best rate of repeated fits, and work on several
threads at once (the machine's ceiling)."""

from __future__ import annotations

import threading
import time
from typing import Any, Callable, Sequence


def best_rate(model: Any, ds: Any, steps: int, batch_size: int, repeats: int,
              warmup_steps: int = 0) -> float:
    """Best samples/s of `repeats` timed epochs of `steps` minibatches, after an untimed
    epoch of `warmup_steps` (none at 0): on this VM an epoch now and then stalls for
    seconds (plain Keras fit too), so the fastest epoch is the repeatable figure."""
    if warmup_steps:
        model.fit(ds, epochs=1, steps_per_epoch=warmup_steps, verbose=0)
    rates = []
    for _ in range(repeats):
        start = time.perf_counter()
        model.fit(ds, epochs=1, steps_per_epoch=steps, verbose=0)
        rates.append(steps * batch_size / (time.perf_counter() - start))
    return max(rates)


def seconds_at_once(work: Sequence[Callable[[], object]]) -> float:
    """Wall seconds to run every callable of `work` at once, one thread each."""
    threads = [threading.Thread(target=w) for w in work]
    start = time.perf_counter()
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    return time.perf_counter() - start
