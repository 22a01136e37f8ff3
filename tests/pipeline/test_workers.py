"""Tests of hetpipe_tf.pipeline.workers: owned threads, errors forwarded as raised."""

import threading

from hetpipe_tf.pipeline.workers import STOP, Loop, Workers, take_queued


class _Boom(KeyError):
    pass


def test_threads_run_their_items_forward_errors_with_their_type_and_are_joined():
    seen, done, failed = [], [], []
    finished = threading.Semaphore(0)

    def run(item):
        if item == "bad":
            raise _Boom(item)
        seen.append((threading.current_thread().name, item))

    def after(item):
        done.append(item)
        finished.release()

    workers = Workers([Loop("t-0", run, lambda item: f"thread 0 ({item})", after, False),
                       Loop("t-1", run, lambda item: f"thread 1 ({item})", after, False)],
                      lambda e, where: failed.append((e, where)))
    assert len(workers.ids) == 2 and all(t.daemon for t in workers.threads)
    workers.queues[0].put("a")
    workers.queues[1].put("bad")
    workers.queues[1].put("b")
    for _ in range(3):
        assert finished.acquire(timeout=30)
    assert sorted(seen) == [("t-0", "a"), ("t-1", "b")]
    assert sorted(done) == ["a", "b", "bad"]          # after each item, raised or not
    (error, where), = failed
    assert type(error) is _Boom and where == "thread 1 (bad)"
    workers.close()
    assert not any(t.is_alive() for t in workers.threads)


def test_take_queued_takes_n_items_only_when_n_are_queued_and_leaves_stop_last():
    import queue

    q = queue.Queue()
    for item in (1, 2):
        q.put(item)
    assert take_queued(q, 3) == [] and q.qsize() == 2   # too few: none taken
    assert take_queued(q, 0) == []
    assert take_queued(q, 1) == [1] and q.qsize() == 1
    q.put(STOP)
    assert take_queued(q, 2) == [2]   # STOP ends the list and stays the last item
    assert q.get_nowait() is STOP and q.empty()
