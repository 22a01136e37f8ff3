"""WSP's pushes and pulls between the VWs and the parameter servers, in time order.

The protocol (docs/simulator.md "Decisions"):
* stage j of VW v pushes its shards of wave c at the end of its last task of the wave's
  last minibatch (`add_push`); the VW's push of wave c is done when every stage's shards
  arrived; global wave c is done when every VW's push of wave c is done;
* after pushing wave c the VW pulls (every stage, every shard) the global weights that
  include wave c - D, once that global wave is done; no pull before wave D, none after the
  last wave (it would gate nothing). `pull_done[v][c]` is when the last shard arrived.

Requests are granted in (time, sequence) order through one `LinkPool`. Pushes are
numbered by (VW, wave, stage) and pulls after every push, in the order they are issued,
so the grants do not depend on when a push was added, as long as it was added before
anything later was granted (`add_push` checks it). That lets the engine add a wave's
pushes only once its pipeline events are final (`on_pull_done`).
"""

from __future__ import annotations

import heapq
from typing import Callable, Sequence

from hetpipe_tf.cluster.spec import Cluster
from hetpipe_tf.sim.links import LinkPool
from hetpipe_tf.sim.model import SimConfig, VirtualWorker
from hetpipe_tf.sim.network import SharedPool

_PUSH, _PULL = "push", "pull"


class OutOfOrder(RuntimeError):
    """A push was added after a later request had been granted (the engine then falls
    back to the fixed point, which queues every push before granting any)."""


