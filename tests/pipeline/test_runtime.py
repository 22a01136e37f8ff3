"""The threaded runtime's admission: with N_m minibatches in flight `submit` still returns
at once (the next minibatch waits in a one-place waiting room and starts when p - N_m
completes), and only the submit after it blocks."""

import threading

import tensorflow as tf

from tests.strategy.helpers import regression_data, threaded_one_stage


def test_submit_returns_with_n_m_in_flight_and_the_next_one_waits():
    x, y = regression_data(32, 2)
    strategy, model, runtime = threaded_one_stage(x, y, warmup_rows=8)
    done_before = runtime.completed
    gate = threading.Event()
    apply = runtime.versions.apply

    def held_apply(j, q, grads, deltas):
        gate.wait(30)        # the first update waits for the test
        return apply(j, q, grads, deltas)

    runtime.versions.apply = held_apply

    def batch(i):
        return ([tf.constant(x[8 * i:8 * i + 8])], tf.constant(y[8 * i:8 * i + 8]), None)

    try:
        runtime.submit(*batch(0))       # in flight
        runtime.submit(*batch(1))       # N_m = 1 in flight: waits, but submit returns
        assert runtime.in_flight == 2
        third = threading.Thread(target=runtime.submit, args=batch(2))
        third.start()
        third.join(0.5)
        assert third.is_alive()         # one waiting already: this submit blocks
        assert runtime.completed == done_before
        gate.set()
        third.join(30)
        assert not third.is_alive()
        runtime.drain()
    finally:
        gate.set()
        runtime.versions.apply = apply
    first = done_before + 1
    assert runtime.completed == first + 2
    # Every minibatch started after the one before it was applied (N_m = 1).
    for p in (first, first + 1, first + 2):
        assert runtime.record[p] == tuple(range(1, p))
    starts = {e.task.minibatch: e.start for e in runtime.trace}
    assert starts[first] < starts[first + 1] < starts[first + 2]
    strategy.close()


def test_several_vws_add_the_last_stages_loss_and_extra_on_that_stages_device():
    """With several VWs the last stage's total loss (its loss + the earlier stages' added
    losses) is made on that stage's device, never on the caller's default device: in a
    cluster job that default is the chief, whose kernel waiting for a frozen task's loss
    held one of its few inter-op threads for good and starved every other VW
    (docs/cluster_jobs.md "Going on without a lost VW" 6)."""
    import keras

    from hetpipe_tf.strategy import HetPipeStrategy, even_plan
    from tests.strategy.helpers import DEVICES, skip_model

    x, y = regression_data(32, 3)
    probe = skip_model(0)
    # VW 0 on CPU:1 + CPU:2, VW 1 on CPU:3 + CPU:1: no last stage on the default CPU:0.
    plans = [even_plan(probe, [DEVICES[1], DEVICES[2]], n_m=1),
             even_plan(probe, [DEVICES[3], DEVICES[1]], n_m=1)]
    strategy = HetPipeStrategy(plan=plans, clock_distance=0)
    with strategy.scope():
        model = skip_model(0)
        model.compile(keras.optimizers.SGD(0.01), "mse")
    model.fit(x[:16], y[:16], batch_size=8, epochs=1, verbose=0)   # builds the runtimes
    seen = []
    coord = strategy.coordinator(model)
    originals = [rt._update_metrics for rt in coord.runtimes]
    for rt, update in zip(coord.runtimes, originals):

        def recording(total, y_, y_pred, sw, update=update, last=rt.stages[-1].device):
            seen.append((total.device, last))
            return update(total, y_, y_pred, sw)

        rt._update_metrics = recording
    try:
        model.fit(x, y, batch_size=8, epochs=1, verbose=0)
    finally:
        for rt, update in zip(coord.runtimes, originals):
            rt._update_metrics = update
    assert len(seen) == 4 and all(not rt._fuse_metrics for rt in coord.runtimes), seen
    for device, last in seen:
        assert tf.DeviceSpec.from_string(device) == tf.DeviceSpec.from_string(last), seen
    strategy.close()


