"""Stages run on their devices: variables (with an explicit plan), forward and backward."""

import keras
import tensorflow as tf

from hetpipe_tf import _shim as keras_shim
from hetpipe_tf.strategy import HetPipeStrategy, StageSpec, manual_plan
from hetpipe_tf.pipeline.program import Program
from hetpipe_tf.pipeline.stage import Stage
from tests.strategy.helpers import DEVICES, regression_data, skip_model


def _dev(t):
    return tf.DeviceSpec.from_string(t.device).device_index


def test_backward_ops_run_on_the_stage_device():
    model = skip_model()
    stage = Stage(0, 2, Program.from_model(model), 0, 2, DEVICES[2], 1.0, model)
    x = tf.random.normal((4, 8))
    with tf.device(DEVICES[0]):  # the version lives elsewhere: the stage must still compute
        tvals = [tf.identity(keras_shim.variable_handle(v)) for v in stage.trainable]
    outputs, _, _, saved = stage.forward(tvals, [], [x])
    assert {_dev(o) for o in outputs} == {2}
    weight_grads, input_grads = stage.backward(saved, [tf.ones_like(o) for o in outputs])
    assert {_dev(g) for g in weight_grads} == {2}
    assert input_grads == [None]  # stage 0's input is the model input: no gradient
    # Control: the same gradient computed under another device scope lands there, i.e. the
    # placement above comes from the stage, not from TensorFlow (tensorflow#33688).
    outputs, _, _, saved = stage.forward(tvals, [], [x])
    with tf.device(DEVICES[0]):
        g = saved.tape.gradient(outputs, saved.tvals,
                                output_gradients=[tf.ones_like(o) for o in outputs])
    assert {_dev(t) for t in g} == {0}


def test_middle_stage_passes_input_gradients_for_skip_connections():
    model = skip_model()
    prog = Program.from_model(model)
    assert prog.layer_names == ("d1", "d2", "d3", "add", "out")
    # Stage 1 = d2..d3: receives h1 (consumed by d2 and, past the stage, by add).
    stage = Stage(1, 3, prog, 1, 2, DEVICES[1], 1.0, model)
    assert [r.node for r in stage.in_refs] == [0]
    assert [r.node for r in stage.out_refs] == [0, 2]  # h1 passes through, plus h3
    h1 = tf.random.normal((4, 16))
    tvals = [tf.identity(keras_shim.variable_handle(v)) for v in stage.trainable]
    outputs, _, _, saved = stage.forward(tvals, [], [h1])
    _, (g_h1,) = stage.backward(saved, [tf.ones_like(o) for o in outputs])
    # d(h1 passthrough)/d h1 = identity contributes exactly the output gradient of h1.
    assert _dev(g_h1) == 1 and g_h1.shape == (4, 16)
    _, (g_only_skip,) = stage.backward(stage.forward(tvals, [], [h1])[3],
                                       [tf.ones_like(outputs[0]), tf.zeros_like(outputs[1])])
    tf.debugging.assert_near(g_only_skip, tf.ones_like(h1))


def test_explicit_plan_places_variables_and_slots_on_stage_devices():
    plan = manual_plan(skip_model(), [StageSpec(DEVICES[1], 2), StageSpec(DEVICES[2], 3)],
                       n_m=2, batch_size=8)
    strategy = HetPipeStrategy(plan=plan)
    with strategy.scope():
        model = skip_model()
        model.compile(keras.optimizers.Adam(0.01), "mse")
    x, y = regression_data(32)
    model.fit(x, y, batch_size=8, epochs=1, verbose=0)
    for layer_name, want in [("d1", 1), ("d2", 1), ("d3", 2), ("out", 2)]:
        for v in model.get_layer(layer_name).weights:
            assert _dev(keras_shim.variable_handle(v)) == want, v.path
    # The stages train with optimizers of their own, their slots on the stage's device; the
    # model's optimizer (the between-runs state, docs/state.md) keeps its slots on the host.
    from hetpipe_tf.strategy import training_state
    rt = strategy.pipeline(model)
    for sw, want in zip(rt.versions.stages, (1, 2)):
        for slot in training_state._slots(sw.optimizer):
            assert _dev(keras_shim.variable_handle(slot)) == want, slot.path
    for slot in model.optimizer.variables[2:]:
        assert _dev(keras_shim.variable_handle(slot)) == 0, slot.path
    assert rt.completed == 4
    strategy.close()


def test_variables_of_a_nested_model_go_to_their_stage_device():
    from tests.strategy.helpers import nested_model
    # Plans name the inner layers by path ("backbone/blk1/blk1_a"); the variables are built
    # under the inner layer's own name scope. Stage 0 = blk1 and s1, stage 1 = the rest.
    plan = manual_plan(nested_model(), [StageSpec(DEVICES[1], 4), StageSpec(DEVICES[2], 6)],
                       n_m=1)
    strategy = HetPipeStrategy(plan=plan)
    with strategy.scope():
        model = nested_model()
    want = {"blk1_a": 1, "blk1_b": 1, "s1": 1, "s2": 2, "blk2_a": 2, "blk2_b": 2, "head": 2}
    seen = set()
    for layer in keras_shim.all_layers(model):
        for v in layer.weights if layer.name in want else ():
            assert _dev(keras_shim.variable_handle(v)) == want[layer.name], v.path
            seen.add(layer.name)
    assert seen == set(want)
    strategy.close()
