"""Chrome trace and PNG timeline of hand-made and simulated events (no TensorFlow run)."""

import dataclasses
import json

import pytest

from hetpipe_tf.observe import chrome_trace, draw_pipeline_png, normalize, write_chrome_trace
from hetpipe_tf.partitioner.plan import Plan, StagePlan
from hetpipe_tf.pipeline.runtime import TraceEvent
from hetpipe_tf.core.schedule import Task, TaskKind, simulate

F, B, FB = TaskKind.FORWARD, TaskKind.BACKWARD, TaskKind.FORWARD_BACKWARD

# 2 stages, 2 minibatches: (stage, minibatch, kind, start s, end s), times from 10.0 s.
HAND = [(0, 1, F, 10.000, 10.001), (1, 1, FB, 10.001, 10.004), (0, 2, F, 10.0015, 10.0025),
        (0, 1, B, 10.004, 10.006), (1, 2, FB, 10.004, 10.007), (0, 2, B, 10.007, 10.009)]


def _events(rows=HAND):
    return [TraceEvent(Task(j, p, k), s, e) for j, p, k, s, e in rows]


def _plan(factors=(1.0, 0.5)):
    stages = tuple(StagePlan(index=j, device=f"cpu{j}", device_type="CPU",
                             tf_device=f"/CPU:{j}", first=j, last=j, layer_names=(f"l{j}",),
                             compute_s=0.002 * (j + 1), recv_forward_s=0.0, recv_backward_s=0.0,
                             memory_bytes=0, memory_available=1, minibatches_held=1,
                             emulated_speed_factor=f) for j, f in enumerate(factors))
    return Plan(model_name="m", batch_size=8, n_m=2, optimizer_slots=0, stages=stages,
                num_layers=len(factors))


def test_chrome_trace_one_x_event_per_task_with_exact_fields(tmp_path):
    path = write_chrome_trace(_events(), str(tmp_path / "t.json"), label="hand")
    with open(path) as f:
        trace = json.load(f)  # valid JSON
    xs = [e for e in trace["traceEvents"] if e["ph"] == "X"]
    assert len(xs) == len(HAND)
    got = sorted((e["tid"], e["args"]["minibatch"], e["name"]) for e in xs)
    assert got == sorted((j, p, {F: "F", B: "B", FB: "FB"}[k] + str(p))
                         for j, p, k, _, _ in HAND)
    by_name = {(e["tid"], e["name"]): e for e in xs}
    e = by_name[(0, "F2")]
    assert e["pid"] == 0 and e["ts"] == pytest.approx(1500.0) and e["dur"] == pytest.approx(1000.0)
    assert e["args"] == {"minibatch": 2, "kind": "forward", "stage": 0, "vw": 0}
    e = by_name[(1, "FB1")]
    assert e["ts"] == pytest.approx(1000.0) and e["dur"] == pytest.approx(3000.0)
    assert e["args"]["kind"] == "forward+backward"
    assert min(x["ts"] for x in xs) == 0.0
    meta = [e for e in trace["traceEvents"] if e["ph"] == "M"]
    assert {e["args"]["name"] for e in meta if e["name"] == "thread_name"} == {"stage 0",
                                                                               "stage 1"}
    assert [e["args"]["name"] for e in meta if e["name"] == "process_name"] == [
        "virtual worker 0 - hand"]
    for e in trace["traceEvents"]:  # fields chrome://tracing and Perfetto require
        assert {"name", "ph", "pid", "tid"} <= set(e)


def test_virtual_worker_id_from_argument_or_event_and_emulated_label():
    trace = chrome_trace(_events(), vw=3, plan=_plan())
    xs = [e for e in trace["traceEvents"] if e["ph"] == "X"]
    assert {e["pid"] for e in xs} == {3}
    label = trace["otherData"]["label"]
    assert "EMULATED" in label and "stage 1 x0.5" in label
    names = {e["args"]["name"] for e in trace["traceEvents"] if e["name"] == "thread_name"}
    assert names == {"stage 0 cpu0", "stage 1 cpu1 EMULATED x0.5"}

    @dataclasses.dataclass(frozen=True)
    class SimEvent:  # a simulator-like event that carries its virtual worker
        task: Task
        start: float
        end: float
        vw: int

    sim = [SimEvent(e.task, e.start, e.end, w) for w in (0, 1) for e in _events()]
    trace = chrome_trace(sim)
    xs = [e for e in trace["traceEvents"] if e["ph"] == "X"]
    assert len(xs) == 2 * len(HAND) and {e["pid"] for e in xs} == {0, 1}
    assert "EMULATED" not in chrome_trace(_events())["otherData"]["label"]


def test_normalize_accepts_kind_strings_and_flat_events_and_rejects_others():
    @dataclasses.dataclass
    class Flat:
        stage: int
        minibatch: int
        kind: str
        start: float
        end: float

    evs = normalize([Flat(1, 4, "fwd+bwd", 2.0, 3.0), Flat(0, 4, "FORWARD", 1.0, 2.0)])
    assert [(e.stage, e.name) for e in evs] == [(0, "F4"), (1, "FB4")]
    with pytest.raises(ValueError, match="Unknown task kind"):
        normalize([Flat(0, 1, "sideways", 0.0, 1.0)])
    with pytest.raises(TypeError, match="needs .task.stage"):
        normalize([object()])


def test_png_of_simulated_schedule_is_a_png(tmp_path):
    evs = simulate(3, 2, 6, forward_time=[0.01] * 3, backward_time=[0.02] * 3)
    path = draw_pipeline_png(evs, str(tmp_path / "sim.png"), title="simulated")
    with open(path, "rb") as f:
        assert f.read(8) == b"\x89PNG\r\n\x1a\n"


def test_compare_plan_predicted_vs_measured_exact():
    from hetpipe_tf.observe import compare_plan
    cmp = compare_plan(_plan(), _events())
    # measured: stage 0 busy 1+1+2+2 ms, stage 1 3+3 ms, over 2 minibatches each.
    assert [(s.stage, round(s.predicted_s * 1e3, 6), round(s.measured_s * 1e3, 6))
            for s in cmp.stages] == [(0, 2.0, 3.0), (1, 4.0, 3.0)]
    assert cmp.predicted_bottleneck == 1 and cmp.minibatches == 2
    text = cmp.text()
    assert "cpu1 (EMULATED x0.5)" in text and "bottleneck stage: predicted 1" in text