def _two_one_stage_vws(n_m: int, optimizer, steps: int, metrics=()):
    """(strategy, model, VW 0's runtime, x, y) of 2 one-stage VWs after a fit of 2
    minibatches that built the runtimes; x, y hold `steps` minibatches of 8."""
    from hetpipe_tf.strategy import HetPipeStrategy, even_plan
    from tests.strategy.helpers import DEVICES, skip_model

    x, y = regression_data(8 * steps, 5)
    probe = skip_model(0)
    plans = [even_plan(probe, [DEVICES[1]], n_m=n_m), even_plan(probe, [DEVICES[2]], n_m=n_m)]
    strategy = HetPipeStrategy(plan=plans, clock_distance=1, compensation="none")
    with strategy.scope():
        model = skip_model(0)
        model.compile(optimizer(), "mse", metrics=list(metrics))
    model.fit(x[:16], y[:16], batch_size=8, epochs=1, verbose=0)
    return strategy, model, strategy.coordinator(model).runtimes[0], x, y


def _apply_paths(n_m: int, optimizer, steps: int = 4) -> list[tuple[list, list]]:
    """[(losses, final w_local and optimizer state)] of VW 0's only stage over `steps`
    minibatches from the same state, its update a call of its own (`forward_backward`
    then `apply`) and inside the task's call (`StageWeights.apply_in_task`)."""
    strategy, model, rt, x, y = _two_one_stage_vws(n_m, optimizer, steps)
    stage, weights = rt.stages[0], rt.versions.stages[0]
    assert rt._applies_in_task(type("Mb", (), {"loss_scale": None})())
    state = [*weights.variables, *weights.optimizer.variables, model.optimizer.iterations]
    start = [v.numpy() for v in state]
    first = weights.applied
    out = []
    for fused in (False, True):
        for v, value in zip(state, start):
            v.assign(value)
        weights.start_run(first + 1, first)
        losses = []
        for k in range(steps):
            p = first + k + 1
            _, t, n = weights.take(p)
            inputs = stage.program.model_inputs(tf.constant(x[8 * k:8 * k + 8]))
            yb = tf.constant(y[8 * k:8 * k + 8])
            if fused:
                loss, _ = weights.apply_in_task(p, stage, t, n, inputs, yb, None)
                del t, n
                losses.append(loss.numpy())
            else:
                wg, _, loss, _, deltas, _ = stage.forward_backward(t, n, inputs, yb, None)
                del t, n
                weights.apply(p, wg, deltas)
                losses.append(loss.numpy())
        out.append((losses, [v.numpy() for v in state]))
    strategy.close()
    return out


import pytest  # noqa: E402


@pytest.mark.parametrize("n_m,opt", [(1, "adam"), (2, "sgd"), (2, "adam")])
def test_the_only_stages_update_inside_its_task_is_the_separate_update_bit_for_bit(n_m, opt):
    """With several VWs a one-stage VW applies u_p inside its task's compiled call
    (`StageWeights.apply_in_task`, one remote call a minibatch less in a cluster job):
    the losses, w_local and the optimizer's state equal those of the task and the update
    as two calls, bit for bit."""
    import keras
    import numpy as np

    make = {"sgd": lambda: keras.optimizers.SGD(0.05, momentum=0.9),
            "adam": lambda: keras.optimizers.Adam(0.01)}[opt]
    (losses_a, state_a), (losses_b, state_b) = _apply_paths(n_m, make)
    assert losses_a == losses_b
    assert len(state_a) == len(state_b) > 0
    for a, b in zip(state_a, state_b):
        np.testing.assert_array_equal(a, b)


