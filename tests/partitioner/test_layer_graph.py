"""Tests of the layer graph: node order, tensor refs, cut contents and sizes, errors."""

import keras
import numpy as np
import pytest

from hetpipe_tf.partitioner.layer_graph import LayerGraph, TensorRef
from tests.strategy.helpers import nested_model

L = keras.layers
F32 = 4  # bytes per float32


def _brute_force_cut_bytes(graph):
    return tuple(graph.cut_bytes_per_sample(i) for i in range(len(graph) - 1))


def _skip_model():
    # x(8) -> d1(16) -> d2(16) -> add(d1, d2) -> d3(4)
    x = keras.Input((8,), name="x")
    h1 = L.Dense(16, name="d1")(x)
    h2 = L.Dense(16, name="d2")(h1)
    s = L.Add(name="add")([h1, h2])
    return keras.Model(x, L.Dense(4, name="d3")(s))


def _two_branch_model():
    # x(6) -> a1(10) -> a2(5); x -> b1(3); concat(a2, b1, x) -> out(2)
    x = keras.Input((6,), name="x")
    a = L.Dense(5, name="a2")(L.Dense(10, name="a1")(x))
    b = L.Dense(3, name="b1")(x)
    c = L.Concatenate(name="cat")([a, b, x])
    return keras.Model(x, L.Dense(2, name="out")(c))


def test_skip_connection_cuts_match_hand_count():
    graph = LayerGraph.from_model(_skip_model())
    assert [n.name for n in graph.nodes] == ["d1", "d2", "add", "d3"]
    # cut 0 (after d1): d1's output, read by d2 and add          -> 16 floats
    # cut 1 (after d2): d1's output (read by add) + d2's output  -> 32 floats
    # cut 2 (after add): add's output                            -> 16 floats
    # x is read only by d1 (node 0), so it crosses no cut.
    assert graph.cut_tensors(0) == {TensorRef(0, 0)}
    assert graph.cut_tensors(1) == {TensorRef(0, 0), TensorRef(1, 0)}
    assert graph.cut_tensors(2) == {TensorRef(2, 0)}
    expected = (16 * F32, 32 * F32, 16 * F32)
    assert graph.all_cut_bytes_per_sample() == expected
    assert _brute_force_cut_bytes(graph) == expected
    assert graph.nodes[2].inputs == (TensorRef(0, 0), TensorRef(1, 0))
    assert graph.nodes[0].inputs == (TensorRef(-1, 0),)
    assert graph.outputs == (TensorRef(3, 0),)
    # Dense(8 -> 16): 8*16 kernel + 16 bias floats.
    assert graph.nodes[0].param_bytes == (8 * 16 + 16) * F32


def test_two_branch_concat_cuts_match_hand_count():
    graph = LayerGraph.from_model(_two_branch_model())
    assert [n.name for n in graph.nodes] == ["a1", "a2", "b1", "cat", "out"]
    # cut 0 (after a1): a1 (10) + x (6, still read by b1 and cat)  = 16 floats
    # cut 1 (after a2): a2 (5) + x (6)                               = 11 floats
    # cut 2 (after b1): a2 (5) + b1 (3) + x (6)                      = 14 floats
    # cut 3 (after cat): cat (5 + 3 + 6)                             = 14 floats
    expected = (16 * F32, 11 * F32, 14 * F32, 14 * F32)
    assert graph.all_cut_bytes_per_sample() == expected
    assert _brute_force_cut_bytes(graph) == expected
    assert TensorRef(-1, 0) in graph.cut_tensors(2)
    assert graph.layer("cat").output_shapes == ((14,),)
    assert graph.layer("cat").call_structure.args == ([TensorRef(1, 0), TensorRef(2, 0), TensorRef(-1, 0)],)


def test_graph_run_equals_model():
    model = _two_branch_model()
    x = np.random.default_rng(0).normal(size=(3, 6)).astype("float32")
    np.testing.assert_allclose(LayerGraph.from_model(model).run([x])[0], model(x), rtol=1e-6)



def test_training_replaces_a_recorded_value_as_functional_does():
    x = keras.Input((1000,), name="x")
    model = keras.Model(x, L.Dropout(0.5, name="drop")(x, training=False))
    graph = LayerGraph.from_model(model)
    ones = np.ones((1, 1000), "float32")
    assert (np.asarray(model(ones, training=True)) == 0).any()  # Keras' own rule
    assert (np.asarray(graph.run([ones], training=True)[0]) == 0).any()
    np.testing.assert_array_equal(graph.run([ones])[0], ones)

