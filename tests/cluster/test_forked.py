"""hetpipe_tf.cluster.forked: servers forked from one process that imported TensorFlow."""

import os
import signal
import subprocess
import sys

import pytest

from benchmarks._wire import cpu_seconds
from hetpipe_tf.cluster import forked, serve
from hetpipe_tf.cluster.lifetime import stop_processes
from hetpipe_tf.cluster.probe import wait_until_reachable
from tests.benchmarks.binaries import ROOT


def test_servers_are_forked_with_tensorflow_imported_and_die_with_the_zygote():
    """Each server is a fork of one process that imported TensorFlow (forked.py): it serves
    without a TensorFlow start of its own (a start costs about 7 CPU-seconds). Stopping the
    zygote stops every server it forked."""
    with serve.start_local_servers({"worker": 1, "ps": 1}) as servers:
        wait_until_reachable({t: servers.cluster[t.split(":")[0]][int(t.split(":")[1])]
                              for t in servers.tasks}, timeout_s=120)
        for pid in servers.pids:
            assert cpu_seconds([pid]) < 2.0, (pid, cpu_seconds([pid]))
            assert os.getpgid(pid) == pid   # its own process group
        zygote = forked.zygote_pid()
        forked.stop()
        with pytest.raises(ProcessLookupError):
            os.kill(zygote, 0)
        for pid in servers.pids:
            assert forked.wait_gone(pid, timeout_s=30), pid


_CLIENT = """
import threading, time
from hetpipe_tf.cluster import forked, serve
from hetpipe_tf.cluster.lifetime import stop_processes

started = []
def begin():   # from a thread that ends: the zygote must outlive it
    servers = serve.start_local_servers({"worker": 1, "ps": 1})   # kept: not collected
    started.append(servers)
    started.append(servers.__enter__())
t = threading.Thread(target=begin)
t.start()
t.join()
time.sleep(0.5)
print(forked.zygote_pid(), *started[1].pids, flush=True)
time.sleep(600)
"""


def test_the_zygote_outlives_the_thread_that_started_it_and_ends_with_its_client():
    client = subprocess.Popen([sys.executable, "-c", _CLIENT], cwd=ROOT, text=True,
                              stdout=subprocess.PIPE, stderr=subprocess.DEVNULL)
    pids = []
    try:
        pids = [int(p) for p in client.stdout.readline().split()]
        assert len(pids) == 3, pids   # the zygote, worker:0's and ps:0's servers
        for pid in pids:
            os.kill(pid, 0)   # running after the starting thread ended
        client.kill()   # SIGKILL: no atexit, no cleanup of its own
        client.wait(timeout=30)
        for pid in pids:
            assert forked.wait_gone(pid, timeout_s=30), pid
    finally:
        client.kill()
        client.wait(timeout=30)
        # Whatever is left after a failure, by its pid (the launcher's stopper).
        stop_processes(pids, grace_s=5, first=signal.SIGKILL)
