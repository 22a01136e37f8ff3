"""Training state as one value (docs/state.md): every Keras optimizer with one and several
virtual workers, hyperparameters reaching every VW, checkpoints across layouts, re-compile,
and aborted fits.

References are independent of the runtime: synchronous data parallelism with one optimizer
per worker written here, plain Keras, and fresh processes' worth of state rebuilt by hand.
"""

import threading
import time

import keras
import numpy as np
import pytest
import tensorflow as tf

from hetpipe_tf.strategy import HetPipeStrategy, even_plan
from tests.strategy.helpers import (DEVICES, assert_weights_close, regression_data,
                                    skip_model, staleness_reference)

BATCH = 8

OPTIMIZERS = {
    "sgd_momentum": lambda: keras.optimizers.SGD(0.05, momentum=0.9),
    "sgd_nesterov": lambda: keras.optimizers.SGD(0.05, momentum=0.9, nesterov=True),
    "adam": lambda: keras.optimizers.Adam(0.01),
    "adamw": lambda: keras.optimizers.AdamW(0.01, weight_decay=0.05),
    "rmsprop": lambda: keras.optimizers.RMSprop(0.005),
    "adagrad": lambda: keras.optimizers.Adagrad(0.05),
    "nadam": lambda: keras.optimizers.Nadam(0.01),   # state of its own: u_product
    "lamb": lambda: keras.optimizers.Lamb(0.01),     # unknown to optimizers.deserialize
    "adafactor": lambda: keras.optimizers.Adafactor(0.01),   # slots named after variables
    "muon": lambda: keras.optimizers.Muon(0.01),     # reads each variable's Keras path
    "adam_schedule": lambda: keras.optimizers.Adam(
        keras.optimizers.schedules.ExponentialDecay(0.01, decay_steps=2, decay_rate=0.5)),
}


def _batches(x, y):
    return [(x[i:i + BATCH], y[i:i + BATCH]) for i in range(0, len(x), BATCH)]


def _two_vws(n_m=1, d=0, stages=1, make=OPTIMIZERS["adam"], seed=0):
    probe = skip_model(seed)
    plans = [even_plan(probe, DEVICES[w * stages:(w + 1) * stages], n_m=n_m) for w in range(2)]
    strategy = HetPipeStrategy(plan=plans, clock_distance=d,
                               compensation="none")   # the paper's rules: the references
    with strategy.scope():
        model = skip_model(seed)
        model.compile(make(), "mse")
    return strategy, model


def _local_step(probe, copy, optimizer, weights, batch):
    """One step of a worker's own optimizer at `weights` on `batch` (plain Keras): the
    change it makes to the weights."""
    x, y = batch
    probe.set_weights(weights)
    with tf.GradientTape() as tape:
        loss = keras.losses.MeanSquaredError()(y, probe(x, training=True))
    grads = tape.gradient(loss, probe.trainable_variables)
    copy.set_weights(weights)
    optimizer.apply_gradients(zip(grads, copy.trainable_variables))
    return [a - b for a, b in zip(copy.get_weights(), weights)]


def _sync_dp_with_local_optimizers(w0, make, batches, assignment):
    """Synchronous data parallelism, one optimizer per worker: at every step each worker
    applies its own optimizer to its gradient at the common weights w_t, and
    w_{t+1} = w_t + sum of the workers' changes (the paper's pushed u~ with N_m = 1)."""
    probe = skip_model(0)
    copies = [skip_model(0) for _ in assignment]
    opts = [make() for _ in assignment]
    for c, o in zip(copies, opts):
        o.build(c.trainable_variables)
    w = [a.copy() for a in w0]
    for t in range(len(assignment[0])):
        total = [np.zeros_like(a) for a in w]
        for k, steps in enumerate(assignment):
            u = _local_step(probe, copies[k], opts[k], w, batches[steps[t]])
            total = [a + b for a, b in zip(total, u)]
        w = [a + b for a, b in zip(w, total)]
    return w


