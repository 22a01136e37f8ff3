"""Bad input raises a clear ValueError before training starts (nothing half-trained)."""

import re

import keras
import numpy as np
import pytest
import tensorflow as tf

from hetpipe_tf.strategy import HetPipeStrategy, StageSpec, even_plan, manual_plan
from tests.strategy.helpers import DEVICES, assert_weights_close, regression_data, skip_model


def _strategy(n_m=2, k=2):
    return HetPipeStrategy(plan=lambda m: even_plan(m, DEVICES[:k], n_m=n_m))


def _fit_raises(model, match, x=None, y=None, **kw):
    if x is None:
        x, y = regression_data(32)
    w0 = model.get_weights()
    with pytest.raises(ValueError, match=match) as info:
        model.fit(x, y, batch_size=kw.pop("batch_size", 8), epochs=1, verbose=0, **kw)
    assert "Received:" in str(info.value)
    assert_weights_close(model.get_weights(), w0, atol=0)  # nothing was trained
    return info.value


def test_model_overriding_train_step():
    class Custom(keras.Model):
        def train_step(self, data):
            return super().train_step(data)

    strategy = _strategy()
    with strategy.scope():
        inp = keras.Input((8,))
        model = Custom(inp, keras.layers.Dense(1)(keras.layers.Dense(4)(inp)))
        model.compile("sgd", "mse")
    err = _fit_raises(model, "overrides train_step")
    assert "add_loss" in str(err) and "compile()" in str(err)   # the route a VAE takes


def test_an_open_batch_dimension_with_no_batch_size_to_plan_for_is_refused():
    """Remainders, generators and open batch dimensions train (test_batch_sizes.py); only
    when neither the trace nor Keras' data adapter tells a batch size is there nothing to
    plan the pipeline for."""
    from hetpipe_tf.strategy.validation import check_batch

    @tf.function(input_signature=[tf.TensorSpec((None, 8)), tf.TensorSpec((None, 1))])
    def trace(x, y):
        with pytest.raises(ValueError, match=r"batch size is unknown.*Received: batch shapes "
                                             r"\[\(None, 8\), \(None, 1\)\]"):
            check_batch((x, y))
        assert check_batch((x, y), lambda: 16) == 16
        return x

    trace.get_concrete_function()


@pytest.mark.parametrize("field,value", [("max_m", -1), ("max_m", 0), ("max_m", 2.0),
                                         ("num_virtual_workers", 0),
                                         ("num_virtual_workers", True)])
def test_counts_are_checked_when_the_strategy_is_made(field, value):
    """Not first at the fit that plans with them."""
    import hetpipe_tf as hp

    with pytest.raises(ValueError, match=rf"{field} must be an integer >= 1\. "
                                         rf"Received: {field}={value!r}"):
        HetPipeStrategy(hp.Cluster.local(["LOCAL_CPU"] * 2), **{field: value})


def test_n_m_larger_than_max_m():
    with pytest.raises(ValueError, match=r"N_m exceeds Max_m.*Received: n_m=5, max_m=3"):
        HetPipeStrategy(plan=even_plan(skip_model(), DEVICES[:2], n_m=5), max_m=3)
    with pytest.raises(ValueError, match="larger than the N_m the plan was made for"):
        HetPipeStrategy(plan=even_plan(skip_model(), DEVICES[:2], n_m=2), n_m=4)
    with pytest.raises(ValueError, match="positive integer"):
        HetPipeStrategy(plan=even_plan(skip_model(), DEVICES[:2], n_m=2), n_m=0)


def test_plan_that_does_not_match_the_model():
    inp = keras.Input((8,))
    other = keras.Model(inp, keras.layers.Dense(1, name="only")(inp))
    strategy = HetPipeStrategy(plan=manual_plan(other, [StageSpec(DEVICES[0], 1)], n_m=1))
    with strategy.scope():
        model = skip_model()
        model.compile("sgd", "mse")
    _fit_raises(model, "does not match the model")


@pytest.mark.parametrize("bad", ["stateful", "shared"])   # masks train: test_masks.py
def test_layers_the_runtime_cannot_place(bad):
    # "shared": a hand-made plan that puts the two calls of a layer with moving statistics
    # in two stages (tied trainable weights may be split: test_nested_models.py).
    strategy = (HetPipeStrategy(plan=lambda m: manual_plan(
        m, [StageSpec(DEVICES[0], 1), StageSpec(DEVICES[1], 2)], n_m=2))
        if bad == "shared" else _strategy(k=2))
    with strategy.scope():
        if bad == "stateful":
            inp = keras.Input((3, 8), batch_size=8)
            h = keras.layers.SimpleRNN(4, stateful=True)(inp)
            match = "stateful=True"
        else:
            inp = keras.Input((8,))
            shared = keras.layers.BatchNormalization(name="shared")   # state beyond weights
            h = shared(shared(inp))
            match = (r"shared layer with state other than trainable weights must run its "
                     r"calls in one stage.*'shared'.*stages \[0, 1\]")
        model = keras.Model(inp, keras.layers.Dense(1)(h))
        model.compile("sgd", "mse")
    if bad == "stateful":
        x = np.zeros((16, 3, 8), "float32")
    elif bad == "mask":
        x = np.ones((16, 3), "int32")
    else:
        x = np.zeros((16, 8), "float32")
    _fit_raises(model, match, x, np.zeros((16, 1), "float32"))


