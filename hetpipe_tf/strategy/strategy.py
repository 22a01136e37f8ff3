"""`HetPipeStrategy`: a tf.distribute.Strategy that trains a Keras model as pipelined
virtual workers (paper Sections 3-4), several of them doing data parallelism through
parameter servers under Wave Synchronous Parallel (Section 5).

This module holds the public class and its arguments, parsed once into `options.py`'s
frozen `StrategyOptions`; the tf.distribute plumbing is `extended.py`, building a model's
executor `build.py` (one class per training mode, `modes.py`), the wrappers installed on
the Keras model `guards.py`. See docs/strategy.md.
"""

from __future__ import annotations

from typing import Any

import tensorflow as tf

from hetpipe_tf.cluster import roles
from hetpipe_tf.pipeline.in_graph import InGraphRuntime
from hetpipe_tf.ps.faults import DEFAULT_TIMEOUT_S, FaultOptions, FaultPolicy
from hetpipe_tf.pipeline.runtime import PipelineRuntime
from hetpipe_tf.pipeline.sync_runtime import SyncPipelineRuntime
from hetpipe_tf.core.sync_schedule import Schedule
from hetpipe_tf.strategy.compensation import Compensation
from hetpipe_tf.strategy.extended import HetPipeExtended
from hetpipe_tf.strategy.data_parallel import DataParallel
from hetpipe_tf.strategy.options import StrategyOptions
from hetpipe_tf.strategy.schedules import check_arguments as check_schedule_arguments


