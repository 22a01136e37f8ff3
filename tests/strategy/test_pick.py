"""The pick by predicted time to accuracy (strategy/pick.py): against a brute-force
reference written here, its ties, refusals and epoch models; and the planner using it on a
cluster model it is given, while without one it keeps the stage-time rule."""

import itertools
import math

import pytest

from hetpipe_tf.strategy.pick import (Candidate, EPOCH_MODELS, EpochModel, epoch_model,
                                      pick_for_time_to_accuracy)


def _reference(cands, local, global_, base, per_epoch):
    """Every candidate's seconds = base x (1 + local (n-1)) x (1 + global log2(1 + D)) x
    per_epoch x its seconds per minibatch; the least, then the smaller N_m, D, position."""
    scored = []
    for i, c in enumerate(cands):
        epochs = (base * (1 + local * (c.n_m - 1))
                  * (1 + global_ * math.log2(1 + c.clock_distance)))
        scored.append((epochs * per_epoch * c.seconds_per_minibatch, c.n_m,
                       c.clock_distance, i))
    return cands[min(scored)[3]]


def test_pick_equals_the_reference_on_a_grid():
    times = {1: 3.0, 2: 1.6, 3: 1.2, 4: 1.0}
    for local, global_ in itertools.product((0.0, 0.1, 0.25, 1.0), (0.0, 0.01, 0.1)):
        for d_speedup in (1.0, 0.8, 0.5):
            cands = [Candidate(n, d, times[n] * (d_speedup if d else 1.0), label)
                     for label in ("NP", "ED") for n in times for d in (0, 4, 32)]
            model = EpochModel(local, global_, base_epochs=3.0)
            got = pick_for_time_to_accuracy(cands, model, 100)
            assert got.best.candidate == _reference(cands, local, global_, 3.0, 100)
            assert len(got.predictions) == len(cands)
            for p in got.predictions:
                assert p.seconds == pytest.approx(
                    model.epochs(p.candidate.n_m, p.candidate.clock_distance) * 100
                    * p.candidate.seconds_per_minibatch)


def test_staleness_cost_decides_between_throughput_and_epochs():
    cands = [Candidate(1, 0, 2.0), Candidate(2, 0, 1.0)]
    assert pick_for_time_to_accuracy(cands, EpochModel(0.0, 0.0)).best.candidate.n_m == 2
    assert pick_for_time_to_accuracy(cands, EpochModel(0.5, 0.0)).best.candidate.n_m == 2
    assert pick_for_time_to_accuracy(cands, EpochModel(1.5, 0.0)).best.candidate.n_m == 1
    # A tie goes to less staleness: the smaller N_m, then the smaller D.
    assert pick_for_time_to_accuracy(cands, EpochModel(1.0, 0.0)).best.candidate.n_m == 1
    tie = [Candidate(1, 4, 1.0, "a"), Candidate(1, 0, 1.0, "b")]
    assert pick_for_time_to_accuracy(tie, EpochModel(0.0, 0.0)).best.candidate.label == "b"
    rows = pick_for_time_to_accuracy(tie, EpochModel(0.0, 0.0)).rows()
    assert rows[0][0] == "candidate" and [r[-1] for r in rows[1:]] == ["", "picked"]


def test_bad_values_are_refused():
    with pytest.raises(ValueError, match="candidates=\\[\\]"):
        pick_for_time_to_accuracy([], EpochModel(0.0, 0.0))
    with pytest.raises(ValueError, match="seconds_per_minibatch"):
        Candidate(1, 0, 0.0)
    with pytest.raises(ValueError, match="seconds_per_minibatch"):
        Candidate(1, 0, float("inf"))
    with pytest.raises(ValueError, match="n_m"):
        Candidate(0, 0, 1.0)
    with pytest.raises(ValueError, match="local"):
        EpochModel(-0.1, 0.0)


def test_epoch_models_by_compensation():
    assert epoch_model(None) == epoch_model("none") == EPOCH_MODELS["none"]
    assert epoch_model("both") == epoch_model("all") == EPOCH_MODELS["compensated"]
    assert epoch_model("predict") == EPOCH_MODELS["none"]   # as defaults.epoch_cost
    # Measured (docs/time_to_accuracy.md "The defaults"): compensation makes local
    # staleness cheaper.
    assert EPOCH_MODELS["compensated"].local < EPOCH_MODELS["none"].local
    assert EpochModel(0.2, 0.1).with_base(3.0).epochs(4, 3) == pytest.approx(
        3.0 * 1.6 * 1.2)


def _simulated_calls(monkeypatch) -> list:
    """The candidates of each call of strategy/planning.py's `simulated_candidates`, one
    list per call, in order."""
    from hetpipe_tf.strategy import planning
    calls, real = [], planning.simulated_candidates

    def spy(*args, **kwargs):
        calls.append(real(*args, **kwargs))
        return calls[-1]

    monkeypatch.setattr(planning, "simulated_candidates", spy)
    return calls



