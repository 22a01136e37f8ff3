"""A real 2-stage pipelined fit on 2 logical CPU devices: trace file, PNG, TensorBoard
scalars and the end-of-fit report of PipelineMonitor."""

import glob
import json
import os

import keras
import numpy as np
import pytest
import tensorflow as tf

from hetpipe_tf.observe import PipelineMonitor, stage_stats, write_chrome_trace
from hetpipe_tf.observe.callbacks import PNG_FILE, TRACE_FILE
from hetpipe_tf.strategy import HetPipeStrategy, even_plan

DEVICES = ["/job:localhost/replica:0/task:0/device:CPU:%d" % i for i in range(2)]
BATCH, STEPS, EPOCHS = 8, 6, 2


def _model():
    init = keras.initializers.GlorotUniform(seed=0)
    inp = keras.Input((8,), name="x")
    h = keras.layers.Dense(16, activation="tanh", kernel_initializer=init, name="d1")(inp)
    h = keras.layers.Dense(16, activation="tanh", kernel_initializer=init, name="d2")(h)
    out = keras.layers.Dense(1, kernel_initializer=init, name="out")(h)
    return keras.Model(inp, out, name="tiny")


def _scalars(log_dir):
    files = glob.glob(os.path.join(log_dir, "pipeline", "events.out.tfevents.*"))
    assert files, "no TensorBoard event file"
    out = {}
    for path in files:
        for ev in tf.compat.v1.train.summary_iterator(path):
            for v in ev.summary.value:
                out.setdefault(v.tag, {})[ev.step] = float(tf.make_ndarray(v.tensor))
    return out


@pytest.fixture(scope="module")
def fitted(tmp_path_factory):
    log_dir = str(tmp_path_factory.mktemp("logs"))
    rs = np.random.RandomState(0)
    x = rs.randn(BATCH * STEPS, 8).astype("float32")
    y = np.sin(x[:, :1]).astype("float32")
    ds = tf.data.Dataset.from_tensor_slices((x, y)).batch(BATCH, drop_remainder=True)
    strategy = HetPipeStrategy(plan=lambda m: even_plan(m, DEVICES, n_m=2))
    with strategy.scope():
        model = _model()
        model.compile(keras.optimizers.SGD(0.05), "mse")
    printed = []
    monitor = PipelineMonitor(strategy, log_dir=log_dir, batch_size=BATCH,
                              print_fn=printed.append)
    model.fit(ds, epochs=EPOCHS, callbacks=[monitor], shuffle=False, verbose=0)
    yield strategy, model, monitor, log_dir, printed
    strategy.close()


def _expected_tasks(first, last):
    """(stage, name) of every task of minibatches first..last with 2 stages."""
    return sorted([(0, f"F{p}") for p in range(first, last + 1)]
                  + [(0, f"B{p}") for p in range(first, last + 1)]
                  + [(1, f"FB{p}") for p in range(first, last + 1)])


def test_trace_file_of_the_runtime_and_of_the_last_epoch(fitted, tmp_path):
    strategy, model, monitor, log_dir, _ = fitted
    rt = strategy.pipeline(model)
    assert len(rt.trace) == 3 * STEPS * EPOCHS
    path = write_chrome_trace(rt.trace, str(tmp_path / "all.json"), plan=strategy.plan)
    with open(path) as f:
        xs = [e for e in json.load(f)["traceEvents"] if e["ph"] == "X"]
    assert sorted((e["tid"], e["name"]) for e in xs) == _expected_tasks(1, STEPS * EPOCHS)
    assert {e["pid"] for e in xs} == {0} and all(e["dur"] >= 0 for e in xs)
    # The monitor's file: one event per stage task of the last epoch.
    assert monitor.trace_path == os.path.join(log_dir, TRACE_FILE)
    with open(monitor.trace_path) as f:
        xs = [e for e in json.load(f)["traceEvents"] if e["ph"] == "X"]
    assert sorted((e["tid"], e["name"]) for e in xs) == _expected_tasks(STEPS + 1,
                                                                        STEPS * EPOCHS)
    assert min(e["ts"] for e in xs) == 0.0


def test_png_timeline_is_written(fitted):
    _, _, monitor, log_dir, _ = fitted
    assert monitor.png_path == os.path.join(log_dir, PNG_FILE)
    with open(monitor.png_path, "rb") as f:
        assert f.read(8) == b"\x89PNG\r\n\x1a\n"
    assert os.path.getsize(monitor.png_path) > 1000


