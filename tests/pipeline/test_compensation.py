"""The compensation value and its table (pipeline/compensation.py): every preset is the
composition of parts it is documented as, and gives the predictor, memory and epoch cost
written out here independently of the table."""

import pytest

from hetpipe_tf.partitioner.cost import PredictionMemory
from hetpipe_tf.pipeline.compensation import (PRESET_NAMES, PRESETS, TABLE, Compensation,
                                              Correction)
from hetpipe_tf.pipeline.delay_compensation import DelayCompensatedPredictor
from hetpipe_tf.pipeline.gap_aware import GapAwarePredictor
from hetpipe_tf.pipeline.weight_prediction import WeightPredictor
from tests.strategy.helpers import DEVICES

WINDOW, PREDICTION = PredictionMemory(3, 2), PredictionMemory(1, 1)
# name: (predicts, reduces_momentum, averages, correction, predictor, memory, epoch cost)
EXPECTED = {
    "none": (False, False, False, Correction.NONE, None, None, 2.5),
    "predict": (True, False, False, Correction.NONE, WeightPredictor, PREDICTION, 2.5),
    "momentum": (False, True, False, Correction.NONE, None, None, 0.25),
    "both": (True, True, False, Correction.NONE, WeightPredictor, PREDICTION, 0.25),
    "average": (False, False, True, Correction.NONE, None, None, 2.5),
    "all": (True, True, True, Correction.NONE, WeightPredictor, PREDICTION, 0.25),
    "both_dc": (True, True, False, Correction.DELAY, DelayCompensatedPredictor, WINDOW, 0.25),
    "both_ga": (True, True, False, Correction.GAP, GapAwarePredictor, WINDOW, 0.25),
}


def test_parse_takes_members_and_names_and_refuses_others():
    assert Compensation.parse(Compensation.PREDICT) == Compensation.PREDICT
    assert Compensation.parse("Momentum") == Compensation.MOMENTUM
    assert Compensation.parse("none") == Compensation.NONE
    assert Compensation.parse(" Both-DC ") == Compensation.BOTH_DC
    with pytest.raises(ValueError, match="compensation=.*Compensation.PREDICT"):
        Compensation.parse("lookahead")
    for bad in ("", None, 3, "dc+ga", "predict+", "predict+predict"):
        with pytest.raises(ValueError, match="compensation="):
            Compensation.parse(bad)
    with pytest.raises(ValueError, match="predicts=1"):
        Compensation(predicts=1)
    with pytest.raises(ValueError, match="correction='gap_aware'"):
        Compensation(correction="gap_aware")


@pytest.mark.parametrize("name", PRESET_NAMES)
def test_each_preset_is_its_composition_and_gives_its_row(name):
    predicts, momentum, averages, correction, kind, memory, cost = EXPECTED[name]
    c = PRESETS[name]
    assert c == getattr(Compensation, name.upper()) == Compensation.parse(name.upper())
    assert c == Compensation(predicts=predicts, reduces_momentum=momentum,
                             averages=averages, correction=correction)
    assert (c.value, c.name, str(c), repr(c)) == (name, name.upper(), name,
                                                  f"Compensation.{name.upper()}")
    assert Compensation.parse("+".join(c.parts) or "none") == c
    assert c.memory == memory and c.epoch_cost == cost
    assert c.has_predictor is (kind is not None)
    predictor = c.make_predictor(DEVICES[0], n_m=2, num_vws=3)
    assert (predictor is None) if kind is None else (type(predictor) is kind)
    if predictor is not None:
        assert predictor.scale == 3.0 and predictor.horizon(p=4, last=2) == 3.0


def test_presets_are_listed_once_in_their_order():
    assert PRESET_NAMES == tuple(EXPECTED)
    assert len(set(PRESETS.values())) == len(PRESETS)
    assert {Compensation.BOTH: 1}[Compensation.parse("predict+momentum")] == 1   # hashable


def test_other_compositions_are_values_too():
    c = Compensation.parse("predict+average")
    assert c == Compensation(predicts=True, averages=True)
    assert c.value == "predict+average" and c.name == "PREDICT+AVERAGE"
    assert repr(c) == "Compensation(predicts=True, averages=True)"
    assert c.memory == PREDICTION and c.epoch_cost == 2.5
    assert type(c.make_predictor(DEVICES[0], 2)) is WeightPredictor
    # A correction alone corrects the gradients of versions read as they are.
    dc = Compensation(correction=Correction.DELAY)
    assert dc.value == "dc" and Compensation.parse("DC") == dc and dc.memory == WINDOW and dc.epoch_cost == 2.5
    predictor = dc.make_predictor(DEVICES[0], 3)
    assert type(predictor) is DelayCompensatedPredictor and not predictor.look_ahead
    assert predictor.horizon(p=5, last=2) == 0.0
    assert Compensation.parse("momentum+ga") == Compensation(
        reduces_momentum=True, correction=Correction.GAP)


def test_the_table_has_a_row_for_every_part():
    on = {TABLE[n].field for n in TABLE}
    assert on == {"predicts", "reduces_momentum", "averages", "correction"}
    corrections = {TABLE[n].setting for n in TABLE if TABLE[n].field == "correction"}
    assert corrections == set(Correction) - {Correction.NONE}