def test_model_created_outside_scope_or_subclassed():
    strategy = _strategy()
    model = skip_model()
    with strategy.scope():
        model.compile("sgd", "mse")
    _fit_raises(model, "scope")

    class Sub(keras.Model):
        def __init__(self):
            super().__init__()
            self.d = keras.layers.Dense(1)

        def call(self, x):
            return self.d(x)

    with strategy.scope():
        sub = Sub()
        sub.compile("sgd", "mse")
        sub(np.zeros((1, 8), "float32"))
    _fit_raises(sub, "Functional")


def test_strategy_without_devices():
    with pytest.raises(ValueError, match="needs the virtual worker's devices"):
        HetPipeStrategy()


# --- issue 8 point 10: plans, compile options and optimizers refused before training ------

def _compiled(strategy, optimizer="sgd", **compile_kw):
    with strategy.scope():
        model = skip_model()
        model.compile(optimizer, "mse", **compile_kw)
    return model


@pytest.mark.parametrize("device", [
    "/cpu:9",                      # one index past the 4 logical CPUs
    "/job:localhost/replica:0/task:0/device:GPU:0",   # no GPU on this machine
])
def test_plan_naming_a_device_that_does_not_exist(device):
    plan = manual_plan(skip_model(), [StageSpec(DEVICES[0], 2), StageSpec(device, 3)], n_m=2)
    model = _compiled(HetPipeStrategy(plan=plan))
    err = _fit_raises(model, "does not exist")
    assert device in str(err) and "tf.config.list_logical_devices" in str(err)


_NO_LOGICAL_DEVICES = """
import keras, numpy as np
import hetpipe_tf as hp
strategy = hp.HetPipeStrategy(hp.Cluster.local(["CPU", "CPU"]))
with strategy.scope():
    model = keras.Sequential([keras.Input((4,)), keras.layers.Dense(4), keras.layers.Dense(1)])
    model.compile("sgd", "mse")
try:
    model.fit(np.ones((16, 4)), np.ones((16, 1)), batch_size=8, verbose=0)
except ValueError as e:
    print("REFUSED", e)
"""


def test_a_local_cluster_without_logical_devices_names_the_librarys_own_call():
    """A new user's first run (no logical devices made): the error shows
    hetpipe_tf's configure_logical_devices call with the count the cluster needs."""
    import os
    import subprocess
    import sys

    root = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
    proc = subprocess.run([sys.executable, "-c", _NO_LOGICAL_DEVICES], cwd=root,
                          capture_output=True, text=True, timeout=240)
    assert "REFUSED" in proc.stdout, proc.stderr[-3000:]
    assert "hp.configure_logical_devices(2)" in proc.stdout
    assert "before TensorFlow starts" in proc.stdout


def test_plan_whose_devices_are_not_in_the_given_cluster():
    from hetpipe_tf.cluster.spec import Cluster
    cluster = Cluster.local(["LOCAL_CPU", "LOCAL_CPU"])   # CPU:0 and CPU:1
    plan = even_plan(skip_model(), [DEVICES[0], DEVICES[3]], n_m=2)
    model = _compiled(HetPipeStrategy(cluster, plan=plan))
    err = _fit_raises(model, "not in the cluster")
    assert "CPU:3" in str(err) and "host0/cpu0" in str(err)   # names the cluster's devices
    # The same plan on the cluster's own devices is accepted (by name or TF device).
    ok = even_plan(skip_model(), [d.tf_device for d in cluster.devices], n_m=2)
    model = _compiled(HetPipeStrategy(cluster, plan=ok))
    x, y = regression_data(16)
    model.fit(x, y, batch_size=8, epochs=1, verbose=0)
    model.distribute_strategy.close()


def test_manual_plan_with_two_stages_on_one_device():
    plan = manual_plan(skip_model(), [StageSpec(DEVICES[1], 2), StageSpec(DEVICES[1], 3)], n_m=2)
    model = _compiled(HetPipeStrategy(plan=plan))
    err = _fit_raises(model, "two stages on one device")
    assert "stages 0 and 1" in str(err) and "CPU:1" in str(err)


# With a stateful optimizer Keras' fit builds the optimizer's slots (symbolic build) before
# the strategy sees the model; the strategy checks when fit distributes its dataset, first.
@pytest.mark.parametrize("optimizer", ["adam", "sgd"])
def test_compile_outside_the_scope(optimizer):
    strategy = _strategy()
    with strategy.scope():
        model = skip_model()
    model.compile(optimizer, "mse")                # outside: the optimizer is not the strategy's
    err = _fit_raises(model, "outside")
    assert "inside `with strategy.scope():`" in str(err)


