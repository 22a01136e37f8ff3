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


# ---------------------------------------------------------------- Horovod's step model
from hetpipe_tf.sim.allreduce import HorovodConfig, fusion_buffers, horovod_step  # noqa: E402


def test_fusion_buffers_follow_horovods_threshold_rule():
    assert fusion_buffers([10, 60, 70, 5, 5], 64) == [10, 60, 70, 10]
    assert fusion_buffers([10, 20, 0, 30], 64) == [60]
    assert fusion_buffers([10, 20], 1) == [10, 20]          # threshold 1: each alone


def test_horovod_step_overlaps_the_backward_pass_cycle_by_cycle():
    # Two equal GPUs, two layers of 0.75 s (0.25 forward + 0.5 backward each): layer 1's
    # gradient is ready at 1.0, layer 0's at 1.5; each 100 B all-reduce over 2 GPUs at
    # 100 B/s takes 2 (1/2) 100 / 100 = 1 s; cycles of 0.25 s.
    cfg = HorovodConfig(fusion_threshold_bytes=1000, cycle_time_s=0.25)
    step, busy = horovod_step([[0.75, 0.75], [0.75, 0.75]], [100, 100], 100.0, cfg)
    assert (step, busy) == (pytest.approx(3.0), pytest.approx(2.0))   # 1.0->2.0, 2.0->3.0
    # Without overlap both wait for the end of backward (1.5) and go as one fused buffer.
    step, _ = horovod_step([[0.75, 0.75]] * 2, [100, 100], 100.0,
                           HorovodConfig(fusion_threshold_bytes=1000, cycle_time_s=0.25,
                                         overlap=False))
    assert step == pytest.approx(3.5)
    # A slower rank delays every tensor to the moment the slowest has it (negotiation):
    # ready = max(1.0, 2.0) and max(1.5, 3.0).
    step, _ = horovod_step([[0.75, 0.75], [1.5, 1.5]], [100, 100], 100.0, cfg)
    assert step == pytest.approx(4.0)
    # One GPU: no all-reduce at all.
    assert horovod_step([[0.75, 0.75]], [100, 100], 100.0, cfg) == (pytest.approx(1.5), 0.0)


def test_horovod_uses_the_configured_links_and_leaves_room_for_the_fusion_buffer():
    a = Device("h0/a", "TITAN_V", "h0", "/task:0/device:GPU:0")
    b = Device("h1/b", "TITAN_V", "h1", "/task:1/device:GPU:0")
    cl = Cluster((Host("h0", (a,), 15.75e9), Host("h1", (b,), 15.75e9)), 1e9)
    layer = LayerCost("l0", {"TITAN_V": 0.3}, 0, 0, param_bytes=10**8,
                      trainable_param_bytes=10**8, activation_bytes=0)
    prof = ModelProfile("m", 32, (layer,), (), {"TITAN_V": "estimated"})
    cfg = HorovodConfig(inter_bandwidth=2e9, cycle_time_s=0.0)
    r = horovod(prof, ["h0/a", "h1/b"], cl, config=cfg)
    assert r.ring_bandwidth == 2e9                           # not the cluster's 1e9
    assert r.step_s == pytest.approx(0.3 + 1e8 / 2e9)      # ready at the end; 2(1/2) S / B
    assert horovod(prof, ["h0/a", "h1/b"], cl, config=None).step_s == pytest.approx(0.4)
    # 2e8 (weights + gradients) fits 0.9 x 270 MB, but not with a 64 MiB fusion buffer too.
    small = [Device(f"h{i}/s", "TITAN_V", f"h{i}", f"/task:{i}/device:GPU:0",
                    memory_bytes=270 * 10**6)
             for i in range(2)]
    cl2 = Cluster(tuple(Host(f"h{i}", (small[i],), 15.75e9) for i in range(2)), 1e9)
    assert horovod(prof, ["h0/s", "h1/s"], cl2).excluded == ("h0/s", "h1/s")
    assert horovod(prof, ["h0/s"], cl2).devices == ("h0/s",)   # alone: no fusion buffer


from hetpipe_tf.sim.allreduce import (HOROVOD_CPU, HOROVOD_README_VGG16,  # noqa: E402
                                      cpu_ring_bandwidth)


def test_cpu_ring_rate_is_what_horovods_cpu_benchmark_implies():
    b = HOROVOD_README_VGG16
    step = 16 * 64 / 618.0                       # 16 GPUs x batch 64 at 618.0 images/s
    compute = 64 / 130.9                         # one GPU alone
    expected = 2 * 15 / 16 * b["gradient_bytes"] / (step - compute)
    assert cpu_ring_bandwidth() == pytest.approx(expected)
    assert cpu_ring_bandwidth() == pytest.approx(0.888e9, rel=1e-3)
    # A run at its own compute speed implies no finite rate.
    with pytest.raises(ValueError, match="longer than its compute"):
        cpu_ring_bandwidth(samples_per_s=16 * 130.9)
    # Round trip: a step model fed the derived rate gives back the measured throughput.
    step_model = compute + ring_allreduce_seconds(b["gradient_bytes"], 16, cpu_ring_bandwidth())
    assert 16 * 64 / step_model == pytest.approx(618.0)


def test_horovod_cpu_is_compute_then_one_rate_inside_and_across_hosts():
    assert not HOROVOD_CPU.overlap
    assert HOROVOD_CPU.intra_bandwidth == HOROVOD_CPU.inter_bandwidth == cpu_ring_bandwidth()
