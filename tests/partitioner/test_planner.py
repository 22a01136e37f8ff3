"""plan_model end to end: profile a real Keras model, find Max_m and N_m, solve."""

import pytest

from hetpipe_tf import models
from hetpipe_tf.cluster.spec import Cluster
from hetpipe_tf.partitioner.plan import PartitionError
from hetpipe_tf.partitioner.planner import measurable_devices, plan_model
from tests.strategy.helpers import with_device_memory


def test_local_cpu_types_are_measured_and_gpu_types_estimated():
    cluster = Cluster.local(["LOCAL_CPU", "TITAN_V"])
    assert measurable_devices(cluster.devices) == {"LOCAL_CPU": "/device:CPU:0"}
    result = plan_model(models.build_model("mlp", num_classes=10), cluster, 8,
                        optimizer="adam")
    assert dict(result.profile.time_source) == {"LOCAL_CPU": "measured",
                                                "TITAN_V": "estimated"}
    plan = result.plan
    assert plan.num_stages == 2 and plan.optimizer_slots == 2
    assert plan.n_m == min(result.max_m, 2)
    plan.check_matches(["dense_1", "dense_2", "dense_3", "predictions"])


def test_default_n_m_and_n_m_above_max_m():
    cluster = Cluster.local(["LOCAL_CPU", "LOCAL_CPU"])
    model = models.build_model("small_cnn", num_classes=10)
    result = plan_model(model, cluster, 4, measure=False, max_n_m=4)
    assert result.max_m == 4 and result.plan.n_m == 2     # default min(Max_m, k)
    # With 3 MB a device, far fewer than 40 minibatches of activations fit.
    squeezed = with_device_memory(cluster, 3_000_000)
    with pytest.raises(PartitionError, match=r"Max_m=\d+\). Received: n_m=40"):
        plan_model(model, squeezed, 4, n_m=40, profile=result.profile)


@pytest.mark.parametrize("kw,match", [
    ({"n_m": "2"}, r"n_m must be an integer >= 1. Received: n_m='2'; pass n_m=None"),
    ({"n_m": 0}, r"Received: n_m=0"),
    ({"n_m": True}, r"Received: n_m=True"),
    ({"n_m": 2.0}, r"Received: n_m=2.0"),
    ({"max_n_m": 0}, r"max_n_m must be an integer >= 1. Received: max_n_m=0"),
    ({"batch_size": "8"}, r"batch_size must be an integer >= 1. Received: batch_size='8'"),
])
def test_malformed_arguments_are_value_errors_before_profiling(kw, match, monkeypatch):
    import hetpipe_tf.partitioner.planner as planner

    def no_profiling(*args, **kwargs):
        raise AssertionError("profiled a model despite a malformed argument")

    monkeypatch.setattr(planner, "profile_model", no_profiling)
    args = {"batch_size": 8, **kw}
    with pytest.raises(ValueError, match=match):
        plan_model(models.build_model("mlp", num_classes=10), Cluster.local(["LOCAL_CPU"]),
                   args.pop("batch_size"), **args)


def test_numpy_integers_are_accepted_and_the_plan_keeps_python_ints():
    import numpy as np

    from hetpipe_tf.partitioner.plan import Plan
    result = plan_model(models.build_model("mlp", num_classes=10),
                        Cluster.local(["LOCAL_CPU", "LOCAL_CPU"]), np.int64(8),
                        n_m=np.int64(2), measure=False)
    assert type(result.plan.n_m) is int and type(result.plan.batch_size) is int
    assert Plan.from_json(result.plan.to_json()) == result.plan