@pytest.mark.parametrize("name", sorted(OPTIMIZERS))
def test_every_optimizer_with_two_vws_equals_synchronous_data_parallelism(name):
    make = OPTIMIZERS[name]
    x, y = regression_data(64, 1)   # 4 waves: every optimizer's state carried over steps
    strategy, model = _two_vws(make=make)
    w0 = model.get_weights()
    with strategy:
        model.fit(x, y, batch_size=BATCH, epochs=1, shuffle=False, verbose=0)
        coord = strategy.coordinator(model)
        assignment = [list(a) for a in coord.assignment]
        assert [len(a) for a in assignment] == [4, 4]   # lockstep at N_m = 1, D = 0
        ref = _sync_dp_with_local_optimizers(w0, make, _batches(x, y), assignment)
        assert_weights_close(model.get_weights(), ref, atol=2e-5)
        # model.optimizer tells the truth: one iteration per update of any VW.
        assert int(model.optimizer.iterations.numpy()) == 8


@pytest.mark.parametrize("name", ["sgd_momentum", "adam_schedule", "adamw"])
def test_every_optimizer_with_one_pipelined_vw_equals_the_staleness_reference(name):
    make = OPTIMIZERS[name]
    x, y = regression_data(64, 2)
    probe = skip_model(0)
    strategy = HetPipeStrategy(plan=even_plan(probe, DEVICES[:2], n_m=2),
                               compensation="none")   # the paper's rule: the reference
    with strategy.scope():
        model = skip_model(0)
        model.compile(make(), "mse")
    w0 = model.get_weights()
    with strategy:
        model.fit(x, y, batch_size=BATCH, epochs=1, shuffle=False, verbose=0)
    ref, _ = staleness_reference(lambda: skip_model(0), w0, make, _batches(x, y), 2, {1})
    assert_weights_close(model.get_weights(), ref)
    assert int(model.optimizer.iterations.numpy()) == 8


def test_a_learning_rate_callback_reaches_every_vw():
    x, y = regression_data(64, 3)
    strategy, model = _two_vws(n_m=2, d=1, stages=2,
                               make=lambda: keras.optimizers.SGD(0.05, momentum=0.0))
    after_epoch = []
    schedule = keras.callbacks.LearningRateScheduler(lambda epoch, lr: 0.05 if epoch == 0 else 0.0)
    keep = keras.callbacks.LambdaCallback(
        on_epoch_end=lambda e, logs: after_epoch.append(model.get_weights()))
    w0 = model.get_weights()
    with strategy:
        model.fit(x, y, batch_size=BATCH, epochs=2, shuffle=False, verbose=0,
                  callbacks=[schedule, keep])
    moved = max(np.abs(a - b).max() for a, b in zip(after_epoch[0], w0))
    assert moved > 1e-3                                   # epoch 0 trained
    assert_weights_close(after_epoch[1], after_epoch[0], atol=0)   # lr 0 in every VW
    assert float(model.optimizer.learning_rate.numpy()) == 0.0


# --- checkpoints across layouts -------------------------------------------------------------
LAYOUTS = {
    "plain": None,
    "1vw_x4": lambda p: even_plan(p, DEVICES[:4], n_m=2),
    "2vw_x2_d1": lambda p: [even_plan(p, DEVICES[0:2], n_m=2),
                            even_plan(p, DEVICES[2:4], n_m=2)],
    "3vw_x1": lambda p: [even_plan(p, DEVICES[i:i + 1], n_m=2) for i in range(3)],
}


def _model_under(layout, seed=0):
    make = LAYOUTS[layout]
    if make is None:
        model = skip_model(seed)
        model.compile(keras.optimizers.Adam(0.01), "mse")
        return None, model
    strategy = HetPipeStrategy(plan=make(skip_model(seed)),
                               clock_distance=1 if layout.startswith("2vw") else 0)
    with strategy.scope():
        model = skip_model(seed)
        model.compile(keras.optimizers.Adam(0.01), "mse")
    return strategy, model


