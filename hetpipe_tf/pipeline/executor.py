"""The one interface the strategy drives: one virtual worker's `PipelineRuntime` and the
`Coordinator` of several (hetpipe_tf/ps) are both Executors.

An Executor owns its threads (daemon threads, so an Executor nobody closed cannot keep the
interpreter alive; `close()` or leaving `with executor:` stops and joins them) and keeps
the first error of its threads, re-raised as itself by the next call.
"""

from __future__ import annotations

import abc
from typing import Any


class Executor(abc.ABC):
    _error: BaseException | None = None
    _closed: bool = False

    @abc.abstractmethod
    def submit(self, inputs: list, y: Any, sample_weight: Any) -> None:
        """Hand over one minibatch; returns once it is admitted (at most N_m in flight)."""

    @abc.abstractmethod
    def drain(self) -> None:
        """Wait until every submitted minibatch is applied; ends the run."""

    @abc.abstractmethod
    def abort(self) -> None:
        """Drop what was not committed, keep what was applied, end the run, clear errors."""

    @abc.abstractmethod
    def close(self) -> None:
        """Abort, then stop and join every thread."""

    @property
    @abc.abstractmethod
    def thread_ids(self) -> set[int]:
        """Idents of the threads this Executor owns."""

    @property
    def closed(self) -> bool:
        """Whether `close()` ran (the Executor takes no more work)."""
        return self._closed

    @property
    def error(self) -> BaseException | None:
        """The first exception a thread raised, if any."""
        return self._error

    def _raise_if_failed(self) -> None:
        if self._error is not None:
            raise self._error

    def __enter__(self):
        return self

    def __exit__(self, *exc) -> None:
        self.close()
