"""WaveSync and ParameterServers against an independent account of every update.

A fake pipeline drives the real `WaveSync`s: each VW's minibatch k adds a one-hot update
(1 at its own index) to w_local, so any weights say EXACTLY which updates of which VW they
hold. The test computes, on its own, which minibatches form each VW's waves (chunks of N_m
from each run's first minibatch, a short final chunk, empty waves for a VW lifted at a run
start) and checks for every minibatch that ran:
- its weights = its own updates 1..p-N_m (or all of them at a run start) + the first
  `record[p][w]` waves of every other VW w, nothing else (the records are exact);
- `record[p]` meets WSP's bound at the VW's clock (`wsp.bound_holds`);
and that clocks stay within D + 1, continue across runs, and that fresh pulls happen.
"""

from __future__ import annotations

import random
import threading
import time

import numpy as np
import pytest
import tensorflow as tf

from hetpipe_tf.core import wsp
from hetpipe_tf.ps.server import ParameterServers
from hetpipe_tf.ps.wave_sync import WaveSync

SLOTS = 64   # one-hot slots per VW (more than the minibatches a VW takes in all runs)
CPU = "/device:CPU:0"


def _system(workers: int, n_m: int, d: int, fresh: bool):
    zeros = tf.zeros([workers * SLOTS], tf.float32)
    servers = ParameterServers([zeros], [CPU], workers)
    locals_ = []
    syncs = []
    for w in range(workers):
        with tf.device(CPU):
            local = tf.Variable(zeros, trainable=False)
        locals_.append(local)
        syncs.append(WaveSync(w, servers, [local], n_m, d, fresh_pulls=fresh))
    return servers, locals_, syncs


class FakeVW:
    """One VW: apply u_q, call after_apply(q), take the version of q + N_m (as the runtime's
    updater does), with no minibatches in flight beyond that."""

    def __init__(self, w, local, sync, n_m):
        self.w, self.local, self.sync, self.n_m = w, local, sync, n_m
        self.taken = 0
        self.versions: dict[int, np.ndarray] = {}
        self.clock_at_version: dict[int, int] = {}
        self.ran: list[int] = []
        self.run_first: dict[int, int] = {}   # minibatch -> first minibatch of its run

    def start_run(self):
        first = self.taken + 1
        self.sync.start_run(first)
        self._first = first
        for p in range(first, first + self.n_m):
            self.versions[p] = self.local.numpy().copy()
            self.clock_at_version[p] = self.sync.clock

    def step(self):
        self.taken += 1
        q = self.taken
        self.ran.append(q)
        self.run_first[q] = self._first
        self.local.assign_add(tf.one_hot(self.w * SLOTS + q - 1, self.local.shape[0]))
        self.sync.after_apply(q)
        self.versions[q + self.n_m] = self.local.numpy().copy()
        self.clock_at_version[q + self.n_m] = self.sync.clock


def _run(vws, servers, steps: int, seed: int, slow: dict[int, float]):
    """One run: VWs take minibatches from a shared pool of `steps` as fast as they can
    (the one with the smallest clock never waits); when the pool is empty the run ends at
    the servers, every VW finishes and flushes its unfinished wave."""
    servers.start_run()
    for vw in vws:
        vw.start_run()
    pool = list(range(steps))
    lock = threading.Lock()
    errors: list[BaseException] = []

    def loop(vw, rng):
        try:
            while True:
                with lock:
                    if not pool:
                        return
                    pool.pop()
                time.sleep(rng.random() * slow.get(vw.w, 0.0))
                vw.step()
        except BaseException as e:  # noqa: BLE001 - re-raised by the test
            errors.append(e)

    threads = [threading.Thread(target=loop, args=(vw, random.Random(seed * 10 + vw.w)))
               for vw in vws]
    for t in threads:
        t.start()
    try:
        deadline = time.monotonic() + 60
        while pool and not errors and time.monotonic() < deadline:
            time.sleep(0.005)
    finally:
        servers.end_run()   # data ran out: a VW waiting for a wave stops waiting
        for t in threads:
            t.join(timeout=60)
    assert not any(t.is_alive() for t in threads)
    if errors:
        raise errors[0]
    assert not pool
    for vw in vws:
        vw.sync.flush()


def _waves(vw_runs: list[list[int]], n_m: int, starts: list[int]) -> list[list[int]]:
    """Wave index -> minibatches of one VW: empty waves up to each run's start clock, then
    chunks of N_m of the run's minibatches, the last one possibly short."""
    waves: list[list[int]] = []
    for ran, start in zip(vw_runs, starts):
        assert len(waves) <= start
        waves += [[] for _ in range(start - len(waves))]
        waves += [ran[i:i + n_m] for i in range(0, len(ran), n_m)]
    return waves


