"""What the strategy prints at a model's first fit (strategy/summary.py), and that a train
step shows Keras no value that was not computed (strategy/guards.py StepLogs)."""

from __future__ import annotations

import keras
import numpy as np

from hetpipe_tf.cluster.spec import Cluster
from hetpipe_tf.strategy import HetPipeStrategy, StageSpec, even_plan, manual_plan
from hetpipe_tf.strategy.guards import StepLogs
from hetpipe_tf.strategy.layout import Layout, Picked
from hetpipe_tf.strategy.modes import (HetSeq, OneVirtualWorker, SynchronousPipeline,
                                       VirtualWorkers)
from hetpipe_tf.strategy.options import StrategyOptions
from hetpipe_tf.strategy.summary import describe

from tests.strategy.helpers import DEVICES, regression_data, skip_model

HEAD = "HetPipeStrategy for 'skipnet': "


def test_one_virtual_worker_with_hand_made_plan():
    plan = even_plan(skip_model(0), DEVICES[:2], n_m=2)
    options = StrategyOptions.parse(plan=plan)
    text = describe(options, Layout((plan,), 2), OneVirtualWorker, None,
                    model_name="skipnet", executor="PipelineRuntime")
    assert text == "\n".join([
        HEAD + "OneVirtualWorker (one pipelined virtual worker; PipelineRuntime)",
        "  cluster: none given (the devices are the plans')",
        "  VW 0: 2 stages",
        f"    stage 0: d1..d3 (3 layers) on {DEVICES[0]}",
        f"    stage 1: add..out (2 layers) on {DEVICES[1]}",
        "  N_m = 2 (the plan's)",
        "  schedule: HetPipe, N_m minibatches in flight per VW, one update per minibatch",
        "  compensation: BOTH (the default where weights can be stale), implied staleness 1; "
        "compensation=\"none\" trains by the paper's rules exactly (docs/convergence.md)",
    ])


def _cluster_plans(cluster, n_m):
    """Two VWs of two stages each on `cluster`'s devices, named as the planner names them."""
    d = cluster.devices
    return tuple(
        manual_plan(skip_model(0), [
            StageSpec(d[2 * w].tf_device, 3, d[2 * w].emulated_speed_factor, d[2 * w].name),
            StageSpec(d[2 * w + 1].tf_device, 2, d[2 * w + 1].emulated_speed_factor,
                      d[2 * w + 1].name)], n_m=n_m)
        for w in range(2))


def test_two_virtual_workers_planned_on_an_emulated_cluster():
    cluster = Cluster.local(["LOCAL_CPU", "LOCAL_CPU", "LOCAL_CPU", "TITAN_V"], hosts=2,
                            emulated_speed_factors=[1, 1, 1, 0.5])
    options = StrategyOptions.parse(cluster, clock_distance=1, compensation="none")
    text = describe(options, Layout(_cluster_plans(cluster, 2), 2, 1), VirtualWorkers(options),
                    cluster, model_name="skipnet", executor="Coordinator")
    assert text == "\n".join([
        HEAD + "VirtualWorkers (virtual workers under WSP through parameter servers; "
        "Coordinator)",
        "  cluster: 2 hosts, 4 devices",
        "    host0: host0/cpu0 (LOCAL_CPU on /device:CPU:0), host0/cpu1 (LOCAL_CPU on "
        "/device:CPU:1)",
        "    host1: host1/cpu0 (LOCAL_CPU on /device:CPU:2), host1/gpu0 (TITAN_V on "
        "/device:CPU:3, EMULATED at 0.5x speed)",
        "  VW 0: 2 stages",
        "    stage 0: d1..d3 (3 layers) on host0/cpu0 (on /device:CPU:0)",
        "    stage 1: add..out (2 layers) on host0/cpu1 (on /device:CPU:1)",
        "  VW 1: 2 stages",
        "    stage 0: d1..d3 (3 layers) on host1/cpu0 (on /device:CPU:2)",
        "    stage 1: add..out (2 layers) on host1/gpu0 (on /device:CPU:3, EMULATED at 0.5x "
        "speed)",
        "  N_m = 2 (chosen by the planner: at most min(Max_m, stages of a VW), lowered where "
        "local staleness costs more epochs than the fuller pipeline saves time; pass n_m= "
        "to choose)",
        "  D = 1 (clock distance between the 2 VWs), parameters placed default",
        "  schedule: HetPipe, N_m minibatches in flight per VW, one update per minibatch",
        "  compensation: NONE",
    ])


def test_the_n_m_of_a_cluster_model_is_named_as_the_pick():
    from hetpipe_tf.sim import VirtualClock

    cluster = Cluster.local(["LOCAL_CPU", "LOCAL_CPU", "LOCAL_CPU", "TITAN_V"], hosts=2,
                            emulated_speed_factors=[1, 1, 1, 0.5])
    options = StrategyOptions.parse(cluster, clock_distance=1, compensation="none",
                                    clock=VirtualClock(cluster))
    text = describe(options, Layout(_cluster_plans(cluster, 2), 2, 1), VirtualWorkers(options),
                    cluster, model_name="skipnet", executor="Coordinator")
    assert ("  N_m = 2 (picked by predicted time to accuracy in the cluster model: its "
            "simulated time per minibatch x the epochs local staleness costs "
            "(strategy/pick.py), jointly with what else was not given; pass n_m= to "
            "choose)") in text.splitlines()
    # D was given: its line says nothing of a pick, and no allocation line is printed.
    assert "  D = 1 (clock distance between the 2 VWs), parameters placed default" in text
    assert "allocation" not in text