@pytest.fixture(scope="module")
def checkpoints(tmp_path_factory):
    """One checkpoint written under every layout (weights and optimizer as saved)."""
    x, y = regression_data(48, 4)
    out = {}
    for layout in LAYOUTS:
        strategy, model = _model_under(layout)
        model.fit(x, y, batch_size=BATCH, epochs=1, shuffle=False, verbose=0)
        path = str(tmp_path_factory.mktemp(layout) / "ckpt.weights.h5")
        model.save_weights(path)
        out[layout] = (path, model.get_weights(),
                       [v.numpy() for v in model.optimizer.variables])
        if strategy is not None:
            strategy.close()
    return out


@pytest.mark.parametrize("target", sorted(LAYOUTS))
@pytest.mark.parametrize("source", sorted(LAYOUTS))
def test_a_checkpoint_restores_under_every_layout(checkpoints, source, target):
    path, weights, opt_values = checkpoints[source]
    strategy, model = _model_under(target, seed=7)   # other initial weights
    if strategy is None:   # plain Keras restores optimizer state only into a built optimizer
        model.optimizer.build(model.trainable_variables)
    model.load_weights(path)
    assert_weights_close(model.get_weights(), weights, atol=0)
    restored = [v.numpy() for v in model.optimizer.variables]
    assert len(restored) == len(opt_values)
    for a, b in zip(restored, opt_values):
        np.testing.assert_array_equal(a, b)
    assert int(model.optimizer.iterations.numpy()) == 6   # 48 samples / 8, whatever layout
    if strategy is not None:   # and training continues from it
        x, y = regression_data(16, 5)
        model.fit(x, y, batch_size=BATCH, epochs=1, shuffle=False, verbose=0)
        assert int(model.optimizer.iterations.numpy()) == 8
        strategy.close()


def test_several_vws_restart_from_the_merged_optimizer_state():
    """One becomes several: seeded stage slots equal the model optimizer's (mean of the VWs')."""
    from hetpipe_tf.strategy import training_state
    x, y = regression_data(32, 6)
    strategy, model = _two_vws(n_m=1, d=0)
    with strategy:
        model.fit(x, y, batch_size=BATCH, epochs=1, shuffle=False, verbose=0)
        coord = strategy.coordinator(model)
        clones = [rt.versions.stages[0].optimizer for rt in coord.runtimes]
        merged = [v.numpy() for v in training_state._slots(model.optimizer)]
        per_vw = [[v.numpy() for v in training_state._slots(c)] for c in clones]
        assert len(per_vw[0]) == len(merged) > 0
        for k, m in enumerate(merged):
            np.testing.assert_allclose(m, (per_vw[0][k] + per_vw[1][k]) / 2, rtol=1e-6)
        coord._on_run_start()   # what the next run's start does
        for c in clones:
            for a, b in zip(training_state._slots(c), merged):
                np.testing.assert_array_equal(a.numpy(), b)
            assert int(c.iterations.numpy()) == 2   # 4 updates // 2 VWs


# --- re-compile (fine-tuning) ----------------------------------------------------------------
def _fine_tune(model, x, y):
    model.layers[1].trainable = False   # d1 frozen: train the rest
    model.compile(keras.optimizers.SGD(0.05), "mse")
    model.fit(x, y, batch_size=BATCH, epochs=1, shuffle=False, verbose=0)
    frozen = model.layers[1].get_weights()
    model.layers[1].trainable = True
    model.compile(keras.optimizers.Adam(0.01), "mse")
    model.fit(x, y, batch_size=BATCH, epochs=1, shuffle=False, verbose=0)
    return frozen


def test_fine_tuning_recompile_equals_plain_keras():
    x, y = regression_data(64, 8)
    plain = skip_model(0)
    frozen_plain = _fine_tune(plain, x, y)
    strategy = HetPipeStrategy(plan=even_plan(skip_model(0), DEVICES[:2], n_m=1))
    with strategy.scope():
        model = skip_model(0)
        frozen = _fine_tune(model, x, y)
    w0 = skip_model(0).layers[1].get_weights()
    assert_weights_close(frozen, w0, atol=0)          # frozen in phase 1
    assert_weights_close(frozen, frozen_plain, atol=0)
    assert max(np.abs(a - b).max() for a, b in zip(model.layers[1].get_weights(), w0)) > 1e-4
    assert_weights_close(model.get_weights(), plain.get_weights())
    strategy.close()