def _check(vws, servers, n_m: int, d: int, runs: list[dict[int, list[int]]]):
    workers = len(vws)
    # Independent clocks: each run starts with every VW at the largest clock so far.
    starts, clocks = [], [0] * workers
    for run in runs:
        start = max(clocks)
        starts.append(start)
        clocks = [start + -(-len(run[w]) // n_m) for w in range(workers)]
    assert servers.run_start_clocks == [(s,) * workers for s in starts]
    assert servers.clocks == tuple(clocks)
    waves = [_waves([run[w] for run in runs], n_m, starts) for w in range(workers)]
    for vw in vws:
        for p in vw.ran:
            held = vw.sync.record[p]
            want = np.zeros(workers * SLOTS)
            first = vw.run_first[p]
            own_upto = first - 1 if p < first + n_m else p - n_m
            want[vw.w * SLOTS:vw.w * SLOTS + own_upto] = 1
            for other in range(workers):
                if other != vw.w:
                    for wave in waves[other][:held[other]]:
                        for k in wave:
                            want[other * SLOTS + k - 1] = 1
            np.testing.assert_array_equal(vw.versions[p], want, err_msg=f"VW {vw.w} p={p} "
                                          f"record={held}")
            assert wsp.bound_holds(held, vw.clock_at_version[p], d), (vw.w, p, held)
    assert servers.max_clock_distance <= d + 1


@pytest.mark.parametrize("n_m,d,fresh,seed", [(1, 0, True, 0), (2, 1, True, 1),
                                              (2, 3, True, 2), (2, 3, False, 3),
                                              (3, 2, True, 4), (1, 4, False, 5)])
def test_records_are_exact_and_meet_the_bound_across_runs(n_m, d, fresh, seed):
    servers, locals_, syncs = _system(2, n_m, d, fresh)
    vws = [FakeVW(w, locals_[w], syncs[w], n_m) for w in range(2)]
    runs = []
    for steps in (13, 9, 11):   # runs of uneven length: short final waves
        before = [len(vw.ran) for vw in vws]
        _run(vws, servers, steps, seed, slow={1: 0.004})
        runs.append({vw.w: vw.ran[before[vw.w]:] for vw in vws})
    _check(vws, servers, n_m, d, runs)
    # Every update of every VW reached w_global.
    total = sum(len(vw.ran) for vw in vws)
    assert servers.variables[0].numpy().sum() == total
    if not fresh:
        assert all(s.fresh_pull_count == 0 for s in syncs)


def _pushes(vw, n):
    for _ in range(n):
        vw.step()


@pytest.mark.parametrize("fresh", [True, False])
def test_a_wave_end_before_clock_d_takes_newer_global_weights_without_waiting(fresh):
    n_m, d = 2, 5
    servers, locals_, syncs = _system(2, n_m, d, fresh)
    vws = [FakeVW(w, locals_[w], syncs[w], n_m) for w in range(2)]
    servers.start_run()
    for vw in vws:
        vw.start_run()
    _pushes(vws[1], 4)            # VW 1 pushes waves 0 and 1 (c < D: no waiting)
    assert servers.clocks == (0, 2)
    _pushes(vws[0], 2)            # VW 0 ends wave 0 with c = 0 < D
    q = 2
    vw1_updates = vws[0].versions[q + n_m][SLOTS:SLOTS + 4]
    if fresh:
        assert syncs[0].record[q + n_m] == (1, 2)
        np.testing.assert_array_equal(vw1_updates, np.ones(4))
        assert syncs[0].fresh_pull_count == 1
    else:
        assert syncs[0].record[q + n_m] == (1, 0)
        np.testing.assert_array_equal(vw1_updates, np.zeros(4))
        assert syncs[0].fresh_pull_count == 0
    # Nothing newer from the other VW: no pull (VW 0's own wave does not make one due).
    pulls = servers.pull_count
    _pushes(vws[0], 2)
    assert servers.pull_count == pulls
    assert syncs[0].record[4 + n_m] == (2, 2 if fresh else 0)
    # Every local update of VW 0 survived the pull.
    np.testing.assert_array_equal(locals_[0].numpy()[:4], np.ones(4))
    servers.end_run()


def test_clocks_continue_across_runs_and_a_short_final_wave_counts_as_one():
    n_m, d = 2, 1
    servers, locals_, syncs = _system(2, n_m, d, True)
    vws = [FakeVW(w, locals_[w], syncs[w], n_m) for w in range(2)]
    servers.start_run()
    for vw in vws:
        vw.start_run()
    _pushes(vws[0], 2)
    _pushes(vws[1], 3)                 # wave 0, then one minibatch of wave 1
    servers.end_run()
    for s in syncs:
        s.flush()
    assert servers.clocks == (1, 2)    # VW 1's short final wave counts as one
    assert [p.final for p in servers.pushes] == [False, False, True]
    servers.start_run()
    for vw in vws:
        vw.start_run()
    assert servers.clocks == (2, 2)    # VW 0 lifted: it has nothing left to push
    # The next waves are numbered on (c = 2 >= D: each wave end waits for c - D, held).
    _pushes(vws[0], 2)
    _pushes(vws[1], 2)
    assert servers.clocks == (3, 3)
    assert [(p.worker, p.wave) for p in servers.pushes[3:]] == [(0, 2), (1, 2)]
    assert syncs[0].record[vws[0].taken + n_m] == (3, 2)   # pulled after waiting for wave 1
    servers.end_run()


def test_fresh_pulls_must_be_a_bool():
    servers, locals_, _ = _system(1, 1, 0, True)
    with pytest.raises(ValueError, match="fresh_pulls must be a bool.*fresh_pulls='yes'"):
        WaveSync(0, servers, locals_, 1, 0, fresh_pulls="yes")
