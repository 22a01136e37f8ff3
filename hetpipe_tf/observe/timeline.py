"""The pipeline over time: a Chrome trace (Perfetto, chrome://tracing) and a PNG drawn like
Figure 1 of the HetPipe paper, from the runtime's trace or the simulator's events alike.

Chrome Trace Event format: one complete ("X") event per stage task, pid = virtual worker,
tid = stage, name "F3" / "B3" / "FB3" (kind and minibatch), ts and dur in microseconds
from the first task's start, args {minibatch, kind, stage, vw}; metadata ("M") events name
the processes ("virtual worker 0 - <label>") and threads ("stage 1 /CPU:1 EMULATED x0.5").
"""

from __future__ import annotations

import json
import os
from typing import Any, Iterable

from hetpipe_tf.observe.events import KIND_NAMES, emulated_stages, normalize

FORWARD_COLOR = "#f7d038"   # yellow, as in the paper's Figure 1
BACKWARD_COLOR = "#5cb85c"  # green


def run_label(label: str | None, plan) -> str:
    """`label` (default from `plan`), with the EMULATED stages of `plan` noted."""
    label = label if label is not None else (
        f"hetpipe_tf {plan.model_name}" if plan is not None else "hetpipe_tf pipeline")
    emulated = emulated_stages(plan)
    if emulated:
        label += " [EMULATED speed: " + ", ".join(
            f"stage {j} x{f:g}" for j, f in sorted(emulated.items())) + "]"
    return label


_LOCAL_PREFIX = "/job:localhost/replica:0/task:0/device:"


def _stage_name(j: int, plan) -> str:
    name = f"stage {j}"
    if plan is not None and j < len(plan.stages):
        s = plan.stages[j]
        device = s.device
        name += " " + (device[len(_LOCAL_PREFIX):] if device.startswith(_LOCAL_PREFIX)
                       else device)
        if float(s.emulated_speed_factor) != 1.0:
            name += f" EMULATED x{float(s.emulated_speed_factor):g}"
    return name


def chrome_trace(events: Iterable[Any], *, label: str | None = None, plan=None,
                 vw: int | None = None) -> dict:
    """The events as a Chrome Trace Event Format object (a JSON-serialisable dict).

    Args:
      events: stage-task events (runtime trace, simulator events; see `observe.events`).
      label: names the run in the process names; default from `plan` or "hetpipe_tf
        pipeline". Stages with an emulated speed factor in `plan` are noted "EMULATED".
      plan: the `Plan` that was run (optional): device names and emulation in the names.
      vw: virtual-worker id of events that carry none (default 0).
    """
    evs = normalize(events, vw)
    label = run_label(label, plan)
    t0 = evs[0].start if evs else 0.0
    out: list[dict] = []
    for w in sorted({e.vw for e in evs}):
        out.append({"name": "process_name", "ph": "M", "pid": w, "tid": 0,
                    "args": {"name": f"virtual worker {w} - {label}"}})
        out.append({"name": "process_sort_index", "ph": "M", "pid": w, "tid": 0,
                    "args": {"sort_index": w}})
        for j in sorted({e.stage for e in evs if e.vw == w}):
            out.append({"name": "thread_name", "ph": "M", "pid": w, "tid": j,
                        "args": {"name": _stage_name(j, plan)}})
            out.append({"name": "thread_sort_index", "ph": "M", "pid": w, "tid": j,
                        "args": {"sort_index": j}})
    for e in evs:
        out.append({
            "name": e.name, "cat": KIND_NAMES[e.kind], "ph": "X", "pid": e.vw, "tid": e.stage,
            "ts": round((e.start - t0) * 1e6, 3), "dur": round(e.duration * 1e6, 3),
            "args": {"minibatch": e.minibatch, "kind": KIND_NAMES[e.kind], "stage": e.stage,
                     "vw": e.vw},
        })
    return {"traceEvents": out, "displayTimeUnit": "ms",
            "otherData": {"label": label, "tasks": len(evs),
                          "emulated_stages": {str(j): f for j, f in
                                              sorted(emulated_stages(plan).items())}}}


def write_chrome_trace(events: Iterable[Any], path: str, **kwargs) -> str:
    """Write `chrome_trace(events, **kwargs)` as JSON to `path`; returns `path`."""
    trace = chrome_trace(events, **kwargs)
    os.makedirs(os.path.dirname(os.path.abspath(path)), exist_ok=True)
    with open(path, "w", encoding="utf-8") as f:
        json.dump(trace, f, allow_nan=False)
    return path