def test_sequential_graph():
    model = keras.Sequential([keras.Input((4,)), L.Dense(3, name="h"), L.ReLU(name="r"), L.Dense(2, name="o")])
    graph = LayerGraph.from_model(model)
    assert [n.name for n in graph.nodes] == ["h", "r", "o"]
    assert [n.inputs for n in graph.nodes] == [(TensorRef(-1, 0),), (TensorRef(0, 0),), (TensorRef(1, 0),)]
    assert graph.input_shapes == ((4,),)
    assert [n.output_shapes for n in graph.nodes] == [((3,),), ((3,),), ((2,),)]
    assert [n.param_bytes for n in graph.nodes] == [(4 * 3 + 3) * F32, 0, (3 * 2 + 2) * F32]
    assert graph.all_cut_bytes_per_sample() == (3 * F32, 3 * F32)
    assert graph.layer_of(0) is model.get_layer("h")


def test_sequential_built_with_build_call():
    model = keras.Sequential([L.Dense(3), L.Dense(1)])
    model.build((None, 5))
    assert len(LayerGraph.from_model(model)) == 2


def test_shared_layer_gives_one_node_per_call_and_counts_weights_once():
    x = keras.Input((8,))
    shared = L.Dense(8, name="d")
    a = shared(x)
    b = shared(a)
    model = keras.Model(x, L.Add(name="add")([a, b]))
    graph = LayerGraph.from_model(model)
    assert [n.name for n in graph.nodes] == ["d", "d@1", "add"]
    assert [n.param_bytes for n in graph.nodes] == [(8 * 8 + 8) * F32, 0, 0]
    assert graph.layer_of(0) is graph.layer_of(1) is shared
    assert graph.layer("d@1").inputs == (TensorRef(0, 0),)
    v = np.ones((2, 8), "float32")
    np.testing.assert_allclose(graph.run([v])[0], model(v), rtol=1e-6)


def test_nested_sequential_is_inlined():
    inner = keras.Sequential([keras.Input((4,)), L.Dense(6, name="a"), L.Dense(5, name="b")],
                             name="inner")
    x = keras.Input((4,))
    model = keras.Model(x, L.Dense(2, name="head")(inner(x)))
    graph = LayerGraph.from_model(model)
    assert [n.name for n in graph.nodes] == ["inner/a", "inner/b", "head"]
    assert [n.param_bytes for n in graph.nodes] == [(4 * 6 + 6) * F32, (6 * 5 + 5) * F32,
                                                    (5 * 2 + 2) * F32]
    assert graph.layer_of(0) is inner.layers[0]  # the user's layers, not copies
    assert graph.notes == ()


def test_nested_functional_two_levels_deep_is_inlined_with_skips():
    model = nested_model()
    graph = LayerGraph.from_model(model)
    names = [n.name for n in graph.nodes]
    assert names == ["backbone/blk1/blk1_a", "backbone/blk1/blk1_b", "backbone/blk1/blk1_add",
                     "backbone/seq/s1", "backbone/seq/s2", "backbone/blk2/blk2_a",
                     "backbone/blk2/blk2_b", "backbone/blk2/blk2_add", "cat", "head"]
    # blk1's residual reads the outer model input; blk2's reads seq's output (node 4).
    assert graph.layer("backbone/blk1/blk1_add").inputs == (TensorRef(-1, 0), TensorRef(1, 0))
    assert graph.layer("backbone/blk2/blk2_add").inputs == (TensorRef(4, 0), TensorRef(6, 0))
    # The backbone's second output is its input: the model input, read by "cat".
    assert graph.layer("cat").inputs == (TensorRef(7, 0), TensorRef(-1, 0))
    # Every cut inside the backbone carries the model input (8 floats) to "cat".
    row = 8 * F32
    assert graph.cut_bytes_per_sample(3) == 2 * row          # s1 out + x
    assert graph.cut_bytes_per_sample(5) == 3 * row          # blk2_a out + s2 out + x
    assert graph.cut_bytes_per_sample(8) == 3 * row * 1      # cat out (24 floats)
    assert sum(n.param_bytes for n in graph.nodes) == sum(
        int(np.prod(w.shape)) * F32 for w in model.weights)
    v = np.random.default_rng(0).normal(size=(2, 8)).astype("float32")
    np.testing.assert_allclose(graph.run([v])[0], model(v), rtol=1e-5, atol=1e-6)


