"""The record of granted parameter-server transfers: `Transfer` and `TransferLog`.

`LinkPool` (links.py) grants a stage's shards together; one `Grant` keeps that stage's
request and every shard's start and end. `TransferLog` shows the grants as one immutable
sequence of `Transfer`, built only when read: at 1024 GPUs a simulation grants ~560k
transfers, and building as many frozen dataclasses would cost more than the simulation
(most callers only need `param_bytes`).
"""

from __future__ import annotations

import bisect
import dataclasses
import itertools
from typing import Iterable, Iterator, Sequence, overload


@dataclasses.dataclass(frozen=True)
class Transfer:
    """One granted transfer (for the timeline and the byte counts)."""

    vw: int
    stage: int
    wave: int
    kind: str          # "push" or "pull"
    device: str
    ps_host: str
    nbytes: int
    inter_host: bool
    request: float
    start: float
    end: float


@dataclasses.dataclass(frozen=True)
class Grant:
    """The shards one stage moved for one request: starts[i], ends[i] of shards[i]."""

    vw: int
    stage: int
    wave: int
    kind: str
    request: float
    device: str
    shards: tuple[tuple[str, int, bool], ...]
    starts: tuple[float, ...]
    ends: tuple[float, ...]


class TransferLog(Sequence[Transfer]):
    """Granted transfers in grant order: an immutable sequence of `Transfer` (equal to a
    tuple or list of the same transfers), stored per `Grant`."""

    __slots__ = ("_grants", "_offsets")

    def __init__(self, grants: Iterable[Grant] = ()) -> None:
        self._grants = tuple(grants)
        self._offsets = list(itertools.accumulate(len(g.shards) for g in self._grants))

    @classmethod
    def of(cls, transfers: Iterable[Transfer]) -> "TransferLog":
        """The log of `transfers` (a `TransferLog` is returned as is)."""
        if isinstance(transfers, TransferLog):
            return transfers
        return cls(Grant(t.vw, t.stage, t.wave, t.kind, t.request, t.device,
                          ((t.ps_host, t.nbytes, t.inter_host),), (t.start,), (t.end,))
                   for t in transfers)

    def _rows(self) -> Iterator[tuple]:
        for g in self._grants:
            for (host, nbytes, inter), start, end in zip(g.shards, g.starts, g.ends):
                yield (g.vw, g.stage, g.wave, g.kind, g.device, host, nbytes, inter,
                       g.request, start, end)

    def __len__(self) -> int:
        return self._offsets[-1] if self._offsets else 0

    @overload
    def __getitem__(self, i: int) -> Transfer: ...
    @overload
    def __getitem__(self, i: slice) -> tuple[Transfer, ...]: ...

    def __getitem__(self, i):
        if isinstance(i, slice):
            return tuple(self)[i]
        if i < 0:
            i += len(self)
        if not 0 <= i < len(self):
            raise IndexError(f"TransferLog index out of range. Received: {i}, len {len(self)}.")
        k = bisect.bisect_right(self._offsets, i)
        g, first = self._grants[k], self._offsets[k] - len(self._grants[k].shards)
        host, nbytes, inter = g.shards[i - first]
        return Transfer(g.vw, g.stage, g.wave, g.kind, g.device, host, nbytes, inter,
                        g.request, g.starts[i - first], g.ends[i - first])

    def __iter__(self) -> Iterator[Transfer]:
        return (Transfer(*r) for r in self._rows())

    def __eq__(self, other: object) -> bool:
        if isinstance(other, TransferLog):
            return list(self._rows()) == list(other._rows())
        if isinstance(other, (tuple, list)):
            return len(other) == len(self) and all(a == b for a, b in zip(self, other))
        return NotImplemented

    def __hash__(self) -> int:
        return hash(tuple(self._rows()))

    def __repr__(self) -> str:
        return f"TransferLog({len(self)} transfers)"

    def param_bytes(self) -> tuple[int, int]:
        """(bytes across hosts, bytes within hosts) of all transfers."""
        per_shards: dict[int, tuple[int, int]] = {}  # a stage's shards, once per stage
        inter = intra = 0
        for g in self._grants:
            if id(g.shards) not in per_shards:
                x = sum(nb for _, nb, is_inter in g.shards if is_inter)
                per_shards[id(g.shards)] = (x, sum(nb for _, nb, _ in g.shards) - x)
            a, b = per_shards[id(g.shards)]
            inter, intra = inter + a, intra + b
        return inter, intra
