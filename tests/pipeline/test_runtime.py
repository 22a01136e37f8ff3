"""The threaded runtime's admission: with N_m minibatches in flight `submit` still returns
at once (the next minibatch waits in a one-place waiting room and starts when p - N_m
completes), and only the submit after it blocks."""

import threading

import tensorflow as tf

from tests.strategy.helpers import regression_data, threaded_one_stage


def test_submit_returns_with_n_m_in_flight_and_the_next_one_waits():
    x, y = regression_data(32, 2)
    strategy, model, runtime = threaded_one_stage(x, y, warmup_rows=8)
    done_before = runtime.completed
    gate = threading.Event()
    apply = runtime.versions.apply

    def held_apply(j, q, grads, deltas):
        gate.wait(30)        # the first update waits for the test
        return apply(j, q, grads, deltas)

    runtime.versions.apply = held_apply

    def batch(i):
        return ([tf.constant(x[8 * i:8 * i + 8])], tf.constant(y[8 * i:8 * i + 8]), None)

    try:
        runtime.submit(*batch(0))       # in flight
        runtime.submit(*batch(1))       # N_m = 1 in flight: waits, but submit returns
        assert runtime.in_flight == 2
        third = threading.Thread(target=runtime.submit, args=batch(2))
        third.start()
        third.join(0.5)
        assert third.is_alive()         # one waiting already: this submit blocks
        assert runtime.completed == done_before
        gate.set()
        third.join(30)
        assert not third.is_alive()
        runtime.drain()
    finally:
        gate.set()
        runtime.versions.apply = apply
    first = done_before + 1
    assert runtime.completed == first + 2
    # Every minibatch started after the one before it was applied (N_m = 1).
    for p in (first, first + 1, first + 2):
        assert runtime.record[p] == tuple(range(1, p))
    starts = {e.task.minibatch: e.start for e in runtime.trace}
    assert starts[first] < starts[first + 1] < starts[first + 2]
    strategy.close()