def test_the_task_and_update_call_hands_the_metrics_y_pred_with_its_keras_mask():
    """y_pred's Keras masks do not cross a compiled call's boundary: `apply_in_task` attaches
    them again, so that the metrics weigh masked steps out as after `forward_backward`."""
    import keras
    import numpy as np

    from hetpipe_tf._shim import keras_graph
    from hetpipe_tf.strategy import HetPipeStrategy, even_plan
    from tests.strategy.helpers import DEVICES
    from tests.strategy.test_masks import _tokens, tagger

    x, y = _tokens()
    strategy = HetPipeStrategy(plan=lambda m: [even_plan(m, [d], n_m=1) for d in DEVICES[1:3]],
                               clock_distance=1, compensation="none")
    with strategy.scope():
        model = tagger()
        model.compile(keras.optimizers.SGD(0.1), "sparse_categorical_crossentropy")
    model.fit(x[:32], y[:32], batch_size=16, epochs=1, verbose=0)   # builds the runtimes
    rt = strategy.coordinator(model).runtimes[0]
    stage, weights = rt.stages[0], rt.versions.stages[0]
    first = weights.applied
    weights.start_run(first + 1, first)
    _, t, n = weights.take(first + 1)
    inputs = stage.program.model_inputs(tf.constant(x[:16]))
    _, _, _, outputs, _, _ = stage.forward_backward(t, n, inputs, tf.constant(y[:16]), None)
    want = keras_graph.keras_mask(stage.program.pack_outputs(outputs))
    _, y_pred = weights.apply_in_task(first + 1, stage, t, n, inputs, tf.constant(y[:16]),
                                      None)
    got = keras_graph.keras_mask(y_pred)
    assert want is not None and got is not None
    np.testing.assert_array_equal(got.numpy(), want.numpy())
    strategy.close()


def _one_call_paths(n_m: int, optimizer, steps: int) -> list[tuple[list, list]]:
    """[(metric state after each call, w_local, optimizer and metric state, each version
    taken)] of VW 0's only stage over `steps` minibatches from the same state (its metrics
    state per VW): one `apply_in_task` call per minibatch, then the minibatches of each wave
    of N_m in one call (its `more`)."""
    strategy, model, rt, x, y = _two_one_stage_vws(n_m, optimizer, steps, metrics=["mae"])
    assert rt._per_vw_metrics
    stage, weights = rt.stages[0], rt.versions.stages[0]
    _, _, copy = rt._vw_metrics.begin(0)
    state = [*weights.variables, *weights.optimizer.variables, model.optimizer.iterations,
             *copy.variables]
    start = [v.numpy() for v in state]
    first = weights.applied
    out = []
    for per_call in (1, n_m):
        for v, value in zip(state, start):
            v.assign(value)
        weights.start_run(first + 1, first)
        states, versions = [], []
        for k in range(0, steps, per_call):
            batch = []
            for i in range(k, k + per_call):
                _, t, n = weights.take(first + i + 1)
                versions.append([a.numpy() for a in (*t, *n)])
                batch.append((t, n, stage.program.model_inputs(tf.constant(x[8 * i:8 * i + 8])),
                              tf.constant(y[8 * i:8 * i + 8]), None))
            (t, n, inputs, yb, _), more = batch[0], batch[1:]
            states.append(weights.apply_in_task(first + k + 1, stage, t, n, inputs, yb, None,
                                                metrics=copy, reset=tf.constant(k == 0),
                                                more=more).numpy())
            del batch, more, t, n
        assert weights.applied == first + steps
        out.append((states, [v.numpy() for v in state], versions))
    strategy.close()
    return out


@pytest.mark.parametrize("n_m,opt", [(2, "sgd"), (4, "adam")])
def test_a_waves_minibatches_in_one_call_equal_one_call_each_bit_for_bit(n_m, opt):
    """A one-stage VW with its own metric state runs the minibatches queued behind p in p's
    call (`apply_in_task`'s `more`): every version the minibatches read, w_local, the
    optimizer's and the metric state equal those of one call per minibatch, bit for bit."""
    import keras
    import numpy as np

    make = {"sgd": lambda: keras.optimizers.SGD(0.05, momentum=0.9),
            "adam": lambda: keras.optimizers.Adam(0.01)}[opt]
    steps = 3 * n_m
    (states_a, final_a, versions_a), (states_b, final_b, versions_b) = _one_call_paths(
        n_m, make, steps)
    assert len(states_a) == steps and len(states_b) == 3
    for a, b in zip(states_a[n_m - 1::n_m], states_b):   # the state after each wave
        np.testing.assert_array_equal(a, b)
    assert states_b[-1][-1] > 0   # the metrics counted something
    assert len(final_a) == len(final_b) > 0 and len(versions_a) == len(versions_b) == steps
    for a, b in zip(final_a + sum(versions_a, []), final_b + sum(versions_b, [])):
        np.testing.assert_array_equal(a, b)
    # Minibatches of the second wave on read the updates of the first: not all equal.
    assert not np.array_equal(versions_a[0][0], versions_a[-1][0])
