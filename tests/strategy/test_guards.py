"""strategy/guards.py's StepLogs: what a threaded executor's train step shows Keras."""

from hetpipe_tf.strategy.guards import StepLogs


class _Executor:
    """What StepLogs reads of an executor: the logs of its latest completed minibatch."""

    def __init__(self):
        self.logs = None


def test_no_values_before_a_minibatch_completed_then_its_logs():
    executor, logs = _Executor(), StepLogs()
    logs.reset(executor)
    assert logs.shown(executor, {"loss": 0.0}) == {}
    executor.logs = {"loss": 2.5, "accuracy": 0.5}
    assert logs.shown(executor, {"loss": 0.0}) == {"loss": 2.5}


def test_an_epoch_does_not_open_with_the_previous_epochs_values():
    executor, logs = _Executor(), StepLogs()
    executor.logs = {"loss": 2.5}
    logs.reset(executor)   # the next epoch: nothing completed in it yet
    assert logs.shown(executor, {"loss": 0.0}) == {}


def test_the_empty_last_step_is_filled_with_the_drained_training_metrics():
    executor, logs = _Executor(), StepLogs()
    logs.reset(executor)
    shown = logs.shown(executor, {"loss": 0.0})
    logs.fill({"loss": 1.25})
    assert shown == {"loss": 1.25}
    logs.fill({"loss": 9.0})   # filled once
    assert shown == {"loss": 1.25}


def test_an_evaluate_from_a_batch_callback_does_not_fill_the_training_step():
    """An evaluate (or predict) started mid-epoch resets and reads the metrics: what it
    reads is evaluation's, so the training step's empty logs wait for the epoch's end."""
    executor, logs = _Executor(), StepLogs()
    logs.reset(executor)
    shown = logs.shown(executor, {"loss": 0.0})
    with logs.evaluating():
        logs.reset(executor)
        logs.fill({"loss": 7.0})   # evaluation's metrics
    assert shown == {}
    logs.fill({"loss": 1.25})      # the epoch's end reads the training metrics
    assert shown == {"loss": 1.25}
