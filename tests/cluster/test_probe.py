"""The chief's probe before training (hetpipe_tf.cluster.probe): a host name that does not
resolve is named at once, without waiting the bound; IP addresses are not looked up."""

import socket
import time

import pytest

from hetpipe_tf.cluster import probe
from hetpipe_tf.cluster.probe import Health, TaskUnreachableError, wait_until_reachable


def test_unresolvable_host_is_named_at_once(monkeypatch):
    real = socket.getaddrinfo
    asked = []

    def fake(host, port, *args, **kwargs):
        asked.append(host)
        if host == "node-7.cluster":
            raise socket.gaierror(socket.EAI_NONAME, "Name or service not known")
        return real(host, port, *args, **kwargs)

    monkeypatch.setattr(probe.socket, "getaddrinfo", fake)
    start = time.monotonic()
    with pytest.raises(TaskUnreachableError) as e:
        wait_until_reachable({"worker:0": "127.0.0.1:1", "ps:0": "node-7.cluster:2222"},
                             timeout_s=60)
    assert time.monotonic() - start < 5   # not the 60 s bound
    assert (e.value.task, e.value.health) == ("ps:0", Health.UNRESOLVED)
    assert str(e.value) == (
        "Task ps:0 at node-7.cluster:2222 cannot be reached: its host 'node-7.cluster' does "
        "not resolve (Name or service not known). Received: ps:0='node-7.cluster:2222'; fix "
        "the host name (DNS or /etc/hosts of this machine) or give an IP address.")
    assert "nothing listens there" not in str(e.value)
    assert asked == ["127.0.0.1", "node-7.cluster"]


def test_reserved_invalid_name_does_not_resolve():
    try:
        socket.getaddrinfo("hetpipe-test.invalid", 1)
        pytest.skip("this machine's resolver answers for .invalid names")
    except socket.gaierror:
        pass
    start = time.monotonic()
    with pytest.raises(TaskUnreachableError, match="'hetpipe-test.invalid' does not resolve"):
        wait_until_reachable({"worker:0": "hetpipe-test.invalid:2222"}, timeout_s=60)
    assert time.monotonic() - start < 30


def test_refused_address_still_waits_the_bound():
    start = time.monotonic()
    with pytest.raises(TaskUnreachableError, match="nothing listens there") as e:
        wait_until_reachable({"worker:0": "127.0.0.1:1"}, timeout_s=0.5)
    assert e.value.health is Health.REFUSED and time.monotonic() - start >= 0.5