def test_gpipe():
    plan = even_plan(skip_model(0), DEVICES[:2], n_m=1)
    options = StrategyOptions.parse(plan=plan, schedule="gpipe", micro_batches=4,
                                    rematerialize=True)
    text = describe(options, Layout((plan,), 1), SynchronousPipeline, None)
    assert text == "\n".join([
        "HetPipeStrategy: SynchronousPipeline (one virtual worker, one update per minibatch)",
        "  cluster: none given (the devices are the plans')",
        "  VW 0: 2 stages",
        f"    stage 0: d1..d3 (3 layers) on {DEVICES[0]}",
        f"    stage 1: add..out (2 layers) on {DEVICES[1]}",
        "  N_m = 1 (one minibatch at a time: synchronous schedule)",
        "  schedule: GPipe, 4 micro-batches per minibatch, one update per minibatch, "
        "re-materialized",
        "  compensation: BOTH (the default where weights can be stale), inactive: nothing is "
        "stale here",
    ])


def test_hetseq():
    cluster = Cluster.local(["LOCAL_CPU"] * 2)
    options = StrategyOptions.parse(cluster, data_parallel="hetseq", shares=[5, 3])
    text = describe(options, Layout((), 1), HetSeq, cluster, model_name="skipnet",
                    executor="HetSeqExecutor", shares=(5, 3))
    assert text == "\n".join([
        HEAD + "HetSeq (every device trains the whole model on its share of each batch; "
        "HetSeqExecutor)",
        "  cluster: 1 host, 2 devices",
        "    host0: host0/cpu0 (LOCAL_CPU on /device:CPU:0), host0/cpu1 (LOCAL_CPU on "
        "/device:CPU:1)",
        "  every device: the whole model, shares [5, 3] of each batch",
        "  N_m = 1 (one minibatch at a time: HetSeq mode)",
        "  schedule: HetSeq, one synchronous update per batch",
        "  compensation: NONE (the default in HetSeq mode)",
    ])


# --- printed at the first fit, through Keras' output ---------------------------------------
def _compiled(strategy):
    with strategy.scope():
        model = skip_model(0)
        model.compile(keras.optimizers.SGD(0.05), "mse", metrics=["mae"])
    return model


def test_printed_once_at_the_first_fit_and_not_with_verbose_0(capsys):
    x, y = regression_data(32)
    strategy = HetPipeStrategy(plan=even_plan(skip_model(0), DEVICES[:1], n_m=1))
    model = _compiled(strategy)
    model.fit(x, y, batch_size=8, epochs=1, verbose=1)
    model.fit(x, y, batch_size=8, epochs=1, verbose=1)
    out = capsys.readouterr().out
    assert out.count("HetPipeStrategy for 'skipnet': OneVirtualWorker") == 1, out
    assert "  N_m = 1 (the plan's)" in out
    strategy.close()

    quiet = HetPipeStrategy(plan=even_plan(skip_model(0), DEVICES[:1], n_m=1))
    model = _compiled(quiet)
    model.fit(x, y, batch_size=8, epochs=1, verbose=0)
    assert "HetPipeStrategy" not in capsys.readouterr().out
    quiet.close()


# --- a pipelined step shows no value before a minibatch completed -------------------------
class _Executor:
    def __init__(self):
        self.logs = None


def test_step_logs_rule():
    executor, out = _Executor(), {"loss": 0.0, "mae": 0.0}   # the step's own read: zeros
    step = StepLogs()
    step.reset(None)                                  # the first epoch, before the build
    first = step.shown(executor, out)
    assert first == {}
    executor.logs = {"loss": 0.5, "mae": 0.25}        # a minibatch completed
    assert step.shown(executor, out) == {"loss": 0.5, "mae": 0.25}
    step.fill({"loss": 9.0})
    assert first == {}                                # only the LAST step's empty logs fill
    step.reset(executor)                              # the next epoch: those are stale
    last = step.shown(executor, out)
    assert last == {}
    step.fill({"loss": 0.4, "mae": 0.2})              # Keras reads the drained metrics
    assert last == {"loss": 0.4, "mae": 0.2}
    executor.logs = {"loss": 0.3, "mae": 0.1}
    assert step.shown(executor, out) == {"loss": 0.3, "mae": 0.1}


def _slow_pipeline():
    """2 stages at N_m = 2, the last EMULATED at 0.25x: a step returns long before its
    minibatch completes."""
    plan = manual_plan(skip_model(0), [StageSpec(DEVICES[0], 3),
                                       StageSpec(DEVICES[1], 2, 0.25)], n_m=2)
    return HetPipeStrategy(plan=plan, compensation="none")


