"""The runtime's view of the LayerGraph: cuts that carry model outputs, stage 0's inputs,
y_pred packing, and models the runtime rejects."""

import dataclasses

import keras
import numpy as np
import pytest

from hetpipe_tf.partitioner.layer_graph import TensorRef
from hetpipe_tf.strategy import StageSpec, manual_plan
from hetpipe_tf.pipeline.program import Program, check_shared_layers_kept_together
from hetpipe_tf.strategy.validation import check_plan
from tests.strategy.helpers import DEVICES


def _two_inputs_two_outputs():
    a = keras.Input((3,), name="a")
    b = keras.Input((5,), name="b")
    ha = keras.layers.Dense(2, name="da")(a)
    hb = keras.layers.Dense(2, name="db")(keras.layers.Multiply(name="m")([b, b]))
    late = keras.layers.Add(name="add")([ha, hb])
    return keras.Model([a, b], {"late": late, "early": ha})


def test_stages_at_every_cut_compute_the_model():
    model = _two_inputs_two_outputs()
    program = Program.from_model(model)
    last = len(program.graph) - 1
    rng = np.random.default_rng(0)
    a, b = rng.normal(size=(4, 3)).astype("float32"), rng.normal(size=(4, 5)).astype("float32")
    want = model([a, b])
    for split in range(last + 1):  # stage 1 = nodes 0..split-1, stage 2 = split..last
        env = dict(zip(program.cut(-1), program.model_inputs({"b": b, "a": a})))
        program.run(0, split - 1, env, training=False)
        env = {r: env[r] for r in program.cut(split - 1)}  # only the cut reaches stage 2
        program.run(split, last, env, training=False)
        got = program.pack_outputs([env[r] for r in program.cut(last)])
        assert sorted(got) == ["early", "late"]
        for key in got:
            np.testing.assert_allclose(got[key], want[key], rtol=1e-6)


def test_cut_carries_model_outputs_to_the_last_stage():
    program = Program.from_model(_two_inputs_two_outputs())
    da = TensorRef(program.layer_names.index("da"), 0)
    last = len(program.graph) - 1
    for i in range(program.layer_names.index("add"), last):
        assert da not in program.graph.cut_tensors(i)  # no later node reads it...
        assert da in program.cut(i)  # ...but it is a model output: it reaches the last stage
    assert program.cut(last) == tuple(sorted(program.graph.outputs))
    assert all(r.is_model_input for r in program.cut(-1)) and len(program.cut(-1)) == 2


def _tied(layer=None):
    inp = keras.Input((8,))
    shared = layer or keras.layers.Dense(8, name="shared")
    return keras.Model(inp, keras.layers.Dense(1, name="out")(shared(shared(inp))))


def test_a_shared_layer_is_one_layer_of_its_stage():
    program = Program.from_model(_tied())
    assert program.layer_names == ("shared", "shared@1", "out")
    assert [l.name for l in program.stage_layers(0, 2)] == ["shared", "out"]
    check_shared_layers_kept_together(program.graph, [(0, 1), (2, 2)])  # together: fine
    check_shared_layers_kept_together(program.graph, [(0, 0), (1, 2)])  # tied weights: fine


def test_a_split_between_the_calls_of_a_shared_layer_with_state_is_refused():
    program = Program.from_model(_tied(keras.layers.BatchNormalization(name="shared")))
    with pytest.raises(ValueError, match=r"layer 'shared' called at nodes \[0, 1\].*stages "
                                         r"\[0, 1\]; cut only after nodes 1 "):
        check_shared_layers_kept_together(program.graph, [(0, 0), (1, 2)])


def test_plan_in_a_non_topological_order_is_rejected():
    model = _two_inputs_two_outputs()
    plan = manual_plan(model, [StageSpec(DEVICES[0], 4)], n_m=1)
    names = plan.stages[0].layer_names
    swapped = dataclasses.replace(plan.stages[0], layer_names=names[::-1])
    plan = dataclasses.replace(plan, stages=(swapped,))
    with pytest.raises(ValueError, match="not a topological order"):
        check_plan(plan, Program.from_model(model), model, batch_size=4)