# --- aborted fits ---------------------------------------------------------------------------
class _RaiseAt(keras.callbacks.Callback):
    def __init__(self, step, exc):
        super().__init__()
        self.step, self.exc = step, exc

    def on_train_batch_end(self, batch, logs=None):
        if batch == self.step:
            raise self.exc


def _one_vw_adam(weights=None, opt_values=None):
    probe = skip_model(0)
    # The last stage EMULATED 20x slower: minibatches are surely in flight when a
    # callback raises (values are unchanged by emulation).
    strategy = HetPipeStrategy(plan=even_plan(probe, DEVICES[:2], n_m=3,
                                              speed_factors=[1.0, 0.05]))
    with strategy.scope():
        model = skip_model(0)
        model.compile(keras.optimizers.Adam(0.01), "mse")
    if weights is not None:
        model.set_weights(weights)
        with strategy.scope():
            model.optimizer.build(model.trainable_variables)
        for v, a in zip(model.optimizer.variables, opt_values):
            v.assign(a)
    return strategy, model


@pytest.mark.parametrize("exc", [RuntimeError("callback failed"), KeyboardInterrupt()])
def test_an_aborted_fit_applies_nothing_after_it_raised_and_resumes_like_a_fresh_start(exc):
    x, y = regression_data(48, 9)   # 6 minibatches: the raise after the 5th leaves some in flight
    strategy, model = _one_vw_adam()
    with pytest.raises(type(exc)):
        model.fit(x, y, batch_size=BATCH, epochs=1, shuffle=False, verbose=0,
                  callbacks=[_RaiseAt(4, exc)])
    rt = strategy.pipeline(model)
    assert rt.in_flight == 0 and rt.dropped > 0
    state = (model.get_weights(), [v.numpy() for v in model.optimizer.variables])
    time.sleep(0.3)   # nothing is applied after the raise
    assert_weights_close(model.get_weights(), state[0], atol=0)
    assert int(model.optimizer.iterations.numpy()) == rt.completed
    model.fit(x, y, batch_size=BATCH, epochs=1, shuffle=False, verbose=0)
    fresh_strategy, fresh = _one_vw_adam(*state)
    fresh.fit(x, y, batch_size=BATCH, epochs=1, shuffle=False, verbose=0)
    assert_weights_close(model.get_weights(), fresh.get_weights(), atol=1e-6)
    strategy.close()
    fresh_strategy.close()


def test_after_an_abort_with_two_vws_set_weights_reaches_the_next_fit():
    x, y = regression_data(96, 10)
    strategy, model = _two_vws(n_m=2, d=1, stages=2,
                               make=lambda: keras.optimizers.SGD(0.05))
    w0 = model.get_weights()
    with pytest.raises(RuntimeError, match="stop here"):
        model.fit(x, y, batch_size=BATCH, epochs=1, shuffle=False, verbose=0,
                  callbacks=[_RaiseAt(3, RuntimeError("stop here"))])
    coord = strategy.coordinator(model)
    assert all(rt.in_flight == 0 for rt in coord.runtimes)
    applied = sum(rt.completed for rt in coord.runtimes)
    assert int(model.optimizer.iterations.numpy()) == applied
    model.set_weights(w0)
    model.optimizer.learning_rate = 0.0
    model.fit(x, y, batch_size=BATCH, epochs=1, shuffle=False, verbose=0)
    assert_weights_close(model.get_weights(), w0, atol=0)
    strategy.close()


