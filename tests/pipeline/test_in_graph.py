"""The in-graph runtime (one VW of one stage at N_m = 1 inside Keras' train step): the
same training as plain Keras and as the threaded runtime, its records, runs, interrupts,
re-compiles and a closed strategy."""

import contextlib
import threading
import types

import keras
import numpy as np
import pytest

from hetpipe_tf.pipeline.in_graph import InGraphRuntime, runs_in_graph
from hetpipe_tf.pipeline.runtime import PipelineError, PipelineRuntime
from hetpipe_tf.strategy import HetPipeStrategy, even_plan
from tests.strategy.helpers import DEVICES, assert_weights_close, regression_data

BATCH = 8


def _model(seed: int = 0) -> keras.Model:
    """Dense layers with BatchNorm (versioned state), Dropout (seed state) and an L2
    regulariser (an extra loss)."""
    init = lambda s: keras.initializers.GlorotUniform(seed=seed + s)  # noqa: E731
    inp = keras.Input((8,), name="x")
    h = keras.layers.Dense(16, activation="relu", kernel_initializer=init(1),
                           kernel_regularizer=keras.regularizers.L2(1e-3), name="d1")(inp)
    h = keras.layers.BatchNormalization(name="bn")(h)
    h = keras.layers.Dropout(0.2, seed=seed, name="drop")(h)
    out = keras.layers.Dense(1, kernel_initializer=init(2), name="out")(h)
    return keras.Model(inp, out, name="net")


def _compile(model, opt, steps_per_execution=1):
    model.compile(opt, "mse", metrics=["mae"], steps_per_execution=steps_per_execution)


def _strategy(**kwargs) -> HetPipeStrategy:
    return HetPipeStrategy(plan=even_plan(_model(), DEVICES[:1], n_m=1), **kwargs)


def _fit_pipelined(make_opt, epochs=2, steps_per_execution=1, **kwargs):
    x, y = regression_data(64, 1)
    keras.utils.set_random_seed(3)
    strategy = _strategy(**kwargs)
    with strategy.scope():
        model = _model()
        _compile(model, make_opt(), steps_per_execution)
    hist = model.fit(x, y, batch_size=BATCH, epochs=epochs, shuffle=False, verbose=0)
    return strategy, model, hist


def _fit_plain(make_opt, epochs=2, steps_per_execution=1):
    x, y = regression_data(64, 1)
    keras.utils.set_random_seed(3)
    model = _model()
    _compile(model, make_opt(), steps_per_execution)
    hist = model.fit(x, y, batch_size=BATCH, epochs=epochs, shuffle=False, verbose=0)
    return model, hist


OPTIMIZERS = {"sgd_momentum": lambda: keras.optimizers.SGD(0.05, momentum=0.9),
              "adam": lambda: keras.optimizers.Adam(0.01),
              "nadam": lambda: keras.optimizers.Nadam(0.01)}


@pytest.mark.parametrize("steps_per_execution", [1, 3])
@pytest.mark.parametrize("opt", sorted(OPTIMIZERS))
def test_transparency_equals_plain_keras_and_the_threaded_runtime(opt, steps_per_execution):
    make = OPTIMIZERS[opt]
    plain, plain_hist = _fit_plain(make, steps_per_execution=steps_per_execution)
    results = {}
    for in_graph in (True, False):
        strategy, model, hist = _fit_pipelined(make, steps_per_execution=steps_per_execution,
                                               in_graph=in_graph)
        kind = InGraphRuntime if in_graph else PipelineRuntime
        assert isinstance(strategy.pipeline(model), kind)
        results[in_graph] = model, hist
        strategy.close()
    for model, hist in results.values():
        assert_weights_close(model.get_weights(), plain.get_weights())
        for key in ("loss", "mae"):
            np.testing.assert_allclose(hist.history[key], plain_hist.history[key], rtol=1e-5)
        # The model's optimizer holds the state after fit, as plain Keras' does.
        for a, b in zip(model.optimizer.variables, plain.optimizer.variables):
            np.testing.assert_allclose(a.numpy(), b.numpy(), rtol=1e-5, atol=1e-7)


