"""The simulated HetSeq step: shares by speed, the baseline's ring, memory-bound shares."""

import pytest

from hetpipe_tf.cluster.spec import Cluster, Device, Host, paper_cluster
from hetpipe_tf.partitioner.profile import LayerCost, ModelProfile
from hetpipe_tf.sim.allreduce import HorovodConfig, horovod
from hetpipe_tf.sim.hetseq import hetseq

NO_COMM = HorovodConfig(fusion_threshold_bytes=0, cycle_time_s=0.0)


def _profile(times, param_bytes=0, activation_bytes=2**20):
    layer = LayerCost("l0", times, 0, 0, param_bytes=param_bytes,
                      trainable_param_bytes=param_bytes, activation_bytes=activation_bytes)
    return ModelProfile("m", 32, (layer,), (), {t: "estimated" for t in times})


def test_shares_by_speed_beat_equal_minibatches_on_a_slow_device():
    cl = Cluster.local(["LOCAL_CPU"] * 4, emulated_speed_factors=[1, 1, 1, 0.5])
    prof = _profile({"LOCAL_CPU": 0.32})       # 0.01 s a sample at full speed
    hv = horovod(prof, cl.devices, cl, config=NO_COMM)
    hs = hetseq(prof, cl.devices, cl, config=NO_COMM)
    assert hv.step_s == pytest.approx(0.64)    # the 0.5x device's 32 samples
    assert hs.shares.sizes == (37, 37, 36, 18)  # 128 samples: 0.37 / 0.36 s
    assert hs.step_s == pytest.approx(0.37)
    assert hs.samples_per_s == pytest.approx(128 / 0.37)
    assert hs.samples_per_s / hv.samples_per_s == pytest.approx(0.64 / 0.37)
    assert "shares [37, 37, 36, 18]" in hs.line()


def test_a_device_short_of_memory_takes_a_smaller_share_instead_of_none():
    big = Device("h/big", "TITAN_RTX", "h", "/device:GPU:0")            # 24 GiB
    small = Device("h/small", "RTX_2060", "h", "/device:GPU:1")         # 6 GiB
    cl = Cluster((Host("h", (big, small), 15.75e9),), 7e9)
    # 2 GiB of weights (+ 2 gradients) fit the small GPU; 32 samples x 64 MiB do not.
    prof = _profile({"TITAN_RTX": 0.32, "RTX_2060": 0.32}, param_bytes=2 * 2**30,
                    activation_bytes=32 * 64 * 2**20)
    hv = horovod(prof, ["h/big", "h/small"], cl, config=NO_COMM)
    assert hv.excluded == ("h/small",)
    hs = hetseq(prof, ["h/big", "h/small"], cl, config=NO_COMM, global_batch=64)
    cap = hs.shares.speeds[1].max_samples
    assert 0 < cap < 32 and hs.shares.sizes == (64 - cap, cap)
    assert hs.excluded == ()


def test_the_papers_cluster_runs_and_leaves_out_what_does_not_fit():
    cl = paper_cluster()
    prof = _profile({t: 0.1 * i for i, t in enumerate(sorted({d.type_name
                                                             for d in cl.devices}), 1)},
                    param_bytes=2**20)
    hs = hetseq(prof, cl.devices, cl)
    assert sum(hs.shares.sizes) == 32 * len(cl.devices)
    # Shares fall with a type's time: the fastest type gets the largest share.
    fastest = min(range(len(cl.devices)),
                  key=lambda k: prof.layers[0].time_s[cl.devices[k].type_name])
    assert hs.shares.sizes[fastest] == max(hs.shares.sizes)
    assert hs.step_s >= max(hs.share_s) - 1e-12