def test_the_planner_picks_in_the_cluster_model_it_is_given(monkeypatch):
    """With a cluster model (the strategy's clock=VirtualClock(cluster)) the planner
    simulates each N_m at the strategy's D and picks; without one it keeps the stage-time
    rule and simulates nothing; a user's n_m is kept."""
    import keras

    from hetpipe_tf.cluster.spec import Cluster
    from hetpipe_tf.sim import VirtualClock
    from hetpipe_tf.strategy import planning, pick
    from tests.strategy.helpers import skip_model

    gpus = Cluster.local(["TITAN_V", "RTX_2060"])
    seen = _simulated_calls(monkeypatch)
    model = skip_model(0)
    model.compile(keras.optimizers.SGD(0.05), "mse")
    (plan,) = planning.plan_with_partitioner(model, 8, gpus, None, None, compensation="none")
    assert seen == []
    for d in (0, 3):
        (plan,) = planning.plan_with_partitioner(model, 8, gpus, None, None,
                                                 compensation="both", clock_distance=d,
                                                 cluster_model=VirtualClock(gpus))
        cands = seen[-1]
        assert [c.n_m for c in cands] == list(range(1, len(cands) + 1))
        assert {c.clock_distance for c in cands} == {d}
        best = pick.pick_for_time_to_accuracy(cands, epoch_model("both")).best.candidate
        assert plan.n_m == best.n_m
    (plan,) = planning.plan_with_partitioner(model, 8, gpus, 1, None, compensation="both",
                                             cluster_model=VirtualClock(gpus))
    assert plan.n_m == 1 and len(seen) == 2


def test_a_strategy_with_a_virtual_clock_and_no_n_m_trains_at_the_pick(monkeypatch):
    """HetPipeStrategy(cluster, allocation=..., clock=VirtualClock(cluster)) with no n_m:
    the planner's N_m is the pick in that cluster model at the strategy's D, and the
    virtual clock trains at it."""
    import keras

    from hetpipe_tf.cluster.spec import Cluster
    from hetpipe_tf.sim import VirtualClock
    from hetpipe_tf.strategy import HetPipeStrategy
    from tests.strategy.helpers import regression_data, skip_model

    seen = _simulated_calls(monkeypatch)
    cluster = Cluster.local(["TITAN_V", "RTX_2060"] * 2, hosts=2)
    strategy = HetPipeStrategy(cluster, allocation="NP", clock_distance=2,
                               clock=VirtualClock(cluster))
    with strategy.scope():
        model = skip_model(0)
        model.compile(keras.optimizers.SGD(0.05), "mse")
    x, y = regression_data(32, 0)
    with strategy:
        history = model.fit(x, y, batch_size=8, epochs=1, verbose=0)
    (cands,) = seen
    assert {c.clock_distance for c in cands} == {2} and strategy.num_virtual_workers == 2
    best = pick_for_time_to_accuracy(cands, epoch_model("both")).best.candidate
    assert strategy.n_m == best.n_m and {p.n_m for p in strategy.plans} == {best.n_m}
    assert history.history["virtual_time_s"][-1] > 0


def test_a_strategy_given_nothing_trains_at_the_joint_pick_of_its_cluster_model(
        monkeypatch, capsys):
    """HetPipeStrategy(cluster, clock=VirtualClock(cluster)) with no n_m, D or allocation:
    the planner simulates every admitted allocation x N_m x D in {0, 4, 32}, and the
    strategy trains at the candidate of least predicted time (the reference of this file),
    its D read by the runtime as the strategy's clock distance, each pick named in the
    summary printed at the first fit. A small CNN on two hosts of two TITAN V and two
    Quadro P4000: its parameter traffic makes the WSP waits matter, and the pick is not
    the defaults of a strategy without a cluster model (D = 0, no allocation)."""
    import keras
    import numpy as np

    from hetpipe_tf import models
    from hetpipe_tf.cluster.spec import Cluster
    from hetpipe_tf.sim import VirtualClock
    from hetpipe_tf.strategy import HetPipeStrategy

    calls = _simulated_calls(monkeypatch)
    cluster = Cluster.local(["TITAN_V", "TITAN_V", "QUADRO_P4000", "QUADRO_P4000"], hosts=2)
    strategy = HetPipeStrategy(cluster, clock=VirtualClock(cluster))
    with strategy.scope():
        model = models.build_model("small_cnn", input_size=32, num_classes=10)
        model.compile(keras.optimizers.Adam(1e-3), "sparse_categorical_crossentropy")
    rs = np.random.RandomState(0)
    x = rs.rand(32, 32, 32, 3).astype("float32")
    y = rs.randint(0, 10, 32)
    with strategy:
        history = model.fit(x, y, batch_size=8, epochs=1, verbose=2)
    printed = capsys.readouterr().out
    seen = [c for cands in calls for c in cands]
    assert {c.clock_distance for c in seen} == {0, 4, 32}
    assert {c.label for c in seen} == {"NP", "ED"}   # HD forms ED's VWs here: once
    m = EPOCH_MODELS["compensated"]
    best = _reference(seen, m.local, m.global_, 1.0, 1.0)
    assert best.clock_distance > 0   # this cluster model makes a larger D faster
    assert strategy.extended.clock_distance == best.clock_distance
    assert strategy.n_m == best.n_m and {p.n_m for p in strategy.plans} == {best.n_m}
    picked = strategy.extended.layout().picked
    assert picked.allocation.name == best.label and picked.clock_distance == best.clock_distance
    assert strategy.options.wsp.clock_distance == 0   # the options are not written to
    assert f"  allocation: {best.label} (picked with N_m" in printed
    assert f"  D = {best.clock_distance} (clock distance between the 2 VWs; picked" in printed
    assert np.isfinite(history.history["loss"][-1])
    assert history.history["virtual_time_s"][-1] > 0