def test_a_stage_error_keeps_its_type_and_names_the_stage_and_vw():
    x, y = regression_data(32, 11)
    strategy, model = _two_vws(n_m=1, d=0, make=lambda: keras.optimizers.SGD(0.05))
    model.fit(x[:16], y[:16], batch_size=BATCH, epochs=1, verbose=0)
    stage = strategy.pipeline(model, 1).stages[0]

    class DeviceLost(Exception):
        pass

    def broken(*args, **kwargs):
        raise DeviceLost("device lost")

    stage.forward_backward = broken   # the stage's task, with its update inside or not
    strategy.pipeline(model, 1).versions.stages[0].apply_in_task = broken
    with pytest.raises(DeviceLost) as info:
        model.fit(x, y, batch_size=BATCH, epochs=1, verbose=0)
    notes = " ".join(getattr(info.value, "__notes__", []))
    assert "stage 0" in notes and "virtual worker 1" in notes and "CPU:1" in notes
    strategy.close()


def test_close_joins_every_thread():
    x, y = regression_data(32, 12)
    before = set(threading.enumerate())
    strategy, model = _two_vws(n_m=2, d=0, stages=2)
    model.fit(x, y, batch_size=BATCH, epochs=1, verbose=0)
    started = [t for t in threading.enumerate()
               if t not in before and t.name.startswith("hetpipe-")]
    assert len(started) >= 2 * 3 + 2   # 2 VWs x (2 stages + updater) + 2 feeders
    strategy.close()
    assert not [t for t in started if t.is_alive()]


@pytest.mark.parametrize("vws", [1, 2])
def test_each_stage_applies_its_own_update_on_its_own_thread_and_device(vws):
    x, y = regression_data(48, 13)
    probe = skip_model(0)
    plans = [even_plan(probe, DEVICES[2 * w:2 * w + 2], n_m=2) for w in range(vws)]
    strategy = HetPipeStrategy(plan=plans if vws > 1 else plans[0], clock_distance=1)
    with strategy.scope():
        model = skip_model(0)
        model.compile(keras.optimizers.Adam(0.01), "mse")
    model.fit(x[:16], y[:16], batch_size=BATCH, epochs=1, verbose=0)   # builds the runtime
    seen = {}
    for w in range(vws):
        for j, sw in enumerate(strategy.pipeline(model, w).versions.stages):
            original = sw.apply

            def apply(q, grads, deltas, _orig=original, _key=(w, j)):
                seen.setdefault(_key, set()).add(threading.current_thread().name)
                return _orig(q, grads, deltas)

            sw.apply = apply
    with strategy:
        model.fit(x, y, batch_size=BATCH, epochs=1, verbose=0)
        for w in range(vws):
            rt = strategy.pipeline(model, w)
            for j, (stage, sw) in enumerate(zip(rt.stages, rt.versions.stages)):
                assert seen[(w, j)] == {f"hetpipe-vw{w}-stage-{j}"}
                slots = [v for v in sw.optimizer.variables
                         if v is not sw.optimizer.iterations and "learning_rate" not in v.name]
                assert slots and {_short(s.value.device) for s in slots} == {_short(stage.device)}
            # Every stage of a VW counted the same minibatches.
            assert len({int(sw.optimizer.iterations.numpy()) for sw in rt.versions.stages}) == 1
    assert int(model.optimizer.iterations.numpy()) == 8   # 16/8 + 48/8 minibatches in all


def _short(device: str) -> str:
    return device.rsplit("device:", 1)[-1]