def test_nested_open_dimension_is_defined_by_the_outer_input():
    # keras_hub backbones declare the sequence length None; the outer model fixes it.
    t = keras.Input((None,), dtype="int32")
    e = L.Embedding(50, 4, name="emb")(t)
    backbone = keras.Model(t, L.Dense(6, name="proj")(e), name="bb")
    x = keras.Input((7,), dtype="int32")
    model = keras.Model(x, L.Dense(1, name="head")(L.Flatten(name="flat")(backbone(x))))
    graph = LayerGraph.from_model(model)
    assert [n.output_shapes for n in graph.nodes] == [((7, 4),), ((7, 6),), ((42,),), ((1,),)]


def test_nested_model_with_dict_inputs_is_inlined():
    # As keras_hub backbones are called: a dict of named inputs (Keras records a mask
    # structure of None for it).
    t = keras.Input((5,), dtype="int32", name="token_ids")
    m = keras.Input((5,), dtype="int32", name="padding_mask")
    e = L.Embedding(20, 4, name="emb")(t)
    gate = L.Reshape((5, 1), name="gate")(keras.ops.cast(m, "float32"))
    backbone = keras.Model({"token_ids": t, "padding_mask": m},
                           L.Multiply(name="masked")([e, gate]), name="bb")
    ot = keras.Input((5,), dtype="int32", name="token_ids")
    om = keras.Input((5,), dtype="int32", name="padding_mask")
    h = backbone({"padding_mask": om, "token_ids": ot})
    model = keras.Model({"token_ids": ot, "padding_mask": om},
                        L.Dense(1, name="head")(L.Flatten(name="flat")(h)))
    graph = LayerGraph.from_model(model)
    assert graph.notes == ()
    assert [n.name for n in graph.nodes if n.name.startswith("bb/")][-1] == "bb/masked"
    v = {"token_ids": np.arange(10, dtype="int32").reshape(2, 5),
         "padding_mask": np.array([[1, 1, 1, 0, 0], [1, 1, 1, 1, 1]], "int32")}
    np.testing.assert_allclose(graph.run([v[k.name] for k in model.inputs])[0], model(v),
                               rtol=1e-6)


def test_subclassed_nested_model_stays_one_node_and_says_why():
    class Block(keras.Model):
        def __init__(self):
            super().__init__(name="custom")
            self.d = L.Dense(4)

        def call(self, x):
            return self.d(x) * 2.0

    x = keras.Input((4,))
    model = keras.Model(x, L.Dense(1, name="head")(Block()(x)))
    graph = LayerGraph.from_model(model)
    assert [n.name for n in graph.nodes] == ["custom", "head"]
    assert len(graph.notes) == 1
    assert "custom" in graph.notes[0] and "subclassed" in graph.notes[0]
    assert graph.nodes[0].param_bytes == (4 * 4 + 4) * F32


def test_nested_call_keras_would_convert_stays_one_node():
    i = keras.Input((4,), dtype="float32")
    inner = keras.Model(i, L.Dense(2, name="d")(i), name="inner")
    x = keras.Input((4,), dtype="int32")
    model = keras.Model(x, inner(x))   # Functional.call casts int32 -> float32
    graph = LayerGraph.from_model(model)
    assert [n.name for n in graph.nodes] == ["inner"]
    assert "int32" in graph.notes[0]
    v = np.arange(8, dtype="int32").reshape(2, 4)
    np.testing.assert_allclose(graph.run([v])[0], model(v), rtol=1e-6)


def test_tied_weights_allow_cuts_a_shared_layer_with_state_forbids_them():
    x = keras.Input((6,))
    tied = L.Dense(6, name="tied")
    h = L.Dense(6, name="mid")(tied(x))
    model = keras.Model(x, L.Dense(1, name="out")(tied(h)))
    graph = LayerGraph.from_model(model)
    assert [n.name for n in graph.nodes] == ["tied", "mid", "tied@1", "out"]
    assert graph.shared_layers == {"tied": (0, 2)}
    assert graph.forbidden_cuts() == frozenset()   # trainable weights only: borrowed
    norm = L.BatchNormalization(name="norm")       # moving statistics: kept together
    h = L.Dense(6, name="mid2")(norm(x))
    graph = LayerGraph.from_model(keras.Model(x, L.Dense(1, name="out2")(norm(h))))
    assert [graph.allowed_cut(c) for c in range(3)] == [False, False, True]
    assert graph.forbidden_cuts() == frozenset({0, 1})


