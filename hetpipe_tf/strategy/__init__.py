"""The tf.distribute.Strategy of HetPipe and the pipeline runtime of one virtual worker."""

from hetpipe_tf.strategy.plans import StageSpec, even_plan, layer_order, manual_plan
from hetpipe_tf.strategy.runtime import PipelineError, PipelineRuntime
from hetpipe_tf.strategy.strategy import HetPipeStrategy

__all__ = ["HetPipeStrategy", "PipelineRuntime", "PipelineError", "StageSpec", "manual_plan",
           "even_plan", "layer_order"]
