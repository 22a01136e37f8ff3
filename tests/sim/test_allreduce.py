"""The Horovod-style data-parallel baseline."""

import pytest

from hetpipe_tf.cluster.spec import Cluster, Device, Host, paper_cluster
from hetpipe_tf.partitioner.profile import LayerCost, ModelProfile
from hetpipe_tf.sim.allreduce import data_parallel, horovod, ring_allreduce_seconds


def test_ring_allreduce_formula():
    assert ring_allreduce_seconds(1000, 1, 10.0) == 0
    assert ring_allreduce_seconds(1000, 4, 10.0) == pytest.approx(2 * 3 / 4 * 100)


def test_step_is_slowest_compute_plus_allreduce_over_slowest_link():
    cl = paper_cluster()
    r = data_parallel([0.1, 0.3], ["host0", "host1"], int(7e9), cl, 32)
    assert r.allreduce_s == pytest.approx(1.0)  # 2 (1/2) 7e9 B / 7e9 B/s
    assert r.step_s == pytest.approx(1.3)
    assert r.samples_per_s == pytest.approx(64 / 1.3)
    one_host = data_parallel([0.1, 0.1], ["host0", "host0"], int(7e9), cl, 32)
    assert one_host.allreduce_s == pytest.approx(7e9 / (15.75e9 * 0.7))
    assert one_host.bytes_inter_host == 0


def test_horovod_leaves_out_devices_the_model_does_not_fit():
    big = Device("h/big", "TITAN_RTX", "h", "/device:GPU:0")            # 24 GiB
    small = Device("h/small", "RTX_2060", "h", "/device:GPU:1")         # 6 GiB
    cl = Cluster((Host("h", (big, small), 15.75e9),), 7e9)
    layer = LayerCost("l0", {"TITAN_RTX": 0.05, "RTX_2060": 0.1}, 0, 0,
                      param_bytes=3 * 2**30, trainable_param_bytes=3 * 2**30,
                      activation_bytes=2**20)
    prof = ModelProfile("m", 32, (layer,), (), {"TITAN_RTX": "estimated", "RTX_2060": "estimated"})
    r = horovod(prof, ["h/big", "h/small"], cl)  # 3 GiB x (weights + grads) + ... > 6 x 0.9
    assert r.devices == ("h/big",) and r.excluded == ("h/small",)
    assert r.step_s == pytest.approx(0.05)