class _Seen(keras.callbacks.Callback):
    """The logs every step handed the callbacks."""

    def __init__(self):
        super().__init__()
        self.steps = []

    def on_train_batch_end(self, batch, logs=None):
        self.steps.append(dict(logs or {}))


def test_logs_of_computed_minibatches_only(capsys):
    x, y = regression_data(48)
    strategy = _slow_pipeline()
    model = _compiled(strategy)
    seen = _Seen()
    history = model.fit(x, y, batch_size=8, epochs=2, shuffle=False, verbose=1,
                        callbacks=[seen])
    assert len(seen.steps) == 12
    assert all(set(logs) in (set(), {"loss", "mae"}) for logs in seen.steps)
    assert all(logs["loss"] > 0 for logs in seen.steps if logs)   # never zeros
    # Each epoch opens with no values (its first minibatch is in flight), not the previous
    # epoch's last ones, and shows computed ones later.
    assert seen.steps[0] == {} and seen.steps[6] == {}, seen.steps
    assert all(logs.get("loss") != history.history["loss"][0] for logs in seen.steps[6:])
    assert any(seen.steps[:6]) and any(seen.steps[6:])
    # The progress bar: no zeros, and the first line has no loss.
    out = capsys.readouterr().out
    assert "0.0000e+00" not in out, out
    progress = [line for line in out.replace("\r", "\n").replace("\b", "").split("\n")
                if "/6" in line and "step" in line]
    assert progress and "loss" not in progress[0], progress
    # The epochs' values are the drained metrics, as without the step logs.
    assert set(history.history) == {"loss", "mae"} and len(history.history["loss"]) == 2
    final = model.get_metrics_result()
    np.testing.assert_allclose(history.history["loss"][-1], float(final["loss"]))
    np.testing.assert_allclose(history.history["mae"][-1], float(final["mae"]))
    strategy.close()


class _EvaluateAt(keras.callbacks.Callback):
    def __init__(self, x, y):
        super().__init__()
        self.x, self.y = x, y

    def on_train_batch_end(self, batch, logs=None):
        self.model.evaluate(self.x, self.y, batch_size=8, verbose=0)


def test_an_epoch_whose_last_step_showed_nothing_keeps_its_history():
    x, y = regression_data(8)   # one step per epoch: it returns with its minibatch in flight
    strategy = _slow_pipeline()
    model = _compiled(strategy)
    seen = _Seen()
    history = model.fit(x, y, batch_size=8, epochs=2, shuffle=False, verbose=0,
                        callbacks=[seen])
    assert seen.steps[0] == {}
    assert set(history.history) == {"loss", "mae"} and len(history.history["loss"]) == 2
    assert all(v > 0 for v in history.history["loss"])
    # An evaluate from a batch callback resets the metrics between the last step and the
    # epoch's end.
    history = model.fit(x, y, batch_size=8, epochs=1, shuffle=False, verbose=0,
                        callbacks=[_EvaluateAt(x, y)])
    assert set(history.history) == {"loss", "mae"} and history.history["loss"][0] > 0
    strategy.close()


def test_the_summary_names_d_and_the_allocation_the_planner_picked():
    from hetpipe_tf.cluster.allocation import AllocationPolicy
    from hetpipe_tf.sim import VirtualClock

    cluster = Cluster.local(["LOCAL_CPU", "LOCAL_CPU", "LOCAL_CPU", "TITAN_V"], hosts=2,
                            emulated_speed_factors=[1, 1, 1, 0.5])
    plans = _cluster_plans(cluster, 2)
    options = StrategyOptions.parse(cluster, compensation="none", clock=VirtualClock(cluster))
    before = describe(options, Layout(plans, 2), VirtualWorkers(options), cluster).splitlines()
    # Nothing picked yet (or no VWs formed by the pick): today's lines.
    assert "  D = 0 (clock distance between the 2 VWs), parameters placed default" in before
    assert not any("allocation" in line for line in before)
    made = Layout(plans, 2, 4, Picked(4, AllocationPolicy.HD))
    lines = describe(options, made, VirtualWorkers(options), cluster).splitlines()
    picked = "picked with N_m by predicted time to accuracy in the cluster model (strategy/pick.py)"
    assert (f"  allocation: HD ({picked} over NP, ED, HD where the cluster admits several "
            "VWs; pass allocation= to choose)") in lines
    assert (f"  D = 4 (clock distance between the 2 VWs; {picked} over D = 0, 4, 32; pass "
            "clock_distance= to choose), parameters placed default") in lines
    # A given D is named as given (the allocation alone picked).
    given = StrategyOptions.parse(cluster, clock_distance=2, compensation="none",
                                  clock=VirtualClock(cluster))
    assert "  D = 2 (clock distance between the 2 VWs), parameters placed default" in describe(
        given, Layout(plans, 2, 2, Picked(None, AllocationPolicy.HD)), VirtualWorkers(given),
        cluster).splitlines()
