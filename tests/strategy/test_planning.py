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


# --- the joint pick of N_m, D and the allocation under a cluster model --------------------
class _Result:
    def __init__(self, s):
        self.minibatches_per_s = 1.0 / s


class _FakeClusterModel:
    """A cluster model whose time per minibatch the test sets: `mixed_s` when every VW
    holds both device types, else `split_s`, times `by_d[D]`; `calls` records (VW device
    groups, N_m, D) of every simulation."""

    def __init__(self, mixed_s=1.0, split_s=2.0, by_d=None):
        self.mixed_s, self.split_s = mixed_s, split_s
        self.by_d = by_d or {0: 1.0, 4: 0.9, 32: 0.5}
        self.calls = []

    def schedule(self, *args):   # what makes it a clock for StrategyOptions
        raise AssertionError("not trained in these tests")

    def simulate(self, plans, n_m, d, param_bytes, num_waves):
        groups = [sorted(s.device for s in p.stages) for p in plans]
        self.calls.append((groups, n_m, d))
        mixed = all(len({s.device_type for s in p.stages}) == 2 for p in plans)
        return _Result((self.mixed_s if mixed else self.split_s) * self.by_d[d])


def _two_types_on_two_hosts():
    """host0: two TITAN V, host1: two RTX 2060: NP gives VWs of one type each, ED one of
    each type per VW (and HD the same groups as ED, counted once)."""
    from hetpipe_tf.cluster.spec import Cluster
    return Cluster.local(["TITAN_V", "TITAN_V", "RTX_2060", "RTX_2060"], hosts=2)


def _compiled():
    import keras
    from tests.strategy.helpers import skip_model
    model = skip_model(0)
    model.compile(keras.optimizers.SGD(0.05), "mse")
    return model


def _spy(monkeypatch) -> list:
    """Every candidate strategy/planning.py simulates, in order."""
    from hetpipe_tf.strategy import planning
    seen, real = [], planning.simulated_candidates

    def spy(*args, **kwargs):
        out = real(*args, **kwargs)
        seen.extend(out)
        return out

    monkeypatch.setattr(planning, "simulated_candidates", spy)
    return seen


def _reference(cands, model):
    """The least epochs(N_m, D) x s per minibatch, then the smaller N_m, D, position:
    written out here, not through strategy/pick.py's function."""
    import math
    scored = [(model.base_epochs * (1 + model.local * (c.n_m - 1))
               * (1 + model.global_ * math.log2(1 + c.clock_distance))
               * c.seconds_per_minibatch, c.n_m, c.clock_distance, i)
              for i, c in enumerate(cands)]
    return cands[min(scored)[3]]


def test_with_nothing_given_the_planner_picks_n_m_d_and_allocation_jointly(monkeypatch):
    from hetpipe_tf.cluster.allocation import AllocationPolicy
    from hetpipe_tf.strategy import planning
    from hetpipe_tf.strategy.options import StrategyOptions
    from hetpipe_tf.strategy.pick import EPOCH_MODELS

    seen = _spy(monkeypatch)
    clock = _FakeClusterModel()
    cluster = _two_types_on_two_hosts()
    options = StrategyOptions.parse(cluster, clock=clock)
    assert not options.wsp.distance_given and not options.layout.allocation_given
    plans, picked = planning.plan_layout(options, _compiled(), 8)
    # Every admitted allocation (NP; ED; HD = ED's groups, once) x N_m 1..2 x D 0, 4, 32.
    assert sorted({c.label for c in seen}) == ["ED", "NP"]
    assert {(c.n_m, c.clock_distance) for c in seen} == {
        (n, d) for n in (1, 2) for d in planning.PICK_DISTANCES}
    assert len(seen) == 2 * 2 * 3
    best = _reference(seen, EPOCH_MODELS["compensated"])
    # Mixed VWs (ED) and D = 32 are fastest in this model; epochs do not grow with D under
    # the default compensation's model, so the pick is ED, D = 32, N_m = 1 (a tie in time
    # goes to less staleness).
    assert (best.label, best.clock_distance, best.n_m) == ("ED", 32, 1)
    assert picked.clock_distance == 32 and picked.allocation is AllocationPolicy.ED
    assert options.wsp.clock_distance == 0   # the options are not written to
    assert {p.n_m for p in plans} == {1}
    assert all({cluster.device(s.device).type_name for s in p.stages}
               == {"TITAN_V", "RTX_2060"} for p in plans)
    # Each model is picked for on its own: a second model's pick simulates every D again.
    seen.clear()
    planning.plan_layout(options, _compiled(), 8)
    assert {c.clock_distance for c in seen} == set(planning.PICK_DISTANCES)


def test_given_values_are_kept_and_only_the_rest_is_picked(monkeypatch):
    from hetpipe_tf.strategy import planning
    from hetpipe_tf.strategy.options import StrategyOptions

    seen = _spy(monkeypatch)
    cluster = _two_types_on_two_hosts()
    # D = 0 given: only D = 0 is simulated although D = 32 is faster in this model.
    given_d = StrategyOptions.parse(cluster, clock_distance=0, clock=_FakeClusterModel())
    plans, picked = planning.plan_layout(given_d, _compiled(), 8)
    assert {c.clock_distance for c in seen} == {0} and {c.label for c in seen} == {"NP", "ED"}
    assert given_d.wsp.clock_distance == 0 and picked.clock_distance is None
    assert picked.allocation.name == "ED"
    # NP given: kept although ED is faster in this model; D still picked.
    seen.clear()
    given_alloc = StrategyOptions.parse(cluster, allocation="NP", clock=_FakeClusterModel())
    plans, picked = planning.plan_layout(given_alloc, _compiled(), 8)
    assert {c.label for c in seen} == {"NP"}
    assert [sorted(s.device for s in p.stages) for p in plans] == [
        ["host0/gpu0", "host0/gpu1"], ["host1/gpu0", "host1/gpu1"]]
    assert picked.clock_distance == 32
    assert picked.allocation is None   # given, not picked
    # n_m given: the only N_m simulated.
    seen.clear()
    given_n = StrategyOptions.parse(cluster, n_m=2, clock=_FakeClusterModel())
    plans, _ = planning.plan_layout(given_n, _compiled(), 8)
    assert {c.n_m for c in seen} == {2} and {p.n_m for p in plans} == {2}


def test_without_a_cluster_model_nothing_is_simulated_and_d_stays_zero(monkeypatch):
    from hetpipe_tf.strategy import planning
    from hetpipe_tf.strategy.options import StrategyOptions

    monkeypatch.setattr(planning, "simulated_candidates",
                        lambda *a, **k: (_ for _ in ()).throw(AssertionError("simulated")))
    options = StrategyOptions.parse(_two_types_on_two_hosts())
    (plan,), picked = planning.plan_layout(options, _compiled(), 8)   # one VW of every device
    assert plan.num_stages == 4
    assert options.wsp.clock_distance == 0 and picked is None
    assert options.layout.allocation is None
