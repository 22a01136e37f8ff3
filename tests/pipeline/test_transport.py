"""pipeline/transport.py: logs read in one call equal per-value reads (values and
dtypes); which process hosts a compiled call."""

import numpy as np
import pytest
import tensorflow as tf

from hetpipe_tf.pipeline import transport


def _logs():
    return {"loss": tf.constant(0.1234567, tf.float32), "acc": tf.constant(0.75, tf.float32),
            "big": tf.constant(3.0e38, tf.float32), "steps": tf.constant(123456789, tf.int32),
            "d": tf.constant(1 / 3, tf.float64), "flag": tf.constant(True)}


def test_packed_logs_equal_per_value_reads(monkeypatch):
    monkeypatch.setattr(transport, "_is_remote", lambda device: True)   # pack locally
    logs = _logs()
    got = transport.host_values(logs)
    want = {k: v.numpy() for k, v in logs.items()}
    assert list(got) == list(want)
    for k in want:
        assert type(got[k]) is type(want[k]) and got[k] == want[k], k


def test_what_is_not_packed_is_read_as_is():
    # Local tensors, a vector, an int64: one .numpy() each, unchanged.
    logs = {"v": tf.constant([1.0, 2.0]), "n": tf.constant(2**60, tf.int64),
            "x": tf.constant(0.5)}
    got = transport.host_values(logs)
    assert got["n"] == 2**60 and got["x"] == np.float32(0.5)
    np.testing.assert_array_equal(got["v"], [1.0, 2.0])


def test_task_of():
    assert transport.task_of("/job:worker/replica:0/task:3/device:CPU:0") == ("worker", 3)
    assert transport.task_of("/job:ps/task:1/device:CPU:0") == ("ps", 1)
    assert transport.task_of("/job:localhost/replica:0/task:0/device:CPU:1") is None
    assert transport.task_of("/device:CPU:1") is None and transport.task_of("") is None


class _On:
    def __init__(self, device):
        self.device = device
        self.waited = 0

    @property
    def shape(self):
        self.waited += 1
        return ()


def test_only_tensors_of_other_remote_tasks_are_waited_for(monkeypatch):
    monkeypatch.setattr(transport.tf_executors, "host_task",
                        lambda: "/job:chief/replica:0/task:0")
    w0 = "/job:worker/replica:0/task:0/device:CPU:0"
    same, here = _On(w0), _On("/job:chief/replica:0/task:0/device:CPU:0")
    ps = _On("/job:ps/replica:0/task:0/device:CPU:0")
    transport.wait_for_other_tasks(w0, [same, here, ps])
    assert (same.waited, here.waited, ps.waited) == (0, 0, 1)
    transport.wait_for_other_tasks("/device:CPU:1", [ps])   # a local stage: nothing to wait
    assert ps.waited == 1
