"""The guarded calls' worker threads (hetpipe_tf/ps/call_workers.py) and the FaultGuard
that uses them: calls reuse one thread, a stuck call does not hold later ones, `around`
wraps each call with its end signalled inside, and nothing but a stuck worker is left
after `close()`."""

import contextlib
import threading
import time

import pytest

from hetpipe_tf.ps.call_workers import Call, CallWorkers
from hetpipe_tf.ps.faults import FaultGuard, FaultOptions, FaultPolicy, TaskUse
from tests.ps.fault_chiefs import silent_listener


def _run(workers: CallWorkers, fn, *args, timeout_s: float = 10.0):
    call = Call(fn, args)
    workers.start(call)
    assert call.done.wait(timeout_s), "the call did not end"
    if call.error is not None:
        raise call.error
    return call.value


def _named(name: str) -> list[threading.Thread]:
    return [t for t in threading.enumerate() if t.name == name]


def test_calls_reuse_one_thread_marked_by_on_start():
    local = threading.local()
    workers = CallWorkers("test-cw-reuse", on_start=lambda: setattr(local, "inside", True))
    try:
        seen = {_run(workers, lambda: (threading.get_ident(), local.inside)) for _ in range(20)}
        assert len(seen) == 1 and next(iter(seen))[1] is True
        assert next(iter(seen))[0] != threading.get_ident()
        with pytest.raises(ValueError, match="boom"):
            _run(workers, lambda: (_ for _ in ()).throw(ValueError("boom")))
        assert {_run(workers, threading.get_ident)} == {next(iter(seen))[0]}
    finally:
        workers.close()
    assert _named("test-cw-reuse") == []


def test_a_stuck_call_does_not_hold_later_calls_and_stays_behind_after_close():
    never = threading.Event()
    workers = CallWorkers("test-cw-stuck", on_start=lambda: None)
    try:
        first = _run(workers, threading.get_ident)
        stuck = Call(never.wait, ())
        workers.start(stuck)   # the caller gives up on it (as FaultGuard.call does)
        assert not stuck.done.wait(0.2)
        assert _run(workers, threading.get_ident) != first
        assert len(_named("test-cw-stuck")) == 2   # the stuck one and the one serving
        workers.close()
        left = _named("test-cw-stuck")
        assert len(left) == 1   # only the stuck one
        # A call after close runs on a worker that ends with it.
        after = Call(threading.get_ident, ())
        workers.start(after)
        assert after.done.wait(10) and after.error is None
        deadline = time.monotonic() + 10
        while len(_named("test-cw-stuck")) > 1 and time.monotonic() < deadline:
            time.sleep(0.01)
        assert _named("test-cw-stuck") == left
    finally:
        never.set()
        workers.close()
    deadline = time.monotonic() + 10
    while _named("test-cw-stuck") and time.monotonic() < deadline:
        time.sleep(0.01)
    assert _named("test-cw-stuck") == []   # the stuck worker ends with its call


def test_around_wraps_each_call_and_its_end_is_signalled_inside():
    events = []
    leave = threading.Event()

    @contextlib.contextmanager
    def around():
        events.append("enter")
        yield
        leave.wait(10)   # as leaving an executor may wait for a frozen task's op
        events.append("leave")

    workers = CallWorkers("test-cw-around", on_start=lambda: None, around=around)
    try:
        call = Call(lambda: events.append("call") or threading.get_ident(), ())
        workers.start(call)
        assert call.done.wait(10)
        assert events == ["enter", "call"]   # done before leaving
        # The first worker is still leaving: another takes the next call.
        assert _run(workers, threading.get_ident) != call.value
        assert events == ["enter", "call", "enter"]
        leave.set()
        deadline = time.monotonic() + 10
        while events.count("leave") < 2 and time.monotonic() < deadline:
            time.sleep(0.01)
        assert events.count("leave") == 2
    finally:
        leave.set()
        workers.close()
    assert _named("test-cw-around") == []


class _SlowToReturn(threading.Event):
    """A call's `done` whose worker takes a while to return after setting it (as on a
    loaded machine): `close` must still join that worker."""

    def set(self):
        super().set()
        time.sleep(0.3)


def test_an_around_that_fails_is_the_calls_error_and_the_next_call_gets_a_fresh_worker():
    failing = [True]

    @contextlib.contextmanager
    def around():
        if failing[0]:
            failing[0] = False
            raise RuntimeError("no executor")
        yield

    workers = CallWorkers("test-cw-fail", on_start=lambda: None, around=around)
    try:
        first = Call(lambda: 1, ())
        first.done = _SlowToReturn()
        workers.start(first)
        assert first.done.wait(10)
        assert isinstance(first.error, RuntimeError) and "no executor" in str(first.error)
        assert _run(workers, lambda: 2) == 2
    finally:
        workers.close()
    assert _named("test-cw-fail") == []


@pytest.mark.parametrize("policy", list(FaultPolicy))
def test_guard_runs_its_calls_on_one_long_lived_thread_marked_inside(policy):
    before = set(_named("hetpipe-guarded-call"))
    s, silent = silent_listener()
    guard = FaultGuard(FaultOptions(60.0, policy),
                       {"worker:1": TaskUse(((1, 0, "/job:worker/task:1"),))},
                       {"worker:1": silent}, num_virtual_workers=2)
    try:
        assert not guard.inside()
        seen = {guard.call(lambda: (threading.get_ident(), guard.inside())) for _ in range(50)}
        assert {inside for _, inside in seen} == {True}
        # Under CONTINUE the next call can come while the last worker is still leaving its
        # executor: a second worker takes it, and the two serve from then on.
        assert len(seen) <= (1 if policy is FaultPolicy.STOP else 2), seen
        if policy is FaultPolicy.CONTINUE:   # each call in an executor of its own
            from tensorflow.python.eager import context

            default = context.context().executor.handle()
            assert guard.call(lambda: context.context().executor.handle()) != default
    finally:
        guard.close()
        s.close()
    assert set(_named("hetpipe-guarded-call")) == before