def test_mixed_float16_is_refused_and_points_to_bfloat16():
    keras.mixed_precision.set_global_policy("mixed_float16")
    try:
        model = _compiled(_strategy())
        err = _fit_raises(model, "LossScaleOptimizer")
        assert "mixed_bfloat16" in str(err)
    finally:
        keras.mixed_precision.set_global_policy("float32")


@pytest.mark.parametrize("k", [1, 2])   # one stage in Keras' step; two stages threaded
def test_trainable_changed_without_compile_then_a_retrace(k):
    """Without compile() Keras keeps its traced step, old trainable flags included: so does
    the strategy (equal to plain Keras). A fit that makes Keras trace again (sample weights
    added) would have to build a new pipeline inside that retrace, where tf.function lets
    create no variables: refused by name, nothing trained, and compile() trains on."""
    x, y = regression_data(32)
    strategy = HetPipeStrategy(plan=lambda m: even_plan(m, DEVICES[:k], n_m=1))
    plain = skip_model(0)
    with strategy.scope():
        model = skip_model(0)
        model.compile(keras.optimizers.SGD(0.05), "mse")
    plain.compile(keras.optimizers.SGD(0.05), "mse")
    for m in (model, plain):
        m.fit(x, y, batch_size=8, epochs=1, shuffle=False, verbose=0)
        m.layers[1].trainable = False
        m.fit(x, y, batch_size=8, epochs=1, shuffle=False, verbose=0)   # same trace
    assert_weights_close(model.get_weights(), plain.get_weights())
    err = _fit_raises(model, "changed since compile", x, y,
                      sample_weight=np.linspace(0.5, 1.5, len(x)))
    assert "trainable variables" in str(err) and "compile()" in str(err)
    with strategy.scope():
        model.compile(keras.optimizers.SGD(0.05), "mse")
    frozen = model.layers[1].get_weights()
    model.fit(x, y, sample_weight=np.linspace(0.5, 1.5, len(x)), batch_size=8, epochs=1,
              verbose=0)
    assert_weights_close(model.layers[1].get_weights(), frozen, atol=0)
    strategy.close()


_ONE_INTER_OP_THREAD = """
import sys
import tensorflow as tf
tf.config.threading.set_inter_op_parallelism_threads(1)
cpus = tf.config.list_physical_devices("CPU")
tf.config.set_logical_device_configuration(cpus[0], [tf.config.LogicalDeviceConfiguration()] * 2)
import keras, numpy as np
import hetpipe_tf as hp
for stages in map(int, sys.argv[1:]):
    strategy = hp.HetPipeStrategy(hp.Cluster.local(["LOCAL_CPU"] * stages), n_m=stages)
    with strategy.scope():
        model = keras.Sequential([keras.Input((4,)), keras.layers.Dense(4), keras.layers.Dense(1)])
        model.compile("sgd", "mse")
    x = np.ones((16, 4), "float32")
    try:
        model.fit(x, x[:, :1], batch_size=8, verbose=0)
        print(stages, "TRAINED", flush=True)
    except ValueError as e:
        print(stages, "REFUSED", str(e).replace(chr(10), " "), flush=True)
"""


@pytest.fixture(scope="module")
def one_inter_op_thread():
    """{stages: the line printed} of one subprocess (the pool is set before TensorFlow
    starts) that fits with 1 and then 2 stages, killed by `subprocess.run`'s timeout if
    it hangs."""
    import os
    import subprocess
    import sys

    root = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
    proc = subprocess.run([sys.executable, "-c", _ONE_INTER_OP_THREAD, "1", "2"],
                          cwd=root, capture_output=True, text=True, timeout=240)
    lines = {int(line.split(" ", 1)[0]): line.split(" ", 1)[1]
             for line in proc.stdout.splitlines() if line[:2] in ("1 ", "2 ")}
    return lines, proc.stderr


@pytest.mark.parametrize("stages", [1, 2])
def test_a_threaded_pipeline_with_one_inter_op_thread_is_refused_not_hung(
        stages, one_inter_op_thread):
    """Keras' step holds an inter-op thread while the pipeline works: with a pool of one,
    a threaded pipeline hung at its first batch; one stage at N_m = 1 runs inside Keras'
    step and trains."""
    lines, stderr = one_inter_op_thread
    if stages == 1:
        assert lines.get(1) == "TRAINED", stderr[-3000:]
    else:
        assert re.search(r"REFUSED A pipelined fit needs TensorFlow's inter-op thread pool "
                         r"to have at least 2 threads.*Received: "
                         r"inter_op_parallelism_threads=1", lines.get(2, "")), stderr[-3000:]
