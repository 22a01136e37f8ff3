"""Discrete-event simulator of HetPipe plans on a cluster (docs/simulator.md).

    from hetpipe_tf.sim import SimConfig, from_plan, simulate
    vws = [from_plan(plan, cluster, ps=ps_map) for plan in plans]
    result = simulate(vws, SimConfig(n_m=plans[0].n_m, clock_distance=0, num_waves=20), cluster)
    print(result.table())
"""

from hetpipe_tf.sim.allreduce import AllReduceResult, data_parallel, horovod, ring_allreduce_seconds
from hetpipe_tf.sim.engine import simulate
from hetpipe_tf.sim.links import LinkPool, Transfer
from hetpipe_tf.sim.model import (
    PSShard,
    SimConfig,
    SimStage,
    VirtualWorker,
    default_ps_map,
    from_plan,
    stage_param_bytes,
    stage_times,
    stage_update_times,
)
from hetpipe_tf.sim.result import SimEvent, SimResult, VWStats
from hetpipe_tf.sim.timeline import VirtualClock, timeline

__all__ = [
    "AllReduceResult", "LinkPool", "PSShard", "SimConfig", "SimEvent",
    "SimResult", "SimStage", "Transfer", "VWStats", "VirtualClock", "VirtualWorker",
    "data_parallel",
    "default_ps_map", "from_plan", "horovod", "ring_allreduce_seconds", "simulate",
    "stage_param_bytes", "stage_times", "stage_update_times", "timeline",
]
