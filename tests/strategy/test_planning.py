"""The strategy's cluster argument: every form a tf.distribute user would pass."""

import pytest
import tensorflow as tf

from hetpipe_tf.cluster.local import local_cluster
from hetpipe_tf.strategy.planning import resolve_cluster


def test_cluster_and_its_dict():
    cluster = local_cluster(["LOCAL_CPU", "LOCAL_CPU"])
    assert resolve_cluster(cluster) is cluster
    assert resolve_cluster(cluster.to_dict()) == cluster


def test_tf_cluster_spec_resolver_and_job_dict():
    jobs = {"worker": ["127.0.0.1:1111", "127.0.0.1:1112"], "ps": ["127.0.0.1:1113"]}
    from_spec = resolve_cluster(tf.train.ClusterSpec(jobs))
    assert [d.tf_device for d in from_spec.devices] == [
        "/job:worker/replica:0/task:0/device:CPU:0", "/job:worker/replica:0/task:1/device:CPU:0"]
    resolver = tf.distribute.cluster_resolver.SimpleClusterResolver(tf.train.ClusterSpec(jobs))
    assert resolve_cluster(resolver) == from_spec == resolve_cluster(jobs)


def test_tf_config_and_bad_values(monkeypatch):
    monkeypatch.setenv("TF_CONFIG", '{"cluster": {"worker": ["127.0.0.1:2222"]}}')
    assert [d.name for d in resolve_cluster(None).devices] == ["worker0/cpu0"]
    with pytest.raises(ValueError, match="Received: cluster=42"):
        resolve_cluster(42)


def test_allocation_plans_use_the_default_n_m_of_one_virtual_worker():
    """N_m = min(Max_m, k) as for one VW (docs/partitioner.md), not Max_m: with memory to
    spare Max_m is the search limit (32), far beyond what keeps 2 stages busy."""
    import keras
    from hetpipe_tf.cluster.spec import Cluster
    from hetpipe_tf.strategy import HetPipeStrategy
    from tests.strategy.helpers import regression_data, skip_model
    strategy = HetPipeStrategy(Cluster.local(["LOCAL_CPU"] * 4, hosts=2), allocation="ED",
                               clock_distance=1)
    with strategy.scope():
        model = skip_model(0)
        model.compile(keras.optimizers.SGD(0.05), "mse")
    x, y = regression_data(32, 0)
    with strategy:
        model.fit(x, y, batch_size=8, epochs=1, verbose=0)
        assert strategy.num_virtual_workers == 2
        assert [p.num_stages for p in strategy.plans] == [2, 2]
        assert strategy.n_m == 2 and {p.n_m for p in strategy.plans} == {2}
