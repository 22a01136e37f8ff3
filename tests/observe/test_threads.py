"""observe/threads.py: this process's CPU and blocking by thread name, from /proc."""

import threading
import time

from hetpipe_tf.observe.threads import thread_cpu, thread_switches


def _run_beside_an_idle_thread(work, name: str, seen: dict, done: threading.Event,
                               poke=lambda: None) -> None:
    """`work` on a thread called `name` beside one called "idle-thread" that only waits for
    `done`; returns once `work` put `name` into `seen` (calling `poke` every 2 ms), with
    both threads joined."""
    worker = threading.Thread(target=work, name=name)
    idle = threading.Thread(target=done.wait, name="idle-thread")
    worker.start(), idle.start()
    try:
        deadline = time.monotonic() + 60
        while name not in seen and time.monotonic() < deadline:
            time.sleep(0.002)
            poke()
    finally:
        done.set()
        worker.join(), idle.join()


def test_a_busy_thread_shows_its_cpu_under_its_name_and_an_idle_one_little():
    done = threading.Event()
    seen = {}

    def spin():
        end = time.process_time() + 0.3
        while time.process_time() < end:
            pass
        seen.update(thread_cpu())
        done.wait()

    _run_beside_an_idle_thread(spin, "busy-thread", seen, done)
    # process_time counts every thread: the busy one spun for at most 0.3 s of CPU
    assert 0 < seen["busy-thread"] <= 0.3 + 0.05, seen
    assert seen.get("idle-thread", 0.0) < 0.05, seen
    assert seen["MainThread"] >= 0, seen


def test_native_threads_with_the_process_name_take_the_label_given():
    names = thread_cpu("(native)")
    assert "MainThread" in names and all(v >= 0 for v in names.values())


def test_a_thread_that_waits_for_each_hand_off_shows_its_switches_under_its_name():
    """30 hand-offs, each a wait on an Event the main thread sets every 2 ms: at least 20
    voluntary switches for that thread (a set landing between its clear and its next wait
    does not block it); a thread blocked once shows a few at most."""
    go, done = threading.Event(), threading.Event()
    seen = {}

    def handed(n=30):
        for _ in range(n):
            go.wait()
            go.clear()
        seen.update(thread_switches())
        done.wait()

    _run_beside_an_idle_thread(handed, "waiter-thread", seen, done, poke=go.set)
    assert seen["waiter-thread"] >= 20, seen
    assert seen["idle-thread"] <= 5, seen
