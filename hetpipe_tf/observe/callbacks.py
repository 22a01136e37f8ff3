"""`PipelineMonitor`: a Keras callback that watches a `HetPipeStrategy`'s pipeline during fit.

Per epoch it writes TensorBoard scalars (tf.summary, under `<log_dir>/pipeline`):

| tag | meaning |
| --- | --- |
| pipeline/throughput_samples_per_s | minibatches of the epoch x batch size / pipeline span |
| pipeline/throughput_minibatches_per_s | minibatches of the epoch / pipeline span |
| pipeline/span_s | first task start to last task end of the epoch |
| stage_<j>/utilisation | busy time / span |
| stage_<j>/idle_s | gaps between the stage's consecutive tasks |
| stage_<j>/waiting_s | span before the stage's first and after its last task (fill, drain) |
| stage_<j>/time_per_minibatch_ms | busy time / minibatches (forward + backward of one) |
| staleness/mean, staleness/max | minibatch id minus the last update its weights reflected |
| clock/distance | clock distance between virtual workers: 0 with one virtual worker |

At the end of fit it prints (and keeps in `.report`) the predicted (plan) and measured time
per minibatch of every stage and the bottleneck stage predicted and measured; with a
`log_dir` it also writes the last epoch's Chrome trace and PNG timeline there.
Definitions of the figures: `hetpipe_tf.observe.stats`.
"""

from __future__ import annotations

import dataclasses
import logging
import os
from typing import Any, Callable, Iterable

import keras
import tensorflow as tf

from hetpipe_tf.observe import stats as stats_lib
from hetpipe_tf.observe.events import emulated_stages, normalize
from hetpipe_tf.observe.timeline import draw_pipeline_png, run_label, write_chrome_trace

logger = logging.getLogger(__name__)

TRACE_FILE = "pipeline_trace.json"
PNG_FILE = "pipeline.png"


@dataclasses.dataclass(frozen=True)
class StageComparison:
    stage: int
    device: str
    predicted_s: float | None  # None when the plan has no prediction (hand-made plans)
    measured_s: float          # mean busy time per minibatch
    emulated_speed_factor: float = 1.0

    @property
    def ratio(self) -> float | None:
        return self.measured_s / self.predicted_s if self.predicted_s else None


@dataclasses.dataclass(frozen=True)
class PlanComparison:
    stages: tuple[StageComparison, ...]
    minibatches: int

    @property
    def predicted_bottleneck(self) -> int | None:
        known = [s for s in self.stages if s.predicted_s]
        return max(known, key=lambda s: s.predicted_s).stage if known else None

    @property
    def measured_bottleneck(self) -> int | None:
        return max(self.stages, key=lambda s: s.measured_s).stage if self.stages else None

    def text(self) -> str:
        rows = [("stage", "device", "predicted ms", "measured ms", "measured/predicted")]
        for s in self.stages:
            dev = s.device + (f" (EMULATED x{s.emulated_speed_factor:g})"
                              if s.emulated_speed_factor != 1.0 else "")
            rows.append((str(s.stage), dev,
                         f"{s.predicted_s * 1e3:.2f}" if s.predicted_s else "n/a",
                         f"{s.measured_s * 1e3:.2f}",
                         f"{s.ratio:.2f}" if s.ratio is not None else "n/a"))
        widths = [max(len(r[i]) for r in rows) for i in range(len(rows[0]))]
        lines = [f"HetPipe pipeline report: time per minibatch of each stage (forward + "
                 f"backward), {self.minibatches} minibatches measured"]
        for n, r in enumerate(rows):
            lines.append("  ".join(c.ljust(w) for c, w in zip(r, widths)).rstrip())
            if n == 0:
                lines.append("  ".join("-" * w for w in widths))
        pb = self.predicted_bottleneck
        lines.append("bottleneck stage: predicted "
                     + (str(pb) if pb is not None else "n/a (the plan has no predicted times)")
                     + f", measured {self.measured_bottleneck}")
        return "\n".join(lines)


def compare_plan(plan, events: Iterable[Any], vw: int | None = None) -> PlanComparison:
    """Predicted (plan) against measured time per minibatch of each stage of virtual worker
    `vw` (default: the first one in the events)."""
    evs = normalize(events, vw)
    per = stats_lib.stage_stats(evs)
    w = vw if vw is not None else (evs[0].vw if evs else 0)
    stages = sorted(j for (v, j) in per if v == w)
    if plan is not None:
        stages = sorted(set(stages) | set(range(plan.num_stages)))
    emulated = emulated_stages(plan)
    rows = []
    for j in stages:
        sp = plan.stages[j] if plan is not None and j < plan.num_stages else None
        st = per.get((w, j))
        rows.append(StageComparison(
            stage=j, device=sp.device if sp is not None else f"stage {j}",
            predicted_s=(sp.time_s or None) if sp is not None else None,
            measured_s=st.time_per_minibatch_s if st is not None else 0.0,
            emulated_speed_factor=emulated.get(j, 1.0)))
    first = per.get((w, 0))
    return PlanComparison(tuple(rows), first.minibatches if first is not None else 0)


