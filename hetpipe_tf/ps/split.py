"""Split dispatch of several virtual workers: every batch cut into one share per VW.

The default `Coordinator` hands each batch Keras gives the strategy, whole, to whichever
VW is free, so a faster VW takes MORE minibatches. `SplitCoordinator` cuts every batch of
N samples along the batch dimension into shares n_1..n_K (`partitioner/shares.py`, chosen
from each VW's throughput) and gives share k to VW k, so a faster VW takes a LARGER
minibatch (HetSeq's rule, extended to pipelined VWs and to D > 0).

Each share's gradients (and its float non-trainable deltas, e.g. BatchNorm's moving
statistics) are multiplied by n_k / N before its VW applies them (`Minibatch.loss_scale`,
pipeline/runtime.py): a loss that averages over its batch then gives, summed over the K
shares, the gradient of the whole batch's loss. The metrics see each share's unweighted
loss with n_k as its weight (the strategy's `update_metrics`), as Keras would for the
whole batch. Everything else is WSP unchanged: every VW pushes its own updates in waves
and the clock distance D bounds how far one VW runs ahead (docs/hetseq.md). With SGD,
N_m = 1 and D = 0 a wave is exactly one SGD step on the whole batch.

A batch smaller than the planned one (an epoch's remainder) is split by the same rule in
proportion, every VW taking at least one sample when there are enough; a VW whose share
is 0 (a batch smaller than the number of VWs) sits the batch out.
"""

from __future__ import annotations

import queue
from typing import Any, Sequence

from hetpipe_tf.partitioner.shares import Shares
from hetpipe_tf.ps.coordinator import _STOP, Coordinator
from hetpipe_tf.ps.hetseq import _rows


class _ShareQueues:
    """One queue per VW behind the calls the base coordinator makes on its one queue
    (`join` at drain; `get_nowait`/`task_done` when an abort drops queued batches; `put`
    of one stop marker per feeder at close)."""

    def __init__(self, k: int, maxsize: int):
        self.queues = [queue.Queue(maxsize=maxsize) for _ in range(k)]
        self._stops = 0
        self._last: queue.Queue | None = None

    def put(self, item) -> None:
        if item is not _STOP:
            raise TypeError("A split batch goes to each VW's own queue.")
        self.queues[self._stops % len(self.queues)].put(item)
        self._stops += 1

    def get_nowait(self):
        for q in self.queues:
            try:
                item = q.get_nowait()
            except queue.Empty:
                continue
            self._last = q
            return item
        raise queue.Empty

    def task_done(self) -> None:
        self._last.task_done()

    def join(self) -> None:
        for q in self.queues:
            q.join()


class SplitCoordinator(Coordinator):
    """A `Coordinator` whose every batch is split into one share per VW (module docstring).

    Args (besides the Coordinator's):
      shares: the VWs' shares of the planned batch (`Shares`, one per runtime, in order).
      queue_size: shares a VW may have queued beyond those in flight (a VW may run up to
        D waves ahead of the slowest; the strategy gives (D + 1) x N_m).
    """

    _can_drop = False   # a lost VW's share would have no taker: on_fault='continue' stops

    def __init__(self, runtimes: Sequence[Any], *args, shares: Shares, queue_size: int = 1,
                 **kwargs):
        if len(shares.sizes) != len(runtimes):
            raise ValueError(f"Split batches need one share per virtual worker. Received: "
                             f"shares={list(shares.sizes)} for {len(runtimes)} VWs.")
        self.shares = shares
        self.splits: list[tuple[int, ...]] = []   # each step's share sizes (last runs)
        self._queue_size = max(1, int(queue_size))
        self._k = len(runtimes)
        super().__init__(runtimes, *args, **kwargs)

    def _new_queue(self):
        return _ShareQueues(self._k, self._queue_size)

    def _source(self, w: int) -> queue.Queue:
        return self._queue.queues[w]

    def _enqueue(self, step: int, inputs: list, y, sample_weight) -> None:
        n = int(inputs[0].shape[0])
        sizes = self.shares.split(n, minimum=1 if n >= self._k else 0)
        self.splits.append(sizes)
        if len(self.splits) > 1000:
            del self.splits[:500]
        a = 0
        for w, m in enumerate(sizes):
            if m:
                b = a + m
                self._queue.queues[w].put((self._generation, step, [x[a:b] for x in inputs],
                                           _rows(y, a, b), _rows(sample_weight, a, b),
                                           m / n))
                a = b


def split_description(shares: Shares, plans: Sequence[Any]) -> str:
    """The table of the VWs' shares, each VW named by its devices."""
    lines = [f"Split batches: each batch of {shares.batch_size} is cut into one share per "
             f"virtual worker, a faster VW taking a larger minibatch (not more of them); "
             f"each share's gradient weighted by n_k / N (docs/hetseq.md).",
             shares.table()]
    for k, p in enumerate(plans):
        lines.append(f"  vw{k}: {'+'.join(p.devices)} ({p.num_stages} stage(s), predicted "
                     f"{p.predicted_stage_time_s * 1e3:.3f} ms a minibatch of "
                     f"{p.batch_size} at its slowest stage)")
    lines.append(dispatch_comparison(shares))
    return "\n".join(lines)


def dispatch_comparison(shares: Shares) -> str:
    """The two dispatches' predicted pace from the same speeds: whole batches (each VW
    takes batches of N at its own pace, but under WSP every VW's clock stays within D of
    the slowest's, so in the long run each runs at the slowest one's pace: K x N / its
    time) against split batches (N / the slowest share's time)."""
    n, k = shares.batch_size, len(shares.sizes)
    whole = k * n / max(s.time(n) for s in shares.speeds)
    split = n / max(shares.step_s)
    return (f"Predicted {split:.4g} samples/s with split batches against {whole:.4g} with "
            f"whole batches to whichever VW is free (its clock within D of the slowest "
            f"VW's, each VW runs at the slowest one's pace in the long run): "
            f"{split / whole:.2f}x.")