def test_no_thread_and_the_records_of_each_call():
    before = {t.name for t in threading.enumerate()}
    strategy, model, _ = _fit_pipelined(OPTIMIZERS["adam"])
    runtime = strategy.pipeline(model)
    assert runtime.thread_ids == set()
    started = {t.name for t in threading.enumerate()} - before
    assert not [n for n in started if n.startswith("hetpipe")], started
    steps = 64 // BATCH
    assert runtime.run_starts == [1, 1 + steps]          # a run an epoch, as threaded
    assert runtime.completed == runtime.submitted == 2 * steps
    assert runtime.in_flight == 0 and len(runtime.update_s) == 0
    assert list(runtime.record) == list(range(1, 2 * steps + 1))
    assert all(runtime.record[p] == tuple(range(1, p)) for p in runtime.record)
    assert [e.task.minibatch for e in runtime.trace] == list(range(1, 2 * steps + 1))
    assert {(e.task.stage, e.task.kind.name) for e in runtime.trace} == {
        (0, "FORWARD_BACKWARD")}
    assert all(e.end > e.start for e in runtime.trace)
    assert list(runtime.completions) == list(range(1, 2 * steps + 1))
    strategy.close()


def test_several_steps_a_call_count_minibatches_without_a_trace():
    strategy, model, _ = _fit_pipelined(OPTIMIZERS["adam"], steps_per_execution=3)
    runtime = strategy.pipeline(model)
    assert runtime.completed == 2 * 64 // BATCH == int(model.optimizer.iterations.numpy())
    assert len(runtime.trace) == 0
    strategy.close()


class _Interrupt(keras.callbacks.Callback):
    def on_train_batch_end(self, batch, logs=None):
        if batch == 2:
            raise KeyboardInterrupt


def test_an_interrupt_leaves_exactly_the_minibatches_done_and_fit_resumes():
    x, y = regression_data(64, 1)
    keras.utils.set_random_seed(3)
    strategy = _strategy()
    with strategy.scope():
        model = _model()
        _compile(model, OPTIMIZERS["adam"]())
    with pytest.raises(KeyboardInterrupt):
        model.fit(x, y, batch_size=BATCH, epochs=1, shuffle=False, verbose=0,
                  callbacks=[_Interrupt()])
    assert int(model.optimizer.iterations.numpy()) == 3
    keras.utils.set_random_seed(3)
    plain = _model()
    _compile(plain, OPTIMIZERS["adam"]())
    plain.fit(x[:3 * BATCH], y[:3 * BATCH], batch_size=BATCH, epochs=1, shuffle=False,
              verbose=0)
    assert_weights_close(model.get_weights(), plain.get_weights())
    for a, b in zip(model.optimizer.variables, plain.optimizer.variables):
        np.testing.assert_allclose(a.numpy(), b.numpy(), rtol=1e-5, atol=1e-7)
    model.fit(x, y, batch_size=BATCH, epochs=1, shuffle=False, verbose=0)   # resumes
    assert int(model.optimizer.iterations.numpy()) == 3 + 64 // BATCH
    strategy.close()


def test_a_recompile_trains_on_with_the_new_optimizer():
    x, y = regression_data(64, 1)
    trained = []
    for pipelined in (True, False):
        keras.utils.set_random_seed(3)
        strategy = _strategy() if pipelined else None
        scope = strategy.scope if pipelined else contextlib.nullcontext
        with scope():
            model = _model()
            _compile(model, OPTIMIZERS["adam"]())
        model.fit(x, y, batch_size=BATCH, epochs=1, shuffle=False, verbose=0)
        first = strategy.pipeline(model) if pipelined else None
        with scope():
            _compile(model, keras.optimizers.SGD(0.01))
        model.fit(x, y, batch_size=BATCH, epochs=1, shuffle=False, verbose=0)
        if pipelined:
            assert strategy.pipeline(model) is not first
            assert isinstance(strategy.pipeline(model), InGraphRuntime)
            strategy.close()
        trained.append(model.get_weights())
    assert_weights_close(*trained)


def test_a_closed_strategy_refuses_to_train_until_a_recompile():
    """Both runtimes: fit after close() is refused by name before any step, the weights
    untouched; compile() again in the scope trains on."""
    x, y = regression_data(16, 1)
    for in_graph in (True, False):
        strategy, model, _ = _fit_pipelined(OPTIMIZERS["adam"], epochs=1, in_graph=in_graph)
        strategy.close()
        weights = model.get_weights()
        with pytest.raises(PipelineError, match="was closed.*compile"):
            model.fit(x, y, batch_size=BATCH, epochs=1, verbose=0)
        assert_weights_close(model.get_weights(), weights)
        with strategy.scope():
            _compile(model, OPTIMIZERS["adam"]())
        model.fit(x, y, batch_size=BATCH, epochs=1, verbose=0)
        assert not strategy.pipeline(model).closed
        strategy.close()


