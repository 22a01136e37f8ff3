"""The strategy's cluster argument: every form a tf.distribute user would pass."""

import pytest
import tensorflow as tf

from hetpipe_tf.cluster.spec import local_cluster
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
    """N_m at most min(Max_m, k) as for one VW (docs/partitioner.md), not Max_m: with memory
    to spare Max_m is the search limit (32), far beyond what keeps 2 stages busy."""
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
        # min(Max_m, k) = 2 bounds it; within it the time-to-accuracy rule chooses
        # (strategy/defaults.py: N_m = 1 when filling the pipeline buys less time than
        # its staleness costs in epochs).
        from hetpipe_tf.strategy.defaults import epoch_cost, n_m_for_time_to_accuracy
        times = [[s.time_s for s in p.stages] for p in strategy.plans]
        assert strategy.n_m == n_m_for_time_to_accuracy(
            times, 2, epoch_cost(strategy.options.compensation.value)) <= 2
        assert {p.n_m for p in strategy.plans} == {strategy.n_m}


def test_a_model_with_fewer_stages_than_devices_forms_more_virtual_workers(caplog):
    """A 3-layer MLP on 4 devices (a MirroredStrategy user's script): the planner uses every
    device as the fewest VWs of at most 3 stages (2 x 2), says so, and trains."""
    import keras
    import numpy as np
    from hetpipe_tf.cluster.spec import Cluster
    from hetpipe_tf.strategy import HetPipeStrategy
    strategy = HetPipeStrategy(Cluster.local(["LOCAL_CPU"] * 4))
    with strategy.scope():
        model = keras.Sequential([keras.Input((8,)), keras.layers.Dense(16, activation="relu"),
                                  keras.layers.Dense(16, activation="relu"),
                                  keras.layers.Dense(1)])
        model.compile(keras.optimizers.SGD(0.01), "mse")
    x = np.random.RandomState(0).randn(64, 8).astype("float32")
    with strategy, caplog.at_level("WARNING"):
        history = model.fit(x, x[:, :1], batch_size=8, epochs=1, verbose=0)
        assert [p.num_stages for p in strategy.plans] == [2, 2]
    assert "at most 3 stage(s) but the cluster has 4 devices" in caplog.text
    assert np.isfinite(history.history["loss"][0])


def test_a_custom_training_loop_is_refused_at_strategy_run():
    import keras
    from hetpipe_tf.strategy import HetPipeStrategy
    from tests.strategy.helpers import DEVICES, skip_model
    from hetpipe_tf.strategy import even_plan
    strategy = HetPipeStrategy(plan=even_plan(skip_model(0), DEVICES[:2], n_m=1))
    with strategy.scope():
        model = skip_model(0)
        optimizer = keras.optimizers.SGD(0.01)

    def step(x):
        with tf.GradientTape() as tape:
            loss = tf.reduce_mean(model(x) ** 2)
        optimizer.apply_gradients(zip(tape.gradient(loss, model.trainable_variables),
                                      model.trainable_variables))
        return loss

    with pytest.raises(NotImplementedError, match=r"strategy.run\('step'\); train with model.fit"):
        strategy.run(step, args=(tf.ones((4, 8)),))