def write_scalar(tag: str, value: float, step: int, description: str | None = None) -> None:
    """Write a TensorBoard scalar to the default summary writer.

    Same record as `tf.summary.scalar` (a float32 tensor summary with the "scalars" plugin
    metadata), written with TensorFlow's own `tf.summary.write`: `tf.summary.scalar` is
    implemented by the `tensorboard` package, which TensorFlow 2.21 no longer installs.
    """
    metadata = tf.compat.v1.SummaryMetadata(summary_description=description or "")
    metadata.plugin_data.plugin_name = "scalars"  # ScalarPluginData(version=0): empty content
    tf.summary.write(tag, tf.constant(value, tf.float32), step=step, metadata=metadata)


class PipelineMonitor(keras.callbacks.Callback):
    """Logs the pipeline of a `HetPipeStrategy` to TensorBoard and reports on it.

    Args:
      strategy: the `HetPipeStrategy` the model was built and compiled under.
      log_dir: where to write TensorBoard scalars (`<log_dir>/pipeline`) and, at the end of
        fit, the last epoch's `pipeline_trace.json` and `pipeline.png`. None: no files.
      report: print the predicted-vs-measured report at the end of fit.
      batch_size: samples per minibatch for samples/s (default: the plan's batch size; if
        neither is known, only minibatches/s is logged).
      timeline: write the last epoch's Chrome trace and PNG to `log_dir`.
      print_fn: prints the report (default `print`).
    """

    def __init__(self, strategy, log_dir: str | None = None, report: bool = True,
                 batch_size: int | None = None, timeline: bool = True,
                 print_fn: Callable[[str], Any] = print):
        super().__init__()
        self.strategy = strategy
        self.log_dir = log_dir
        self.print_report = report
        self.batch_size = batch_size
        self.timeline = timeline
        self.print_fn = print_fn
        self.report: str | None = None
        self.comparison: PlanComparison | None = None   # virtual worker 0's
        self.comparisons: list[PlanComparison] = []      # every VW's, with several VWs
        self.epochs: list[dict[str, float]] = []  # the scalars logged, one dict per epoch
        self.trace_path: str | None = None
        self.png_path: str | None = None
        self._writer = None
        self._fit_start = 0
        self._epoch_start = 0
        self._last_epoch: tuple[int, int] = (0, 0)
        self._waits: dict[int, float] = {}
        self._vw_starts: dict[int, int] = {}
        self._pushes = 0

    # --- helpers --------------------------------------------------------------------------
    def _runtime(self):
        try:
            return self.strategy.pipeline(self.model)
        except KeyError:  # the runtime is built at the first training step
            return None

    def _trace_len(self) -> int:
        rt = self._runtime()
        return len(rt.trace) if rt is not None else 0

    def _batch_size(self) -> int | None:
        if self.batch_size:
            return int(self.batch_size)
        plan = getattr(self.strategy, "plan", None)
        return int(plan.batch_size) if plan is not None and plan.batch_size else None

    def _coordinator(self):
        get = getattr(self.strategy, "coordinator", None)
        return get(self.model) if get is not None else None

    def _wsp_scalars(self, scalars: dict, desc: dict) -> None:
        coord = self._coordinator()
        if coord is None:
            scalars["clock/distance"] = 0.0
            desc["clock/distance"] = ("Clock distance between virtual workers. One virtual "
                                      "worker: no global clock to wait for, so it is 0.")
            return
        servers = coord.servers
        scalars["clock/distance"] = float(servers.run_max_clock_distance)
        desc["clock/distance"] = (
            "Largest spread of the virtual workers' clocks (waves pushed) after a push in "
            "this epoch; at most D + 1 (a VW that pushed and waits is one ahead).")
        scalars["clock/bound_D"] = float(self.strategy.extended.clock_distance)
        for w, sync in enumerate(coord.syncs):
            before = self._waits.get(w, 0.0)
            scalars[f"vw_{w}/wait_for_global_s"] = sync.wait_s - before
            desc[f"vw_{w}/wait_for_global_s"] = (
                "Time this VW's updater waited for other VWs' waves (WSP) in the epoch.")
            self._waits[w] = sync.wait_s
        scalars["wsp/pushes"] = float(len(servers.pushes) - self._pushes)
        self._pushes = len(servers.pushes)

    # --- Keras hooks ----------------------------------------------------------------------
    def on_train_begin(self, logs=None):
        self._fit_start = self._trace_len()
        coord = self._coordinator()
        self._vw_starts = ({i: len(w.trace) for i, w in enumerate(coord.runtimes)}
                           if coord is not None else {})
        self.epochs = []
        if self.log_dir is not None and self._writer is None:
            self._writer = tf.summary.create_file_writer(os.path.join(self.log_dir, "pipeline"))

    def on_epoch_begin(self, epoch, logs=None):
        self._epoch_start = self._trace_len()

    def on_epoch_end(self, epoch, logs=None):
        rt = self._runtime()
        if rt is None:
            return
        self.strategy.drain()  # Keras drained already (metrics read); make sure of it
        end = len(rt.trace)
        self._last_epoch = (self._epoch_start, end)
        events = normalize(rt.trace[self._epoch_start:end])
        if not events:
            if not getattr(rt, "trace_enabled", True):
                logger.warning("PipelineMonitor: the pipeline runtime records no trace.")
            return
        scalars, descriptions = self._epoch_scalars(rt, events)
        self.epochs.append(scalars)
        if self._writer is not None:
            with self._writer.as_default(step=epoch):
                for tag, value in scalars.items():
                    write_scalar(tag, value, epoch, descriptions.get(tag))
            self._writer.flush()

    def _epoch_scalars(self, rt, events):
        per = stats_lib.stage_stats(events)
        minibatches = sorted({e.minibatch for e in events})
        span = max(e.end for e in events) - min(e.start for e in events)
        scalars: dict[str, float] = {}
        desc: dict[str, str] = {}
        mb_per_s = stats_lib.throughput(events)
        bs = self._batch_size()
        if bs:
            scalars["pipeline/throughput_samples_per_s"] = mb_per_s * bs
            desc["pipeline/throughput_samples_per_s"] = (
                f"Samples per second over the epoch's pipeline span (batch size {bs}).")
        scalars["pipeline/throughput_minibatches_per_s"] = mb_per_s
        scalars["pipeline/span_s"] = span
        for (w, j), st in per.items():
            p = f"stage_{j}" if w == 0 else f"vw_{w}/stage_{j}"
            scalars[f"{p}/utilisation"] = st.utilisation
            scalars[f"{p}/idle_s"] = st.idle_s
            scalars[f"{p}/waiting_s"] = st.waiting_s
            scalars[f"{p}/time_per_minibatch_ms"] = st.time_per_minibatch_s * 1e3
            desc[f"{p}/idle_s"] = "Sum of the gaps between the stage's consecutive tasks."
            desc[f"{p}/waiting_s"] = ("Time before the stage's first and after its last task "
                                      "in the epoch's span (pipeline fill and drain).")
        stale = list(stats_lib.staleness(rt.record, minibatches).values())
        if stale:
            scalars["staleness/mean"] = sum(stale) / len(stale)
            scalars["staleness/max"] = float(max(stale))
            desc["staleness/mean"] = ("Minibatch id minus the last update reflected in the "
                                      "weights it used (N_m within a run).")
        self._wsp_scalars(scalars, desc)
        return scalars, desc

    def on_train_end(self, logs=None):
        rt = self._runtime()
        if self._writer is not None:
            self._writer.close()
            self._writer = None
        if rt is None:
            return
        plan = getattr(rt, "plan", None) or getattr(self.strategy, "plan", None)
        self.comparison = compare_plan(plan, rt.trace[self._fit_start:])
        self.report = self.comparison.text()
        coord = self._coordinator()
        if coord is not None:   # one report per virtual worker (VW 0's is `comparison`)
            self.comparisons = [self.comparison] + [
                compare_plan(w.plan, w.trace[self._vw_starts.get(i, 0):])
                for i, w in enumerate(coord.runtimes) if i > 0]
            self.report = "\n".join(f"virtual worker {i}:\n{c.text()}"
                                     for i, c in enumerate(self.comparisons))
        if self.print_report:
            self.print_fn(self.report)
        if self.log_dir is not None and self.timeline:
            a, b = self._last_epoch
            last = rt.trace[a:b]
            if last:
                self.trace_path = write_chrome_trace(
                    last, os.path.join(self.log_dir, TRACE_FILE), plan=plan)
                try:
                    self.png_path = draw_pipeline_png(
                        last, os.path.join(self.log_dir, PNG_FILE), plan=plan,
                        title=f"{run_label(None, plan)}: last epoch, N_m = {rt.n_m}")
                except ImportError as err:
                    logger.warning("PipelineMonitor: no PNG timeline: %s", err)
