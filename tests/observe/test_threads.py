"""observe/threads.py: this process's CPU by thread name, from /proc."""

import threading
import time

from hetpipe_tf.observe.threads import thread_cpu


def test_a_busy_thread_shows_its_cpu_under_its_name_and_an_idle_one_little():
    done = threading.Event()
    seen = {}

    def spin():
        end = time.process_time() + 0.3
        while time.process_time() < end:
            pass
        seen.update(thread_cpu())
        done.wait()

    busy = threading.Thread(target=spin, name="busy-thread")
    idle = threading.Thread(target=done.wait, name="idle-thread")
    busy.start(), idle.start()
    try:
        deadline = time.monotonic() + 60
        while "busy-thread" not in seen and time.monotonic() < deadline:
            time.sleep(0.05)
    finally:
        done.set()
        busy.join(), idle.join()
    # process_time counts every thread: the busy one spun for at most 0.3 s of CPU
    assert 0 < seen["busy-thread"] <= 0.3 + 0.05, seen
    assert seen.get("idle-thread", 0.0) < 0.05, seen
    assert seen["MainThread"] >= 0, seen


def test_native_threads_with_the_process_name_take_the_label_given():
    names = thread_cpu("(native)")
    assert "MainThread" in names and all(v >= 0 for v in names.values())
