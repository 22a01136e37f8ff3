"""Seeing the pipeline: timelines (Chrome trace, Figure-1-style PNG), per-stage figures,
and a Keras callback that logs them to TensorBoard and reports predicted vs measured.

    from hetpipe_tf.observe import PipelineMonitor, write_chrome_trace, draw_pipeline_png
    model.fit(ds, callbacks=[PipelineMonitor(strategy, log_dir="logs")])
    rt = strategy.pipeline(model)
    write_chrome_trace(rt.trace, "trace.json", plan=strategy.plan)
    draw_pipeline_png(rt.trace, "pipeline.png", title="2 stages, N_m = 2", plan=strategy.plan)

Every function takes any iterable of stage-task events (the runtime's `trace`, the
simulator's events): see `hetpipe_tf.observe.events`. docs/observe.md has the details.
"""

from hetpipe_tf.observe.callbacks import PipelineMonitor, compare_plan
from hetpipe_tf.observe.events import StageEvent, normalize
from hetpipe_tf.observe.stats import StageStats, stage_stats, staleness, throughput
from hetpipe_tf.observe.timeline import chrome_trace, draw_pipeline_png, write_chrome_trace

__all__ = ["PipelineMonitor", "StageEvent", "StageStats", "chrome_trace", "compare_plan",
           "draw_pipeline_png", "normalize", "stage_stats", "staleness", "throughput",
           "write_chrome_trace"]
