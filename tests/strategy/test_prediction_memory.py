"""hetpipe_tf/strategy/prediction_memory.py: the planner counts weight prediction's
buffers (docs/memory.md "Staleness compensation"): a device that fits a stage without them
is refused, by name, when the compensation predicts."""

import itertools

import keras
import pytest

from hetpipe_tf.cluster.spec import Cluster
from hetpipe_tf.partitioner.cost import CostModel, PredictionMemory
from hetpipe_tf.partitioner.plan import PartitionError
from hetpipe_tf.pipeline.compensation import PRESETS, Compensation
from hetpipe_tf.strategy.planning import plan_with_partitioner
from hetpipe_tf.strategy.prediction_memory import prediction_memory
from tests.strategy.helpers import with_device_memory


def test_each_compensation_maps_to_its_measured_copies():
    # measured (docs/memory.md): N_m copies with weight prediction, 3 N_m - 1 with
    # delay compensation's or Gap-Aware's window; none without a predictor
    for c in PRESETS.values():
        pm = prediction_memory(c)
        if not c.predicts:
            assert pm is None, c
        elif c in (Compensation.BOTH_DC, Compensation.BOTH_GA):
            assert [pm.copies(n) for n in (1, 2, 4)] == [0, 5, 11], c
        else:
            assert [pm.copies(n) for n in (1, 2, 4)] == [0, 2, 4], c
    assert prediction_memory(None) is None and prediction_memory("both") == PredictionMemory(1, 1)
    # compositions: the predictor's copies (a correction's window, with or without prediction)
    assert prediction_memory("predict+average") == PredictionMemory(1, 1)
    assert prediction_memory("dc") == prediction_memory("momentum+ga") == PredictionMemory(3, 2)


def _model():
    keras.utils.set_random_seed(0)
    model = keras.Sequential([keras.Input((32,)), keras.layers.Dense(128, name="a"),
                              keras.layers.Dense(128, name="b"),
                              keras.layers.Dense(4, name="c")])
    model.compile("sgd", "mse")
    return model


def test_a_device_that_fits_without_prediction_is_refused_with_it():
    from hetpipe_tf.partitioner.planner import plan_model

    roomy = Cluster.local(["LOCAL_CPU", "LOCAL_CPU"])
    model = _model()
    (plan,) = plan_with_partitioner(model, 8, roomy, 2, None, compensation=Compensation.NONE)
    # Each device gets exactly what the plan without prediction needs (usable 0.9).
    tight = with_device_memory(roomy, -(-max(s.memory_bytes for s in plan.stages) * 10 // 9) + 16)
    (fitted,) = plan_with_partitioner(model, 8, tight, 2, None, compensation="none")
    assert fitted.n_m == 2
    # MOMENTUM and AVERAGE keep no predictor: N_m = 2 fits as without compensation
    # (the layout may differ: the layers' times are measured anew each time)
    for c in ("momentum", "average"):
        (same,) = plan_with_partitioner(model, 8, tight, 2, None, compensation=c)
        assert same.n_m == 2
    # An independent reference: every cut and order by CostModel.evaluate, with BOTH's
    # 2 extra copies at N_m = 2, leaves some stage short.
    profile = plan_model(model, tight, 8, n_m=2, optimizer="sgd").profile
    cm = CostModel(profile, tight.devices, tight, n_m=2, prediction=PredictionMemory(1, 1))
    for cut, order in itertools.product(range(cm.num_layers - 1),
                                        [tight.devices, tight.devices[::-1]]):
        if cm.cuts_allowed([cut]):
            assert not all(c.fits for c in cm.evaluate([cut], order)), cut
    for c in (Compensation.BOTH, "both_dc"):
        with pytest.raises(PartitionError, match=r"Max_m=1\). Received: n_m=2"):
            plan_with_partitioner(model, 8, tight, 2, None, compensation=c)
    # No N_m given: BOTH falls back to the N_m that fits (1: no predictor then).
    (one,) = plan_with_partitioner(model, 8, tight, None, None, compensation="both")
    assert one.n_m == 1


def test_the_infeasible_error_names_the_prediction_buffers():
    from hetpipe_tf.partitioner.milp import solve
    from hetpipe_tf.partitioner.planner import plan_model

    roomy = Cluster.local(["LOCAL_CPU"])
    result = plan_model(_model(), roomy, 8, n_m=2, optimizer="sgd")
    tight = with_device_memory(roomy, -(-result.plan.stages[0].memory_bytes * 10 // 9) + 16)
    solve(result.profile, tight.devices, 2, cluster=tight)   # fits without prediction
    with pytest.raises(PartitionError, match=r"n_m=2, prediction=PredictionMemory\(per_version=1, "
                       r"constant=1\). To fix: without weight prediction's 2 extra copies of "
                       r"the weights it fits \(compensation='none'"):
        solve(result.profile, tight.devices, 2, cluster=tight,
              prediction=prediction_memory("both"))
