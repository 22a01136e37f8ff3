"""A bounded record: the last `maxlen` items of an append-only sequence, indexed as if
none had been dropped, so memory stays flat in long runs while readers that remember a
position (`len(record)` then `record[start:]`, as the monitor does per epoch) keep working.

`len()` counts every item ever appended; iteration and indexing see the kept ones (an index
or slice before the window yields nothing / raises IndexError).
"""

from __future__ import annotations

import collections
from typing import Any, Iterator

from hetpipe_tf._args import check_int

# How many minibatches (or pushes) the runtime's records keep by default.
DEFAULT_HISTORY = 10_000


class Window:
    def __init__(self, maxlen: int):
        check_int("maxlen", maxlen, minimum=1)
        self._items: collections.deque = collections.deque(maxlen=maxlen)
        self._total = 0

    @property
    def dropped(self) -> int:
        """How many of the first items are no longer kept."""
        return self._total - len(self._items)

    def append(self, item: Any) -> None:
        self._items.append(item)
        self._total += 1

    def __len__(self) -> int:
        return self._total

    def __iter__(self) -> Iterator[Any]:
        return iter(list(self._items))

    def __getitem__(self, index):
        if isinstance(index, slice):
            start, stop, step = index.indices(self._total)
            lo = self.dropped
            return [self._items[i - lo] for i in range(max(start, lo), stop, step or 1)
                    if i >= lo]
        i = index + self._total if index < 0 else index
        if not self.dropped <= i < self._total:
            raise IndexError(f"index {index} is outside the kept window "
                             f"[{self.dropped}, {self._total}).")
        return self._items[i - self.dropped]

    def __eq__(self, other) -> bool:
        return list(self) == list(other) if isinstance(other, (list, tuple, Window)) else NotImplemented

    def __repr__(self) -> str:
        return f"Window({list(self._items)!r}, dropped={self.dropped})"
