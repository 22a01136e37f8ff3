"""The optimizer step the cluster model charges (sim/calibration.py): hand-checked."""

import pytest

from hetpipe_tf.cluster.spec import Cluster, Device, Host
from hetpipe_tf.partitioner.profile import LayerCost, ModelProfile
from hetpipe_tf.sim.allreduce import HorovodConfig, horovod
from hetpipe_tf.sim.calibration import (SGD_UPDATE_TRAFFIC, VERSIONED_UPDATE_TRAFFIC,
                                        plain_update_s, update_seconds, with_update_costs,
                                        without_update_costs)
from hetpipe_tf.sim.hetseq import hetseq
from hetpipe_tf.sim.scenario import single_device_samples_per_s

V_BANDWIDTH = 653e9          # catalog TITAN_V memory bandwidth (bytes/s)
LAUNCH = 10e-6               # catalog GPU launch overhead per layer task
MB = 1_000_000


def profile():
    """Two layers on TITAN_V: 10 ms and 20 ms, 65.3 MB and 0 trainable bytes."""
    layers = (LayerCost(name="a", time_s={"TITAN_V": 0.010}, flops=0, bytes_accessed=0,
                        param_bytes=65_300_000, trainable_param_bytes=65_300_000,
                        activation_bytes=MB),
              LayerCost(name="b", time_s={"TITAN_V": 0.020}, flops=0, bytes_accessed=0,
                        param_bytes=0, trainable_param_bytes=0, activation_bytes=MB))
    return ModelProfile(model_name="two", batch_size=32, layers=layers, cut_bytes=(MB,),
                        time_source={"TITAN_V": "estimated"})


def test_an_update_is_its_bytes_at_half_the_memory_bandwidth_plus_a_launch():
    # 326.5 MB at 653 GB/s x 0.5 (the profile's GPU efficiency) = 1 ms, + 10 us
    assert update_seconds(326_500_000, "TITAN_V") == pytest.approx(1e-3 + LAUNCH)
    assert update_seconds(0, "TITAN_V") == 0.0


def test_hetpipe_update_is_sgd_plus_the_version_copy():
    assert (SGD_UPDATE_TRAFFIC, VERSIONED_UPDATE_TRAFFIC) == (3, 5)
    p = with_update_costs(profile())
    # layer a: 65.3 MB x 5 = 326.5 MB -> 1 ms + launch; layer b has no weights
    assert p.layers[0].update_s["TITAN_V"] == pytest.approx(1e-3 + LAUNCH)
    assert p.layers[1].update_s["TITAN_V"] == 0.0
    assert p.update_optimizer == "sgd"
    assert [l.time_s for l in p.layers] == [l.time_s for l in profile().layers]
    # one GPU's plain SGD step: 3/5 of it (no copy)
    assert plain_update_s(p, "TITAN_V") == pytest.approx(0.6 * (1e-3 + LAUNCH))
    assert without_update_costs(p).layers[0].update_s == {}


def test_a_single_gpu_is_charged_the_plain_step_once_per_minibatch():
    # 32 samples / (10 + 20 ms + 0.6 x 1.01 ms)
    expected = 32 / (0.030 + 0.6 * (1e-3 + LAUNCH))
    assert single_device_samples_per_s(with_update_costs(profile()), "TITAN_V") == \
        pytest.approx(expected, rel=1e-9)
    assert single_device_samples_per_s(profile(), "TITAN_V") == pytest.approx(32 / 0.030)


def test_horovod_adds_the_plain_step_after_the_allreduce():
    host = Host(name="h0", devices=tuple(Device(name=f"h0/gpu{k}", type_name="TITAN_V",
                                                host="h0", tf_device=f"/device:GPU:{k}")
                                         for k in range(2)), intra_bandwidth=15.75e9)
    cluster = Cluster(hosts=(host,), inter_bandwidth=7e9)
    for config in (None, HorovodConfig()):
        base = horovod(profile(), cluster.devices, cluster, config=config)
        with_update = horovod(with_update_costs(profile()), cluster.devices, cluster,
                              config=config)
        assert base.update_s == 0.0
        assert with_update.update_s == pytest.approx(0.6 * (1e-3 + LAUNCH))
        assert with_update.step_s == pytest.approx(base.step_s + with_update.update_s)


def test_hetseq_adds_the_plain_step_after_the_allreduce_as_horovod_does():
    host = Host(name="h0", devices=tuple(Device(name=f"h0/gpu{k}", type_name="TITAN_V",
                                                host="h0", tf_device=f"/device:GPU:{k}")
                                         for k in range(2)), intra_bandwidth=15.75e9)
    cluster = Cluster(hosts=(host,), inter_bandwidth=7e9)
    base = hetseq(profile(), cluster.devices, cluster)
    with_update = hetseq(with_update_costs(profile()), cluster.devices, cluster)
    assert base.update_s == 0.0
    # the plain step (3 of the versioned 5 bytes), not HetPipe's step with the copy
    assert with_update.update_s == pytest.approx(0.6 * (1e-3 + LAUNCH))
    assert with_update.step_s == pytest.approx(base.step_s + with_update.update_s)
    hv = horovod(with_update_costs(profile()), cluster.devices, cluster,
                 config=HorovodConfig())
    assert with_update.update_s == pytest.approx(hv.update_s)
