"""HetSeq mode's arguments: bad input refused before training, with what and how to fix."""

import dataclasses
import re

import keras
import pytest

from hetpipe_tf.cluster.spec import Cluster
from hetpipe_tf.strategy import HetPipeStrategy, even_plan
from hetpipe_tf.strategy.data_parallel import DataParallel
from tests.strategy.helpers import DEVICES, assert_weights_close, regression_data, skip_model


def _cluster(memory=None):
    c = Cluster.local(["LOCAL_CPU"] * 4, emulated_speed_factors=[1, 1, 1, 0.5])
    if memory is None:
        return c
    host = c.hosts[0]
    devices = tuple(dataclasses.replace(d, memory_bytes=memory) if i == 3 else d
                    for i, d in enumerate(host.devices))
    return dataclasses.replace(c, hosts=(dataclasses.replace(host, devices=devices),))


def test_bad_arguments_are_refused_when_the_strategy_is_made():
    c = _cluster()
    with pytest.raises(ValueError, match="Unknown data_parallel.*data_parallel='hetsec'"):
        HetPipeStrategy(c, data_parallel="hetsec")
    with pytest.raises(ValueError, match="shares are the HetSeq mode's.*data_parallel='wsp'"):
        HetPipeStrategy(c, shares=[4, 4, 4, 4])
    with pytest.raises(ValueError, match="takes no plan"):
        HetPipeStrategy(c, data_parallel="hetseq",
                        plan=even_plan(skip_model(0), DEVICES[:1], n_m=1))
    with pytest.raises(ValueError, match="no allocation"):
        HetPipeStrategy(c, data_parallel=DataParallel.HETSEQ, allocation="ED")
    with pytest.raises(ValueError, match=r"int >= 1.*shares=\[4, 0, 4, 4\]"):
        HetPipeStrategy(c, data_parallel="hetseq", shares=[4, 0, 4, 4])
    with pytest.raises(ValueError, match="list of per-device batch sizes"):
        HetPipeStrategy(c, data_parallel="hetseq", shares="4,4,4,4")


def _fit_refused(strategy, batch_size, match, n=32):
    with strategy.scope():
        model = skip_model(0)
        model.compile(keras.optimizers.SGD(0.05), "mse")
    w0 = model.get_weights()
    x, y = regression_data(n, 0)
    with pytest.raises(ValueError, match=match):
        model.fit(x, y, batch_size=batch_size, epochs=1, verbose=0)
    assert_weights_close(model.get_weights(), w0)   # nothing trained
    strategy.close()


def test_bad_shares_and_batches_are_refused_at_the_first_fit_before_any_step():
    _fit_refused(HetPipeStrategy(_cluster(), data_parallel="hetseq", shares=[4, 4, 4, 3]),
                 16, r"do not sum.*sum 15\), batch_size=16")
    _fit_refused(HetPipeStrategy(_cluster(), data_parallel="hetseq", shares=[4, 4, 4]),
                 12, "one size per device.*for 4 devices")
    _fit_refused(HetPipeStrategy(_cluster(), data_parallel="hetseq"), 3,
                 "smaller than the number of devices.*batch_size=3 for 4 devices")
    _fit_refused(HetPipeStrategy(_cluster(memory=1), data_parallel="hetseq",
                                 shares=[4, 4, 4, 4]), 16,
                 r"exceeds its device's memory.*host0/cpu3: share 4 > max 0")
    _fit_refused(HetPipeStrategy(_cluster(memory=1), data_parallel="hetseq"), 16,
                 "no room for a sample.*host0/cpu3")


def test_a_later_larger_batch_is_refused_and_a_smaller_one_split_in_proportion():
    strategy = HetPipeStrategy(_cluster(), data_parallel="hetseq", shares=[5, 3, 2, 2])
    with strategy.scope():
        model = skip_model(0)
        model.compile(keras.optimizers.SGD(0.05), "mse")
    x, y = regression_data(24, 0)
    model.fit(x, y, batch_size=12, epochs=1, verbose=0)
    w = model.get_weights()
    with pytest.raises(ValueError, match="larger than the batch size.*planned for 12"):
        model.fit(x, y, batch_size=24, epochs=1, verbose=0)
    assert_weights_close(model.get_weights(), w)
    model.fit(x, y, batch_size=6, epochs=1, verbose=0)
    ex = strategy.executor(model)
    assert list(ex.splits)[-4:] == [(3, 1, 1, 1)] * 4
    strategy.close()


def _refused_when_made_or_at_fit(match, **kwargs):
    try:
        strategy = HetPipeStrategy(_cluster(), data_parallel="hetseq", **kwargs)
    except ValueError as e:   # refused when the strategy is made (all the better)
        assert re.search(match, str(e)), str(e)
        return
    _fit_refused(strategy, 16, match)


def test_options_that_mean_nothing_here_are_refused_before_training():
    from hetpipe_tf.core.sync_schedule import Schedule
    _refused_when_made_or_at_fit("schedule", schedule=Schedule.GPIPE, micro_batches=2)
    _refused_when_made_or_at_fit("takes no staleness compensation", compensation="predict")
    strategy = HetPipeStrategy(_cluster(), data_parallel="hetseq")
    with strategy.scope():
        model = skip_model(0)
        model.compile(keras.optimizers.SGD(0.05),
                      keras.losses.MeanSquaredError(reduction="sum"))
    x, y = regression_data(16, 0)
    with pytest.raises(ValueError, match="averages over the batch.*reduction='sum'"):
        model.fit(x, y, batch_size=8, epochs=1, verbose=0)
    strategy.close()
