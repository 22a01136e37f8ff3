"""The strategy's options (hetpipe_tf/strategy/options.py) and training modes (modes.py):
one frozen value with every default resolved when the strategy is made, one class per
mode, and no attribute of the extended written after its constructor."""

import dataclasses

import keras
import pytest

from hetpipe_tf.cluster.spec import Cluster
from hetpipe_tf.core.sync_schedule import Schedule
from hetpipe_tf.ps.faults import DEFAULT_TIMEOUT_S, FaultPolicy
from hetpipe_tf.strategy import HetPipeStrategy, even_plan
from hetpipe_tf.strategy.compensation import Compensation
from hetpipe_tf.strategy.data_parallel import DataParallel
from hetpipe_tf.strategy.layout import Layout
from hetpipe_tf.strategy.modes import (HetSeq, OneVirtualWorker, SynchronousPipeline,
                                       VirtualWorkers, mode_for)
from hetpipe_tf.strategy.options import StrategyOptions
from tests.strategy.helpers import DEVICES, regression_data, skip_model


def _cluster(n=2):
    return Cluster.local(["LOCAL_CPU"] * n)


def test_the_options_are_one_frozen_value_with_every_default_resolved():
    options = HetPipeStrategy(_cluster()).options
    assert isinstance(options, StrategyOptions)
    with pytest.raises(dataclasses.FrozenInstanceError):
        options.pipeline.n_m = 3
    with pytest.raises(dataclasses.FrozenInstanceError):
        options.wsp = None
    assert options.compensation.value == Compensation.BOTH and options.compensation.by_default
    assert options.pipeline.n_m is None                 # the planner's, at the first fit
    assert options.faults.timeout_s == DEFAULT_TIMEOUT_S
    assert options.faults.policy is FaultPolicy.STOP
    assert options.data_parallel.mode is DataParallel.WSP and not options.hetseq

    hetseq = HetPipeStrategy(_cluster(), data_parallel="hetseq").options
    assert hetseq.compensation.value == Compensation.NONE and hetseq.compensation.by_default
    assert hetseq.pipeline.n_m == 1 and hetseq.hetseq and not hetseq.splits_batches
    assert HetPipeStrategy(_cluster(), data_parallel="hetseq",
                           clock_distance=1).options.splits_batches

    plan = even_plan(skip_model(0), DEVICES[:2], n_m=2)
    given = HetPipeStrategy(plan=plan, compensation="none").options
    assert given.pipeline.n_m == 2 and given.layout.plans == (plan,)
    assert given.compensation.value == Compensation.NONE
    assert not given.compensation.by_default
    sync = HetPipeStrategy(plan=plan, schedule="gpipe", micro_batches=2).options
    assert sync.pipeline.n_m == 1 and sync.schedule.schedule is Schedule.GPIPE
    assert sync.schedule.synchronous and sync.schedule.micro_batches == 2


def test_the_options_property_is_read_only():
    strategy = HetPipeStrategy(_cluster())
    with pytest.raises(AttributeError):
        strategy.options = StrategyOptions()


def test_one_class_per_training_mode_chosen_from_the_options_and_the_layout():
    plan = even_plan(skip_model(0), DEVICES[:2], n_m=1)
    one = HetPipeStrategy(plan=plan).options
    sync = HetPipeStrategy(plan=plan, schedule="1f1b", micro_batches=2).options
    hetseq = HetPipeStrategy(_cluster(), data_parallel="hetseq").options
    assert type(mode_for(one, Layout((plan,), 1))) is OneVirtualWorker
    assert type(mode_for(sync, Layout((plan,), 1))) is SynchronousPipeline
    assert type(mode_for(one, Layout((plan, plan), 1))) is VirtualWorkers
    assert type(mode_for(sync, Layout((plan, plan), 1))) is VirtualWorkers
    assert type(mode_for(hetseq, Layout((), 1))) is HetSeq


def _attributes(extended) -> dict:
    return {k: id(v) for k, v in vars(extended).items()}


@pytest.mark.parametrize("kwargs,mode", [
    (dict(plan=even_plan(skip_model(0), DEVICES[:1], n_m=1)), "InGraphRuntime"),
    (dict(plan=even_plan(skip_model(0), DEVICES[:2], n_m=2)), "PipelineRuntime"),
    (dict(plan=even_plan(skip_model(0), DEVICES[:2], n_m=1), schedule=Schedule.GPIPE,
          micro_batches=2), "SyncPipelineRuntime"),
    (dict(plan=[even_plan(skip_model(0), DEVICES[:2], n_m=1),
                even_plan(skip_model(0), DEVICES[2:4], n_m=1)]), "Coordinator"),
    (dict(cluster=Cluster.local(["LOCAL_CPU"] * 2), plan=lambda m: even_plan(
        m, DEVICES[:2], n_m=2)), "PipelineRuntime"),
    (dict(cluster=Cluster.local(["LOCAL_CPU"] * 2), data_parallel="hetseq"),
     "HetSeqExecutor"),
])
def test_no_attribute_of_the_extended_is_written_after_its_constructor(kwargs, mode):
    """Per-model state (the executor, the layout planned at the first fit) lives in the
    dicts the constructor made; the attributes themselves are never (re)assigned."""
    strategy = HetPipeStrategy(**kwargs)
    before = _attributes(strategy.extended)
    options = strategy.options
    with strategy.scope():
        model = skip_model(0)
        model.compile(keras.optimizers.SGD(0.01), "mse")
    x, y = regression_data(32, 0)
    model.fit(x, y, batch_size=8, epochs=1, verbose=0)
    with strategy.scope():   # a rebuild on the same layout
        model.compile(keras.optimizers.SGD(0.01), "mse")
    model.fit(x, y, batch_size=8, epochs=1, verbose=0)
    assert type(strategy.executor(model)).__name__ == mode
    assert _attributes(strategy.extended) == before
    assert strategy.options is options
    assert strategy.n_m == (strategy.plans[0].n_m if strategy.plans else 1)
    strategy.close()


def test_the_options_record_whether_d_and_the_allocation_were_given():
    """Not given: D = 0 and allocation None as before, recorded as not given (a cluster
    model's planner picks them into the model's Layout); given, even 0, they are kept as
    given."""
    cluster = _cluster()
    plain = HetPipeStrategy(cluster).options
    assert plain.wsp.clock_distance == 0 and not plain.wsp.distance_given
    assert plain.layout.allocation is None and not plain.layout.allocation_given
    assert plain == StrategyOptions.parse(cluster)
    zero = HetPipeStrategy(cluster, clock_distance=0, allocation="ED").options
    assert zero.wsp.clock_distance == 0 and zero.wsp.distance_given
    assert zero.layout.allocation_given and zero.layout.allocation.name == "ED"
    assert zero != plain   # a given 0 is not "not given"
    assert not plain.hetseq
    with pytest.raises(ValueError, match="clock_distance"):
        HetPipeStrategy(cluster, clock_distance=-1)