def test_multi_input_ops_and_multi_output_refs():
    x1, x2 = keras.Input((4,)), keras.Input((4,))
    p, q = keras.ops.split(keras.ops.add(x1, x2), 2, axis=-1)  # bare ops, not layers
    model = keras.Model([x1, x2], [L.Dense(3, name="y")(p), L.ReLU(name="r")(q)])
    graph = LayerGraph.from_model(model)
    assert graph.nodes[0].inputs == (TensorRef(-1, 0), TensorRef(-2, 0))
    assert graph.nodes[1].output_shapes == ((2,), (2,))
    assert [n.name for n in graph.nodes[2:]] == ["y", "r"]
    assert graph.layer("r").inputs == (TensorRef(1, 1),)
    # After y (node 2) only split's second output crosses: y is a model output that no
    # later node reads, so it is not part of the cut.
    assert graph.cut_tensors(2) == {TensorRef(1, 1)}
    assert graph.cut_bytes_per_sample(2) == 2 * F32
    a, b = np.ones((2, 4), "float32"), np.full((2, 4), 2.0, "float32")
    for got, want in zip(graph.run([a, b]), model([a, b])):
        np.testing.assert_allclose(got, want, rtol=1e-6)


@pytest.fixture(scope="module")
def resnet50():
    return keras.applications.ResNet50(weights=None, input_shape=(32, 32, 3))


def test_resnet50_nodes_and_residual_cuts(resnet50):
    graph = LayerGraph.from_model(resnet50)
    non_input = [l for l in resnet50.layers if not isinstance(l, L.InputLayer)]
    assert len(graph) == len(non_input)
    assert [n.name for n in graph.nodes] == [l.name for l in non_input]
    assert graph.all_cut_bytes_per_sample() == _brute_force_cut_bytes(graph)
    names = [n.name for n in graph.nodes]
    for block in ("conv2_block1", "conv2_block2", "conv3_block1", "conv5_block3"):
        inside = [i for i, name in enumerate(names) if name.startswith(block + "_")]
        assert names[inside[-2]] == block + "_add"
        # Every cut from after the block's first layer to before its "_add" carries the
        # main path and the shortcut; after "_add" and after "_out" one tensor is left.
        for i in inside[:-2]:
            assert len(graph.cut_tensors(i)) == 2, names[i]
        for i in inside[-2:]:
            assert len(graph.cut_tensors(i)) == 1, names[i]


def test_resnet50_graph_run_equals_model(resnet50):
    x = np.random.default_rng(1).normal(size=(1, 32, 32, 3)).astype("float32")
    graph = LayerGraph.from_model(resnet50)
    np.testing.assert_allclose(graph.run([x])[0], resnet50(x), atol=1e-5)


def test_layer_lookup_errors():
    graph = LayerGraph.from_model(_skip_model())
    with pytest.raises(ValueError, match="Received: name='nope'"):
        graph.layer("nope")
    with pytest.raises(ValueError, match="Received: i=3"):
        graph.cut_tensors(3)
    with pytest.raises(ValueError, match="Received: i=9"):
        graph.layer_of(9)


def test_empty_model_is_rejected():
    with pytest.raises(ValueError, match="no layers. Received:"):
        LayerGraph.from_model(keras.Sequential())


def test_unbuilt_model_is_rejected():
    with pytest.raises(ValueError, match=r"not built. Received:.*model.build"):
        LayerGraph.from_model(keras.Sequential([L.Dense(3)]))


def test_subclassed_model_is_rejected():
    class Sub(keras.Model):
        def __init__(self):
            super().__init__()
            self.d = L.Dense(2)

        def call(self, x):
            return self.d(x)

    model = Sub()
    model(np.ones((1, 3), "float32"))
    with pytest.raises(ValueError, match="no layer graph. Received:"):
        LayerGraph.from_model(model)


def test_undefined_per_sample_shape_is_rejected():
    x = keras.Input((None, 4))
    with pytest.raises(ValueError, match="fully defined.*Received:"):
        LayerGraph.from_model(keras.Model(x, L.Dense(2)(x)))
