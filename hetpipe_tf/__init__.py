"""HetPipe for TensorFlow 2: pipelined model parallelism over heterogeneous GPUs.

    import hetpipe_tf as hp
    hp.configure_logical_devices(2)            # a local cluster: 2 logical CPUs, first
    strategy = hp.HetPipeStrategy(hp.Cluster.local(["CPU"] * 2))
    with strategy.scope():
        model = ...; model.compile(...)
    model.fit(dataset, ...)

The public names load lazily (PEP 562), so `import hetpipe_tf.core.wsp` (pure rules) does
not load TensorFlow.
"""

from __future__ import annotations

import importlib

__version__ = "0.1.0"

_PUBLIC = {
    "Cluster": "hetpipe_tf.cluster.spec",
    "Device": "hetpipe_tf.cluster.spec",
    "Host": "hetpipe_tf.cluster.spec",
    "configure_logical_devices": "hetpipe_tf.cluster.local",
    "PartitionError": "hetpipe_tf.partitioner.plan",
    "Plan": "hetpipe_tf.partitioner.plan",
    "plan_model": "hetpipe_tf.partitioner.planner",
    "HetPipeStrategy": "hetpipe_tf.strategy",
    "Schedule": "hetpipe_tf.core.sync_schedule",
    "Compensation": "hetpipe_tf.pipeline.compensation",
    "DataParallel": "hetpipe_tf.strategy.data_parallel",
    "FaultPolicy": "hetpipe_tf.ps.faults",
    "TaskLostError": "hetpipe_tf.ps.faults",
}

__all__ = sorted(_PUBLIC) + ["__version__"]


def __getattr__(name: str):
    if name in _PUBLIC:
        value = getattr(importlib.import_module(_PUBLIC[name]), name)
        globals()[name] = value
        return value
    raise AttributeError(f"module 'hetpipe_tf' has no attribute {name!r}")


def __dir__():
    return __all__