def draw_pipeline_png(events: Iterable[Any], path: str, *, title: str | None = None,
                      plan=None, vw: int | None = None, dpi: int = 100) -> str:
    """Draw the pipeline like the paper's Figure 1 and save it as a PNG at `path`.

    One row per stage (stage 0 on top; with several virtual workers, one group of rows per
    virtual worker), time on the x axis in ms from the first task; forward tasks yellow,
    backward green, the last stage's forward+backward task as a box half yellow, half green;
    each box labelled with its minibatch number. Needs matplotlib (imported here, Agg
    canvas, no pyplot state touched). Returns `path`.
    """
    try:
        from matplotlib.backends.backend_agg import FigureCanvasAgg
        from matplotlib.figure import Figure
        from matplotlib.patches import Patch, Rectangle
    except ImportError as err:  # pragma: no cover - depends on the environment
        raise ImportError("draw_pipeline_png needs matplotlib. Received: no module "
                          "'matplotlib'; pip install 'matplotlib>=3.8,<4'.") from err
    evs = normalize(events, vw)
    rows = sorted({(e.vw, e.stage) for e in evs})
    row_of = {r: i for i, r in enumerate(rows)}
    many_vws = len({w for w, _ in rows}) > 1
    t0 = evs[0].start if evs else 0.0
    t_end = max((e.end for e in evs), default=t0 + 1e-3)
    span_ms = max((t_end - t0) * 1e3, 1e-6)
    per_row = max((sum(1 for e in evs if (e.vw, e.stage) == r) for r in rows), default=1)
    width = min(40.0, max(8.0, 0.3 * per_row + 3.0))
    fig = Figure(figsize=(width, 1.0 + 0.7 * max(1, len(rows))), dpi=dpi)
    FigureCanvasAgg(fig)
    ax = fig.add_subplot(1, 1, 1)
    height = 0.8
    font = 8 if per_row <= 60 else 6
    for e in evs:
        y = row_of[(e.vw, e.stage)] - height / 2
        x = (e.start - t0) * 1e3
        w = e.duration * 1e3
        if e.kind == "FB":
            ax.add_patch(Rectangle((x, y), w / 2, height, facecolor=FORWARD_COLOR,
                                   edgecolor="none"))
            ax.add_patch(Rectangle((x + w / 2, y), w / 2, height, facecolor=BACKWARD_COLOR,
                                   edgecolor="none"))
            ax.add_patch(Rectangle((x, y), w, height, fill=False, edgecolor="black",
                                   linewidth=0.6))
        else:
            color = FORWARD_COLOR if e.kind == "F" else BACKWARD_COLOR
            ax.add_patch(Rectangle((x, y), w, height, facecolor=color, edgecolor="black",
                                   linewidth=0.6))
        if w / span_ms * (width * 0.8 * 72) >= font * 0.6 * len(str(e.minibatch)):
            ax.text(x + w / 2, y + height / 2, str(e.minibatch), ha="center", va="center",
                    fontsize=font, clip_on=True)
    ax.set_xlim(0, span_ms * 1.01)
    ax.set_ylim(len(rows) - 0.5, -0.5)  # stage 0 on top, as in the paper
    ax.set_yticks(range(len(rows)))
    ax.set_yticklabels([(f"VW{w} " if many_vws else "") + _stage_name(j, plan)
                        for w, j in rows], fontsize=8)
    ax.set_xlabel("time (ms from the first task)")
    ax.set_title(title if title is not None else run_label(None, plan), fontsize=10, loc="left")
    ax.legend(handles=[Patch(facecolor=FORWARD_COLOR, edgecolor="black", label="forward"),
                       Patch(facecolor=BACKWARD_COLOR, edgecolor="black", label="backward")],
              loc="lower right", bbox_to_anchor=(1.0, 1.0), fontsize=8, ncols=2,
              frameon=False, borderaxespad=0.2)
    ax.grid(axis="x", linestyle=":", linewidth=0.5)
    fig.tight_layout()
    os.makedirs(os.path.dirname(os.path.abspath(path)), exist_ok=True)
    fig.savefig(path, format="png")
    return path