def test_tensorboard_scalars(fitted):
    _, _, monitor, log_dir, _ = fitted
    scalars = _scalars(log_dir)
    expected = {"pipeline/throughput_samples_per_s", "pipeline/throughput_minibatches_per_s",
                "pipeline/span_s", "staleness/mean", "staleness/max", "clock/distance"}
    for j in (0, 1):
        expected |= {f"stage_{j}/{k}" for k in ("utilisation", "idle_s", "waiting_s",
                                                 "time_per_minibatch_ms")}
    assert expected <= set(scalars)
    for tag in expected:
        assert set(scalars[tag]) == set(range(EPOCHS)), tag
    assert scalars["clock/distance"] == {0: 0.0, 1: 0.0}
    # N_m = 2: minibatches 1, 2 of each run use the run's start weights (staleness 1, 2),
    # the rest reflect updates up to p - 2.
    assert scalars["staleness/max"] == {0: 2.0, 1: 2.0}
    assert scalars["staleness/mean"][0] == pytest.approx((1 + 2 * (STEPS - 1)) / STEPS)
    for e in range(EPOCHS):
        assert 0 < scalars["stage_0/utilisation"][e] <= 1
        assert scalars["pipeline/throughput_samples_per_s"][e] == pytest.approx(
            BATCH * scalars["pipeline/throughput_minibatches_per_s"][e], rel=1e-5)
    assert monitor.epochs[-1]["clock/distance"] == 0.0


def test_report_predicted_vs_measured(fitted):
    strategy, model, monitor, _, printed = fitted
    assert printed == [monitor.report]
    text = monitor.report
    assert "stage" in text and "measured ms" in text and "predicted ms" in text
    # even_plan predicts nothing: the predicted bottleneck is n/a, the measured one known.
    assert "bottleneck stage: predicted n/a" in text
    cmp = monitor.comparison
    assert [s.stage for s in cmp.stages] == [0, 1] and cmp.minibatches == STEPS * EPOCHS
    st = stage_stats(strategy.pipeline(model).trace)
    for s in cmp.stages:
        assert s.predicted_s is None
        assert s.measured_s == pytest.approx(st[(0, s.stage)].time_per_minibatch_s)
    assert cmp.measured_bottleneck == max((0, 1), key=lambda j: st[(0, j)].busy_s)
    assert f"measured {cmp.measured_bottleneck}" in text


def test_two_virtual_workers_log_the_measured_clock_distance_and_waits(tmp_path):
    probe = _model()
    devices = ["/job:localhost/replica:0/task:0/device:CPU:%d" % i for i in range(4)]
    plans = [even_plan(probe, devices[0:2], n_m=2),
             even_plan(probe, devices[2:4], n_m=2, speed_factors=[0.3, 0.3])]
    strategy = HetPipeStrategy(plan=plans, clock_distance=0)
    with strategy.scope():
        model = _model()
        model.compile(keras.optimizers.SGD(0.01), "mse")
    x = np.random.RandomState(0).randn(BATCH * 8, 8).astype("float32")
    y = x[:, :1]
    monitor = PipelineMonitor(strategy, log_dir=str(tmp_path), report=False,
                              batch_size=BATCH)
    model.fit(x, y, batch_size=BATCH, epochs=EPOCHS, verbose=0, callbacks=[monitor])
    scalars = _scalars(str(tmp_path))
    coord = strategy.coordinator(model)
    # Measured per epoch, not the configured D: D = 0 allows a spread of at most 1 wave.
    assert set(scalars["clock/distance"].values()) <= {0.0, 1.0}
    assert scalars["clock/bound_D"] == {0: 0.0, 1: 0.0}
    waits = [scalars[f"vw_{w}/wait_for_global_s"] for w in range(2)]
    assert sum(sum(w.values()) for w in waits) == pytest.approx(
        sum(s.wait_s for s in coord.syncs))
    assert sum(scalars["wsp/pushes"].values()) == len(coord.servers.pushes)
    # The end-of-fit report covers both VWs; the emulated 3x slower VW measures slower.
    assert len(monitor.comparisons) == 2 and "virtual worker 1:" in monitor.report
    slow = [max(s.measured_s for s in c.stages) for c in monitor.comparisons]
    assert slow[1] > slow[0]
    strategy.close()