class HetPipeStrategy(tf.distribute.Strategy):
    """HetPipe under Keras `model.fit`: pipelined virtual workers, WSP between them.

    One virtual worker (VW) by default: pipelined model parallelism over its devices. With
    several plans (or an `allocation`), several VWs do data parallelism through parameter
    servers under Wave Synchronous Parallel (paper Section 5; docs/wsp.md).

    The arguments are checked and every default resolved once, when the strategy is made,
    into the frozen `strategy.options` (hetpipe_tf/strategy/options.py).

    Args:
      cluster: the devices: a `hetpipe_tf.cluster` Cluster, a dict, a
        `tf.train.ClusterSpec`, a ClusterResolver, or None to read TF_CONFIG. Optional when
        `plan` is given (the plan names every stage's device).
      plan: a `hetpipe_tf.partitioner.plan.Plan` for the model (its variables are then
        created on their stage's device), a sequence of Plans (one per virtual worker, the
        same N_m), or a callable model -> Plan (or sequence) called at the first `fit`.
        Without it the planner partitions the model at the first `fit`. With a callable
        or the planner, variables stay on the host device and each minibatch's weight
        version is copied to the stage devices (see docs/strategy.md).
      n_m: minibatches in flight (N_m). Defaults to the plan's N_m; when the planner
        makes the plan, to the N_m <= min(Max_m, stages) that the time-to-accuracy rule
        picks (strategy/defaults.py: filling the pipeline must buy more time than its
        staleness costs in epochs; docs/convergence.md "The defaults").
      max_m: the memory bound Max_m, when known (N_m > Max_m is an error).
      clock_distance: WSP's bound D on the clock distance between VWs (0 = BSP-like).
        None (not given): 0; with a cluster model (`clock=`) and the planner, picked with
        N_m and the allocation by predicted time to accuracy (docs/time_to_accuracy.md).
      placement: where the parameter servers keep each layer: "default" (round-robin over
        the PS hosts) or "ed_local" (stage k's layers on the node running stage k).
      ps_hosts: host names of the parameter servers; None = the cluster's "ps" job, else
        one per host.
      allocation: with no plan, form VWs from the cluster by this policy ("NP", "ED",
        "HD", "AUTO"; Section 8.1) and plan each; None = one VW of every device, or with
        a cluster model (`clock=`) the policy picked by predicted time to accuracy.
      num_virtual_workers: how many VWs the allocation forms (None: the policy's default).
      fresh_pulls: at every wave end, also take whatever newer w_global the servers hold,
        without waiting (the waiting rule of D is unchanged; docs/wsp.md).
      in_graph: one VW of one stage at N_m = 1 runs each minibatch inside Keras' compiled
        train step instead of through the runtime's stage thread (the same computation,
        about twice as fast for small steps; its trace has one event per Keras call,
        `pipeline/in_graph.py`). False keeps the threaded runtime for every layout.
      schedule: `Schedule.HETPIPE` (default: HetPipe's asynchronous pipeline, N_m
        minibatches in flight), `Schedule.GPIPE` or `Schedule.ONE_F_ONE_B` (synchronous:
        each minibatch split into `micro_batches` micro-batches, one update per minibatch,
        equal to one step on the whole minibatch; docs/schedules.md). Not with `n_m`.
      micro_batches: M, for a synchronous schedule (must divide the batch size).
      rematerialize: synchronous schedules only: non-last stages keep only their inputs
        and recompute their forward in the backward (GPipe's re-materialization).
      compensation: staleness compensation (docs/convergence.md). None (the default):
        `Compensation.BOTH`, or NONE in HetSeq mode (no staleness; a log line names it
        where it changes training). `Compensation.NONE` (or "none") trains by the paper's rules
        exactly; `Compensation.PREDICT` forwards each
        minibatch at its weight version moved ahead by the local updates it misses;
        `Compensation.MOMENTUM` lowers the stage optimizers' momentum by the momentum that
        staleness implies; `Compensation.BOTH` does both; `Compensation.AVERAGE` scales
        each of N VWs' learning rate by 1/N (averaged, not summed, updates);
        `Compensation.ALL` is BOTH and AVERAGE; `Compensation.BOTH_DC` is BOTH with each
        stage gradient delay-compensated (DC-ASGD); `Compensation.BOTH_GA` is BOTH with
        each stage gradient divided by its staleness gap (Gap-Aware). A Compensation or
        its name.
      data_parallel: `DataParallel.WSP` (or "wsp"): the layouts above. `DataParallel.HETSEQ`
        (or "hetseq"): every device of `cluster` holds the whole model and takes a share of
        each batch by its speed, one synchronous update per batch (docs/hetseq.md); with
        clock_distance > 0, one-device VWs under WSP, each a share of every batch.
        `DataParallel.WSP_SPLIT` ("wsp_split"): the WSP layouts with every batch split into
        one share per VW by its plan's throughput (a faster VW a larger minibatch).
      shares: HetSeq and "wsp_split" only: each device's (VW's) share of the batch, by
        hand (cluster order; must sum to the batch size); None = chosen at the first fit.
      fault_timeout_s: a worker or ps task that stops answering (dead or frozen) is found
        within this many seconds, whatever the chief is doing, and named in a
        `hetpipe_tf.ps.faults.TaskLostError` (task, address, stages, VWs); at start, a
        task that does not answer within it is named in a `TaskUnreachableError`.
      on_fault: `FaultPolicy.STOP` (or "stop"): fit raises the TaskLostError (resume from
        a checkpoint). `FaultPolicy.CONTINUE` ("continue"): with several VWs, fit goes on
        without the VWs of a lost worker task (a warning names them; a lost ps or the last
        VW still raises), docs/cluster_jobs.md "Going on without a lost VW".
      clock: None (this machine's time), or a cluster model (`hetpipe_tf.sim.VirtualClock(
        cluster)`): several VWs train on this process's devices with every stage task,
        push and pull in the order and at the virtual time the cluster model gives, one at
        a time (bit-identical run to run); Keras' logs get `virtual_time_s`
        (docs/virtual_clock.md).
    """

    def __init__(self, cluster: Any = None, *, plan=None, n_m: int | None = None,
                 schedule: Schedule = Schedule.HETPIPE, micro_batches: int | None = None,
                 rematerialize: bool = False,
                 max_m: int | None = None, clock_distance: int | None = None,
                 placement: str = "default", ps_hosts=None, allocation=None,
                 num_virtual_workers: int | None = None, fresh_pulls: bool = True,
                 in_graph: bool = True, compensation: Compensation | str | None = None,
                 data_parallel: DataParallel | str = DataParallel.WSP, shares=None,
                 fault_timeout_s: float = DEFAULT_TIMEOUT_S,
                 on_fault: FaultPolicy | str = FaultPolicy.STOP, clock=None):
        # The schedule's arguments first: `n_m` with a synchronous schedule is refused as
        # such, not by N_m's checks.
        check_schedule_arguments(schedule, micro_batches, rematerialize, n_m, data_parallel)
        faults = FaultOptions.parse(fault_timeout_s, on_fault)
        # Cluster roles (docs/cluster_jobs.md): in a worker or ps process this serves and
        # never returns; in the chief it checks every task answers, then connects.
        task = roles.dispatch(cluster, faults.timeout_s)
        options = StrategyOptions.parse(
            cluster, plan=plan, n_m=n_m, schedule=schedule, micro_batches=micro_batches,
            rematerialize=rematerialize, max_m=max_m, clock_distance=clock_distance,
            placement=placement, ps_hosts=ps_hosts, allocation=allocation,
            num_virtual_workers=num_virtual_workers, fresh_pulls=fresh_pulls,
            in_graph=in_graph, compensation=compensation, data_parallel=data_parallel,
            shares=shares, faults=faults, clock=clock)
        super().__init__(HetPipeExtended(self, options, task))

    @property
    def options(self) -> StrategyOptions:
        """Every argument, checked and resolved (hetpipe_tf/strategy/options.py)."""
        return self.extended.options

    @property
    def plan(self):
        return self.extended.plan

    @property
    def n_m(self) -> int | None:
        return self.extended.n_m

    @property
    def plans(self) -> tuple:
        """One plan per virtual worker (empty before the first fit when planning then)."""
        return self.extended.plans

    @property
    def num_virtual_workers(self) -> int | None:
        return len(self.extended.plans) if self.extended.plans else None

    def pipeline(self, model, vw: int = 0) -> PipelineRuntime | InGraphRuntime:
        """The pipeline runtime of virtual worker `vw` training `model` (records, trace,
        logs); for tests, monitoring and debugging."""
        rt = self.extended.pipelines[id(model)].executor
        if isinstance(rt, (PipelineRuntime, InGraphRuntime, SyncPipelineRuntime)):
            if vw != 0:
                raise ValueError(f"This strategy has one virtual worker. Received: vw={vw}.")
            return rt
        return rt.runtimes[vw]

    def coordinator(self, model):
        """The WSP coordinator (parameter servers, syncs, assignment) of several virtual
        workers training `model`; None with one virtual worker."""
        t = self.extended.pipelines.get(id(model))
        if t is None or isinstance(t.executor, (PipelineRuntime, InGraphRuntime,
                                                SyncPipelineRuntime)):
            return None
        return t.executor

    def executor(self, model):
        """The executor training `model` (a PipelineRuntime, InGraphRuntime,
        SyncPipelineRuntime, Coordinator, or HetSeqExecutor with `shares` and `splits` in
        HetSeq mode); None before its first fit."""
        t = self.extended.pipelines.get(id(model))
        return None if t is None else t.executor

    def drain(self) -> None:
        """Wait until every minibatch handed to the pipeline completed (weights up to date)."""
        self.extended.drain()

    def close(self) -> None:
        """Stop and join every thread of every model's runtime (in-flight work is dropped;
        the models keep the last applied state)."""
        self.extended.close()

    def __enter__(self) -> "HetPipeStrategy":
        return self

    def __exit__(self, *exc) -> None:
        self.close()