def test_a_later_fit_with_a_larger_batch_size_is_refused_before_training():
    x, y = regression_data(64, 14)
    strategy = HetPipeStrategy(plan=even_plan(skip_model(0), DEVICES[:2], n_m=2))
    with strategy.scope():
        model = skip_model(0)
        model.compile(keras.optimizers.SGD(0.05), "mse")
    with strategy:
        model.fit(x, y, batch_size=BATCH, epochs=1, verbose=0)
        before = model.get_weights()
        with pytest.raises(ValueError, match=r"larger than .*Received: batch size 16, planned "
                                             r"for 8"):
            model.fit(x, y, batch_size=16, epochs=1, verbose=0)
        assert_weights_close(model.get_weights(), before, atol=0)
        model.fit(x, y, batch_size=BATCH // 2, epochs=1, verbose=0)   # smaller ones train
        model.fit(x, y, batch_size=BATCH, epochs=1, verbose=0)   # the planned size still trains


def test_adam_under_wsp_equals_the_reference_rebuilt_from_records():
    """2 VWs x 2 stages, N_m = 2, D = 1, Adam: every minibatch's weights are rebuilt from the
    records (w_0 + the other VW's waves it saw + its own updates 1..p-N_m), its update is
    one step of that VW's own Adam (state in minibatch order) on plain Keras, and w_global
    must equal w_0 + every update. Exercises the stages' own updates and the pull's rebase
    of updates a stage applied before its VW's wave hook ran."""
    n_m, d, lr = 2, 1, 0.01
    x, y = regression_data(96, 15)
    strategy, model = _two_vws(n_m=n_m, d=d, stages=2, make=lambda: keras.optimizers.Adam(lr))
    w0 = model.get_weights()
    batches = _batches(x, y)
    with strategy:
        model.fit(x, y, batch_size=BATCH, epochs=1, shuffle=False, verbose=0)
        coord = strategy.coordinator(model)
        assignment = [list(a) for a in coord.assignment]
        local = [dict(strategy.pipeline(model, v).record) for v in range(2)]
        vectors = [dict(coord.syncs[v].record) for v in range(2)]
    probe, copies = skip_model(0), [skip_model(0) for _ in range(2)]
    opts = [keras.optimizers.Adam(lr) for _ in range(2)]
    for c, o in zip(copies, opts):
        o.build(c.trainable_variables)
    updates, done = {}, [0, 0]

    def wave_sum(u, w):
        total = [np.zeros_like(a) for a in w0]
        for k in range(w * n_m + 1, min((w + 1) * n_m, len(assignment[u])) + 1):
            total = [a + b for a, b in zip(total, update(u, k))]
        return total

    def update(v, p):
        while done[v] < p:   # each VW's Adam state advances in its own minibatch order
            q = done[v] + 1
            w = [a.copy() for a in w0]
            for other, waves in enumerate(vectors[v][q]):
                if other != v:
                    for wave in range(waves):
                        w = [a + b for a, b in zip(w, wave_sum(other, wave))]
            for k in local[v][q]:
                w = [a + b for a, b in zip(w, update(v, k))]
            updates[(v, q)] = _local_step(probe, copies[v], opts[v], w,
                                          batches[assignment[v][q - 1]])
            done[v] = q
        return updates[(v, p)]

    final = [a.copy() for a in w0]
    for v in range(2):
        for p in range(1, len(assignment[v]) + 1):
            final = [a + b for a, b in zip(final, update(v, p))]
    assert sum(len(a) for a in assignment) == len(batches)
    assert_weights_close(model.get_weights(), final, atol=2e-5)


def test_the_merge_is_the_exact_mean_of_three_vws():
    """Several become one bit for bit as eager `add_n(slots) / n` gives it: the compiled
    merge divides, it does not multiply by a rounded reciprocal."""
    from hetpipe_tf.strategy import training_state
    x, y = regression_data(48, 7)
    probe = skip_model(0)
    plans = [even_plan(probe, DEVICES[w:w + 1], n_m=1) for w in range(3)]
    strategy = HetPipeStrategy(plan=plans, clock_distance=0, compensation="none")
    with strategy.scope():
        model = skip_model(0)
        model.compile(OPTIMIZERS["adam"](), "mse")
    with strategy:
        model.fit(x, y, batch_size=BATCH, epochs=1, shuffle=False, verbose=0)
        coord = strategy.coordinator(model)
        clones = [rt.versions.stages[0].optimizer for rt in coord.runtimes]
        merged = [v.numpy() for v in training_state._slots(model.optimizer)]
        per_vw = [[tf.constant(v.numpy()) for v in training_state._slots(c)] for c in clones]
        assert len(merged) > 0
        for k, m in enumerate(merged):
            np.testing.assert_array_equal(m, (tf.add_n([p[k] for p in per_vw]) / 3).numpy())