def test_compiled_outside_the_scope_keeps_the_optimizer_state_across_fits():
    """Model and optimizer made in the scope, compile() outside it: the strategy first sees
    the model while tracing, after Keras built its train function; runs still open and
    merge per epoch (a second fit equals plain Keras, momentum included)."""
    x, y = regression_data(64, 1)
    make = OPTIMIZERS["sgd_momentum"]
    keras.utils.set_random_seed(3)
    strategy = _strategy()
    with strategy.scope():
        model = _model()
        opt = make()
    _compile(model, opt)
    keras.utils.set_random_seed(3)
    plain = _model()
    _compile(plain, make())
    for m in (model, plain):
        m.fit(x, y, batch_size=BATCH, epochs=2, shuffle=False, verbose=0)
    assert strategy.pipeline(model).run_starts == [1, 9]
    for a, b in zip(model.optimizer.variables, plain.optimizer.variables):
        np.testing.assert_allclose(a.numpy(), b.numpy(), rtol=1e-5, atol=1e-7)
    for m in (model, plain):
        m.fit(x, y, batch_size=BATCH, epochs=1, shuffle=False, verbose=0)
    assert_weights_close(model.get_weights(), plain.get_weights())
    strategy.close()


def test_a_closed_strategy_refuses_also_after_trainable_flags_change():
    """Changing trainable flags without compile() keeps Keras' traced step: it must not
    train on the closed runtime."""
    x, y = regression_data(16, 1)
    strategy, model, _ = _fit_pipelined(OPTIMIZERS["adam"], epochs=1)
    strategy.close()
    model.get_layer("d1").trainable = False
    weights = model.get_weights()
    with pytest.raises(PipelineError, match="closed"):
        model.fit(x, y, batch_size=BATCH, epochs=1, verbose=0)
    assert_weights_close(model.get_weights(), weights)


def test_which_layouts_run_in_graph():
    stage = lambda f=1.0: types.SimpleNamespace(emulated_speed_factor=f)  # noqa: E731
    assert runs_in_graph([stage()], 1)
    assert not runs_in_graph([stage()], 2)               # a minibatch overlaps its update
    assert not runs_in_graph([stage(), stage()], 1)      # two stages overlap
    assert not runs_in_graph([stage(0.5)], 1)            # emulation sleeps in Python
    with pytest.raises(ValueError, match="in_graph must be True or False"):
        HetPipeStrategy(plan=even_plan(_model(), DEVICES[:1], n_m=1), in_graph="yes")


class _LoadAt(keras.callbacks.Callback):
    def __init__(self, batch, path):
        super().__init__()
        self.batch, self.path = batch, path

    def on_train_batch_end(self, batch, logs=None):
        if batch == self.batch:
            self.model.load_weights(self.path)


@pytest.mark.parametrize("layout", ["in_graph", "threaded", "two_stages"])
def test_load_weights_in_a_callback_mid_run_is_plain_keras(layout, tmp_path):
    """A callback that loads saved weights (weights and optimizer state, a .keras file's
    variables through load_weights) mid-epoch: training goes on from them, as in plain
    Keras; the run before is ended first, so nothing merges over what was loaded."""
    x, y = regression_data(64, 1)
    make = OPTIMIZERS["adam"]
    results = []
    for pipelined in (True, False):
        keras.utils.set_random_seed(3)
        if pipelined:
            devices = DEVICES[:2] if layout == "two_stages" else DEVICES[:1]
            strategy = HetPipeStrategy(plan=even_plan(_model(), devices, n_m=1),
                                       in_graph=layout == "in_graph")
            scope = strategy.scope
        else:
            scope = contextlib.nullcontext
        with scope():
            model = _model()
            _compile(model, make())
        model.fit(x[:16], y[:16], batch_size=BATCH, epochs=1, shuffle=False, verbose=0)
        path = str(tmp_path / f"saved_{pipelined}.keras")
        model.save(path)                               # weights and optimizer state
        model.fit(x, y, batch_size=BATCH, epochs=1, shuffle=False, verbose=0,
                  callbacks=[_LoadAt(3, path)])
        results.append((model.get_weights(), [v.numpy() for v in model.optimizer.variables],
                        int(model.optimizer.iterations.numpy())))
        if pipelined:
            strategy.close()
    (w_a, o_a, it_a), (w_b, o_b, it_b) = results
    assert it_a == it_b == 2 + 4     # saved at 2; loaded (back to 2) after 4 more; 4 more
    assert_weights_close(w_a, w_b)
    for a, b in zip(o_a, o_b):
        np.testing.assert_allclose(a, b, rtol=1e-5, atol=1e-7)
