"""Shared helpers of the strategy tests: small models, data, and an independent reference
of HetPipe's local staleness rule written with plain Keras/TF (not the runtime)."""

from __future__ import annotations

import numpy as np
import keras
import tensorflow as tf

from hetpipe_tf.models import skip_net

DEVICES = ["/job:localhost/replica:0/task:0/device:CPU:%d" % i for i in range(4)]


def skip_model(seed: int = 0, name: str = "skipnet") -> keras.Model:
    """Functional model whose skip connection crosses stage boundaries (5 nodes)."""
    return skip_net(seed, name)


def nested_model(seed: int = 0, name: str = "nested") -> keras.Model:
    """A Functional backbone nested two levels deep in a Functional model (10 nodes once
    inlined): two residual blocks (Functional) around a Sequential; the backbone also
    returns its input and the head reads the outer input, so skips cross the nesting."""
    init = lambda s: keras.initializers.GlorotUniform(seed=seed + s)  # noqa: E731

    def block(tag: str, s: int) -> keras.Model:
        i = keras.Input((8,))
        h = keras.layers.Dense(8, activation="tanh", kernel_initializer=init(s),
                               name=f"{tag}_a")(i)
        h = keras.layers.Dense(8, kernel_initializer=init(s + 1), name=f"{tag}_b")(h)
        return keras.Model(i, keras.layers.Add(name=f"{tag}_add")([i, h]), name=tag)

    i = keras.Input((8,))
    h = block("blk1", 1)(i)
    h = keras.Sequential([keras.layers.Dense(8, activation="tanh", kernel_initializer=init(3),
                                             name="s1"),
                          keras.layers.Dense(8, kernel_initializer=init(4), name="s2")],
                         name="seq")(h)
    backbone = keras.Model(i, [block("blk2", 5)(h), i], name="backbone")
    x = keras.Input((8,), name="x")
    a, b = backbone(x)
    cat = keras.layers.Concatenate(name="cat")([a, b, x])
    out = keras.layers.Dense(1, kernel_initializer=init(7), name="head")(cat)
    return keras.Model(x, out, name=name)


def tied_model(seed: int = 0) -> keras.Model:
    """Input and output projections tied (one Dense called twice), a middle layer between
    (4 nodes: tied, mid, tied@1, out)."""
    init = lambda s: keras.initializers.GlorotUniform(seed=seed + s)  # noqa: E731
    x = keras.Input((8,))
    tied = keras.layers.Dense(8, activation="tanh", kernel_initializer=init(1), name="tied")
    h = keras.layers.Dense(8, activation="tanh", kernel_initializer=init(2), name="mid")(tied(x))
    h = tied(h)
    return keras.Model(x, keras.layers.Dense(1, kernel_initializer=init(3), name="out")(h))


def regression_data(n: int = 64, seed: int = 0):
    rs = np.random.RandomState(seed)
    x = rs.randn(n, 8).astype("float32")
    y = (np.sin(x[:, :1]) + 0.5 * x[:, 1:2] * x[:, 2:3]).astype("float32")
    return x, y


def staleness_reference(build, weights0, make_optimizer, batches, n_m: int, runs):
    """Weights after training with HetPipe's local staleness, computed independently.

    `batches`: list of (x, y); `runs`: first minibatch id (1-based) of every run (a run
    restarts the window: its first N_m minibatches use the weights at its start).
    Minibatch p's gradient is computed at the weights reflecting exactly updates
    1..p-N_m (or everything before its run), and applied in minibatch order.
    Returns (final weights, {p: last update id reflected}).
    """
    live = build()
    live.set_weights(weights0)
    probe = build()
    opt = make_optimizer()
    opt.build(live.trainable_variables)
    loss_fn = keras.losses.MeanSquaredError()
    snapshots, record, base, run_start = {}, {}, None, None
    for p, (x, y) in enumerate(batches, start=1):
        if p in runs:
            run_start, base = p, ([w.copy() for w in live.get_weights()], p - 1)
            snapshots = {}
        if p < run_start + n_m:
            weights, last = base
        else:
            weights, last = snapshots.pop(p)
        record[p] = last
        probe.set_weights(weights)
        with tf.GradientTape() as tape:
            loss = loss_fn(y, probe(x, training=True))
        grads = tape.gradient(loss, probe.trainable_variables)
        opt.apply_gradients(zip(grads, live.trainable_variables))
        snapshots[p + n_m] = ([w.copy() for w in live.get_weights()], p)
    return live.get_weights(), record


def assert_weights_close(a, b, atol=1e-5):
    assert len(a) == len(b)
    for i, (u, v) in enumerate(zip(a, b)):
        np.testing.assert_allclose(u, v, atol=atol, rtol=1e-5, err_msg=f"weight {i}")


def threaded_one_stage(x, y, warmup_rows: int):
    """(strategy, model, runtime): skip_model(0) as one stage at N_m = 1 through the
    threaded runtime (in_graph=False), SGD, built by a fit on the first `warmup_rows`."""
    from hetpipe_tf.strategy import HetPipeStrategy, even_plan
    strategy = HetPipeStrategy(plan=even_plan(skip_model(0), DEVICES[:1], n_m=1),
                               in_graph=False)
    with strategy.scope():
        model = skip_model(0)
        model.compile(keras.optimizers.SGD(0.01), "mse")
    model.fit(x[:warmup_rows], y[:warmup_rows], batch_size=8, epochs=1, verbose=0)
    return strategy, model, strategy.pipeline(model)


def with_device_memory(cluster, nbytes: int):
    """`cluster` with every device's memory set to `nbytes` (squeezed clusters for the
    planner's memory rows)."""
    import dataclasses

    from hetpipe_tf.cluster.spec import Cluster
    return Cluster(hosts=tuple(dataclasses.replace(h, devices=tuple(
        dataclasses.replace(d, memory_bytes=nbytes) for d in h.devices)) for h in cluster.hosts),
        inter_bandwidth=cluster.inter_bandwidth)
