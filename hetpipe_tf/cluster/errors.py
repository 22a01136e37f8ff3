"""The errors of the cluster package, in one place every cluster module may import.

Every refused value reads "what is wrong. Received: x=...; how to fix" (`invalid`): a
`ValueError` for a spec, a TF cluster or a local emulation, an `AllocationError` (also a
ValueError) when devices cannot be grouped into virtual workers as asked.
"""

from __future__ import annotations

__all__ = ["AllocationError", "invalid"]


class AllocationError(ValueError):
    """The requested allocation cannot be built on this cluster."""


def invalid(what: str, received: str, fix: str,
            error: type[ValueError] = ValueError) -> ValueError:
    """The error to raise for a refused value: `error("<what>. Received: <received>; <fix>.")`."""
    return error(f"{what}. Received: {received}; {fix}.")
