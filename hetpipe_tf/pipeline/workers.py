"""The threads an Executor owns: started together, fed by queues, stopped and joined together.

One `Workers` runs one daemon thread per `Loop` (daemons, so that an Executor nobody closed
cannot keep the interpreter alive). Each thread takes the items of its own queue until
`STOP` and hands each to its loop's `run`; an exception from `run` is forwarded, as raised
(its own type), to the owner's `fail` with the place it came from, and `done` runs after
every item, raised or not. `close` puts `STOP` into every queue and joins every thread but
the calling one (torchgpipe's `worker.py` shape: spawned, joined, exceptions forwarded).
"""

from __future__ import annotations

import contextlib
import dataclasses
import queue
import threading
from typing import Any, Callable, Sequence

STOP = object()   # the queue item that ends a worker thread


def thread_scope() -> Any:
    """Entered by each thread of an Executor around its whole loop: in a process connected
    to a cluster, the thread's eager ops run in an executor of their own, so that a lost
    task's failed ops block only the threads that worked for it (a stage, wave sync or
    feeder of the VW it served), never the others' (`tf_executors.own_executor`,
    docs/cluster_jobs.md "Going on without a lost VW"). Local jobs keep TensorFlow's
    default executor: nothing to lose there."""
    from hetpipe_tf._shim import tf_executors
    from hetpipe_tf.cluster.roles import connected_to_cluster

    return tf_executors.own_executor() if connected_to_cluster() else contextlib.nullcontext()


def take_queued(q: queue.Queue, n: int) -> list:
    """The next `n` items of `q` if at least `n` are queued, else none (call only from the
    thread that takes `q`'s items: then none leaves meanwhile); a `STOP` among them stays
    (put back: it is the last item a queue gets) and ends the list."""
    items: list = []
    if n < 1 or q.qsize() < n:
        return items
    for _ in range(n):
        item = q.get_nowait()
        if item is STOP:
            q.put(item)
            break
        items.append(item)
    return items


def _nothing(item: Any) -> None:
    return None


@dataclasses.dataclass(frozen=True)
class Loop:
    """What one worker thread does with each item of its queue.

    Attributes:
      name: the thread's name.
      run: the work on one item; what it raises goes to the owner's `fail`.
      where: names the thread and the item in that error's note.
      done: runs after each item, whether `run` raised or not.
      scoped: the whole loop runs inside `thread_scope()`.
    """

    name: str
    run: Callable[[Any], None]
    where: Callable[[Any], str]
    done: Callable[[Any], None] = _nothing
    scoped: bool = True


class Workers:
    """One started daemon thread and one queue per `Loop`; `fail(error, where)` receives
    what a loop raised."""

    def __init__(self, loops: Sequence[Loop], fail: Callable[[BaseException, str], None]):
        self._fail = fail
        self.queues: list[queue.Queue] = [queue.Queue() for _ in loops]
        self.threads = [threading.Thread(target=self._serve, args=(loop, q), daemon=True,
                                         name=loop.name)
                        for loop, q in zip(loops, self.queues)]
        for t in self.threads:
            t.start()

    @property
    def ids(self) -> set[int]:
        return {t.ident for t in self.threads}

    def _serve(self, loop: Loop, q: queue.Queue) -> None:
        with thread_scope() if loop.scoped else contextlib.nullcontext():
            while True:
                item = q.get()
                if item is STOP:
                    return
                try:
                    loop.run(item)
                except BaseException as e:  # noqa: BLE001 - forwarded: re-raised by the owner
                    self._fail(e, loop.where(item))
                finally:
                    loop.done(item)

    def stop(self) -> None:
        """Let every thread end when it reaches STOP in its queue (no join: a thread stuck in
        a lost task's remote op stays behind as a daemon)."""
        for q in self.queues:
            q.put(STOP)

    def close(self) -> None:
        """`stop`, then join every thread (not the calling one)."""
        self.stop()
        for t in self.threads:
            if t is not threading.current_thread():
                t.join()
