"""HetPipe for TensorFlow 2: pipelined model parallelism over heterogeneous GPUs.

    import hetpipe_tf as hp
    strategy = hp.HetPipeStrategy(cluster)
    with strategy.scope():
        model = ...; model.compile(...)
    model.fit(dataset, ...)
"""

__version__ = "0.1.0"

from hetpipe_tf.cluster.spec import Cluster, Device, Host  # noqa: E402
from hetpipe_tf.partitioner.plan import PartitionError, Plan  # noqa: E402
from hetpipe_tf.partitioner.planner import plan_model  # noqa: E402
from hetpipe_tf.strategy import HetPipeStrategy  # noqa: E402

__all__ = ["Cluster", "Device", "Host", "HetPipeStrategy", "PartitionError", "Plan",
           "plan_model", "__version__"]
