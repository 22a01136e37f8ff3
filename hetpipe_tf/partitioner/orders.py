"""Device orders of a virtual worker: every order up to swapping interchangeable devices
(same type, host, speed and memory, `dp.device_classes`), and how many there are."""

from __future__ import annotations

import math
from typing import Any, Iterator, Sequence

from hetpipe_tf.partitioner.dp import device_classes


def distinct_orders(devices: Sequence[Any]) -> Iterator[tuple[Any, ...]]:
    """Every order of `devices` up to swapping interchangeable ones, in a stable order."""
    groups = device_classes(devices)
    counts = [len(g) for g in groups]

    def rec(prefix: list[int]) -> Iterator[list[int]]:
        if len(prefix) == len(devices):
            yield prefix
            return
        for g, left in enumerate(counts):
            if left:
                counts[g] -= 1
                yield from rec(prefix + [g])
                counts[g] += 1

    for classes_in_order in rec([]):
        taken = [0] * len(groups)
        order = []
        for g in classes_in_order:
            order.append(groups[g][taken[g]])
            taken[g] += 1
        yield tuple(order)


def count_distinct_orders(devices: Sequence[Any]) -> int:
    """The multinomial len(devices)! / prod(class size!)."""
    n = math.factorial(len(devices))
    for group in device_classes(devices):
        n //= math.factorial(len(group))
    return n
