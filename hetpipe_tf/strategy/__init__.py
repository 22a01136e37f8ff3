"""The only Keras / tf.distribute glue: `HetPipeStrategy`, plan helpers, validation."""

from hetpipe_tf.pipeline.runtime import PipelineError, PipelineRuntime
from hetpipe_tf.strategy.plans import StageSpec, even_plan, layer_order, manual_plan
from hetpipe_tf.strategy.strategy import HetPipeStrategy

__all__ = ["HetPipeStrategy", "PipelineRuntime", "PipelineError", "StageSpec", "manual_plan",
           "even_plan", "layer_order"]