class Replay:
    """Push/pull state of every VW; `run` grants the queued requests in time order."""

    def __init__(self, vws: Sequence[VirtualWorker], cfg: SimConfig, cluster: Cluster,
                 on_pull_done: Callable[[int, int], None] | None = None) -> None:
        self.pool = (LinkPool(cluster, cfg.intra_scale) if cfg.network is None
                     else SharedPool(cluster, cfg.network, cfg.intra_scale))
        self._routes = [[self.pool.stage_routes(s) for s in vw.stages] for vw in vws]
        self._k = [vw.num_stages for vw in vws]
        self._first_seq, total = [], 0
        for k in self._k:  # push seq = (VW, wave, stage) order, as if all were queued at once
            self._first_seq.append(total)
            total += k * cfg.num_waves
        self._next_pull_seq = total
        self._waves, self._d = cfg.num_waves, cfg.clock_distance
        self._on_pull_done = on_pull_done
        self._heap: list[tuple[float, int, int, int, int, str]] = []
        self._last = (float("-inf"), -1)  # key of the last granted request
        n = len(vws)
        self._stage_left = [[k] * self._waves for k in self._k]
        self._push_done: list[dict[int, float]] = [{} for _ in range(n)]
        self._pull_left: list[dict[int, int]] = [{} for _ in range(n)]
        self.pull_done: list[dict[int, float]] = [{} for _ in range(n)]
        self._vw_left = [n] * self._waves
        self._global_partial: dict[int, float] = {}
        self.global_done: dict[int, float] = {}

    def add_push(self, v: int, c: int, j: int, t: float) -> None:
        """Stage j of VW v pushes wave c at time t."""
        seq = self._first_seq[v] + c * self._k[v] + j
        if (t, seq) <= self._last:
            raise OutOfOrder(f"A push was added after later transfers were granted. "
                             f"Received: vw={v}, wave={c}, stage={j}, t={t}, last granted "
                             f"(t, seq)={self._last}; queue every push before `run`.")
        heapq.heappush(self._heap, (t, seq, v, c, j, _PUSH))

    def _maybe_pull(self, v: int, c: int) -> None:
        r = c - self._d
        if (r < 0 or c + 1 >= self._waves or c in self._pull_left[v]
                or self._stage_left[v][c] > 0 or r not in self.global_done):
            return  # (the last wave's pull would gate nothing)
        t = max(self._push_done[v][c], self.global_done[r])
        self._pull_left[v][c] = self._k[v]
        for j in range(self._k[v]):
            heapq.heappush(self._heap, (t, self._next_pull_seq, v, c, j, _PULL))
            self._next_pull_seq += 1

    def _pushed(self, v: int, c: int, end: float) -> None:
        self._stage_left[v][c] -= 1
        self._push_done[v][c] = max(self._push_done[v].get(c, 0.0), end)
        if self._stage_left[v][c] > 0:
            return
        self._vw_left[c] -= 1
        self._global_partial[c] = max(self._global_partial.get(c, 0.0), self._push_done[v][c])
        if self._vw_left[c] == 0:
            self.global_done[c] = self._global_partial[c]
            if c + self._d < self._waves:  # pulls that were waiting for this global wave
                for u in range(len(self._k)):
                    self._maybe_pull(u, c + self._d)
        self._maybe_pull(v, c)

    def _pulled(self, v: int, c: int, end: float) -> None:
        self._pull_left[v][c] -= 1
        self.pull_done[v][c] = max(self.pull_done[v].get(c, 0.0), end)
        if self._pull_left[v][c] == 0 and self._on_pull_done is not None:
            self._on_pull_done(v, c)  # may add pushes (later than this grant)

    def run(self) -> None:
        """Grant every queued request (and those they cause) in (time, sequence) order."""
        if isinstance(self.pool, SharedPool):
            self._run_shared(self.pool)
            return
        heap, send, routes = self._heap, self.pool.send, self._routes
        while heap:
            t, seq, v, c, j, kind = heapq.heappop(heap)
            self._last = (t, seq)
            end = send(routes[v][j], t, vw=v, stage=j, wave=c, kind=kind)
            if kind is _PUSH:
                self._pushed(v, c, end)
            else:
                self._pulled(v, c, end)

    def _run_shared(self, pool: SharedPool) -> None:
        """The shared-links form of `run`: requests start flows in (time, sequence) order;
        flows end as the fair shares give; a request is done when its last shard is
        (a push: transferred and applied). Completions before the next request come first,
        and what they cause is queued at or after their time."""
        heap, net, routes = self._heap, pool.net, self._routes
        owner: dict[int, tuple[list, int, bool]] = {}   # flow -> (request state, shard, push)
        while heap or net.active:
            t_next = net.next_completion()
            if heap and heap[0][0] < t_next:
                t, seq, v, c, j, kind = heapq.heappop(heap)
                self._last = (t, seq)
                # A flow within the network's tolerance of its end finishes here too.
                self._ended(pool, owner, net.advance(max(t, net.now)))
                r = routes[v][j]
                state = [t, v, c, j, kind, r, [t] * len(r.shards), len(r.shards)]
                for i, sh in enumerate(r.shards):
                    push = kind is _PUSH
                    self._start(net, owner, state, i, sh, push, transfer=True)
                if state[7] == 0:
                    self._finish(pool, state)
                continue
            self._ended(pool, owner, net.advance(t_next))

    def _ended(self, pool: SharedPool, owner: dict, flows: list[int]) -> None:
        """Flows that ended: a push's transfer goes on to its apply; a request whose last
        shard ended is done."""
        net = pool.net
        for f in flows:
            state, i, transfer = owner.pop(f)
            sh = state[5].shards[i]
            if transfer and state[4] is _PUSH and sh.apply is not None:
                self._start(net, owner, state, i, sh, True, transfer=False)
            else:
                state[6][i] = net.now
                state[7] -= 1
                if state[7] == 0:
                    self._finish(pool, state)

    @staticmethod
    def _start(net, owner, state, i, sh, push: bool, *, transfer: bool) -> None:
        if sh.nbytes <= 0:
            state[7] -= 1
            return
        if transfer:
            f = net.start(sh.nbytes, sh.push if push else sh.pull, sh.cap)
        else:
            f = net.start(sh.nbytes, (sh.apply,))
        owner[f] = (state, i, transfer)

    def _finish(self, pool: SharedPool, state: list) -> None:
        t, v, c, j, kind, r, ends, _ = state
        pool.record(r, t, ends, vw=v, stage=j, wave=c, kind=kind)
        end = max([t, *ends])
        if kind is _PUSH:
            self._pushed(v, c, end)
        else:
            self._pulled(v, c, end)
