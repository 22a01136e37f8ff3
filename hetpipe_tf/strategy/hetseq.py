"""The strategy's HetSeq mode: `HetPipeStrategy(cluster, data_parallel="hetseq")`.

Every device of the cluster holds the whole model and takes a share of each batch by its
speed (docs/hetseq.md): the shares are chosen at the first fit from the model's profile at
the planned batch size (device types present here measured, the others estimated; times /
the emulated speed factor) within each device's memory (`partitioner/shares.py`), or given
by hand (`shares=[...]`, checked against the batch size and the devices' memory). The
executor is `hetpipe_tf.ps.hetseq.HetSeqExecutor`: one synchronous step per batch, equal to
one step of the model's optimizer on the whole batch.

With clock_distance D > 0 HetSeq runs as one-device virtual workers under WSP with split
batches (ps/split.py: each VW a share of every batch by its device's speed, its gradient
weighted by n_k / N, VWs up to D waves apart); `DataParallel.WSP_SPLIT` ("wsp_split") does
the same for the WSP layouts (plans, allocations: pipelined VWs), a faster VW taking a
larger minibatch instead of more minibatches (docs/hetseq.md).

Refused before training: HetSeq with a plan or an allocation (it forms its own layout),
a synchronous pipeline schedule, a staleness compensation or a loss that does not average
over the batch (at the first fit), with n_m > 1, without a cluster; shares given by hand that are not ints >= 1, that do not sum to the
planned batch size, or exceed a device's memory; a global batch smaller than the number
of devices. A later batch larger than the planned one is refused (as in every layout); a
smaller one (an epoch's remainder, a later fit's smaller batch size) is split in
proportion to the shares.
"""

from __future__ import annotations

import logging
from typing import Any, Sequence

import keras
import tensorflow as tf

from hetpipe_tf.cluster.local import host_cpu_device
from hetpipe_tf.partitioner.shares import (Shares, check_share_sizes, choose_shares,
                                           given_shares, speeds_from_profile,
                                           uniform_speeds)
from hetpipe_tf.ps.hetseq import HetSeqExecutor, ShareStage
from hetpipe_tf.pipeline.weights import StageWeights
from hetpipe_tf.strategy import training_state
from hetpipe_tf.strategy.compensation import Compensation
from hetpipe_tf.strategy.data_parallel import DataParallel

logger = logging.getLogger(__name__)


def check_arguments(mode: DataParallel, shares: Any, *, plans: tuple, plan_fn: Any,
                    allocation: Any, clock_distance: int, n_m: int | None,
                    has_cluster: bool, compensation: Any = None) -> tuple[int, ...] | None:
    """The strategy's HetSeq arguments, refused before training (module docstring).
    Returns the hand-given shares as a tuple of ints, or None."""
    if mode is DataParallel.WSP:
        if shares is not None:
            raise ValueError("shares are the HetSeq mode's per-device batch sizes. Received: "
                             f"shares={shares!r} with data_parallel={mode.value!r}; pass "
                             "data_parallel='hetseq' too, or drop shares.")
        return None
    if mode is DataParallel.WSP_SPLIT:   # the VWs' layouts as for "wsp"; shares per VW
        return None if shares is None else _int_shares(shares)
    if plans or plan_fn is not None or allocation is not None:
        raise ValueError("HetSeq gives every device the whole model, so it takes no plan and "
                         "no allocation. Received: data_parallel='hetseq' with a "
                         f"{'plan' if plans or plan_fn is not None else 'allocation'}; pass "
                         "only the cluster (and shares, if chosen by hand).")
    # clock_distance > 0: one-device VWs under WSP with split batches (split_plans).
    if n_m not in (None, 1):
        raise ValueError("HetSeq mode has one batch in flight. Received: n_m="
                         f"{n_m}; leave n_m unset.")
    if not has_cluster:
        raise ValueError("HetSeq mode needs the cluster's devices. Received: cluster=None and "
                         "no TF_CONFIG; pass a hetpipe_tf Cluster (e.g. Cluster.local).")
    if compensation is not None and compensation != Compensation.NONE:
        raise ValueError(
            "HetSeq mode takes no staleness compensation (its steps are synchronous; with "
            "clock_distance > 0 its one-device VWs run at N_m = 1 under WSP's bound). "
            "Received: data_parallel='hetseq' with "
            f"compensation={getattr(compensation, 'value', compensation)!r}; drop "
            "compensation.")
    return None if shares is None else _int_shares(shares)


def _int_shares(shares: Any) -> tuple[int, ...]:
    if isinstance(shares, (str, bytes)) or not isinstance(shares, Sequence) or not shares:
        raise ValueError(f"shares must be a list of per-device batch sizes. Received: "
                         f"shares={shares!r}; pass e.g. shares=[16, 16, 16, 8].")
    return check_share_sizes(shares)


def check_loss_reduction(model) -> None:
    """Weighting a share's loss by n_k / N is exact for losses that average over the share
    (Keras' default "sum_over_batch_size", or "mean"); a Loss object with another reduction
    is refused."""
    pending = [getattr(model, "loss", None)]
    while pending:
        loss = pending.pop()
        if isinstance(loss, dict):
            pending.extend(loss.values())
        elif isinstance(loss, (list, tuple)):
            pending.extend(loss)
        elif isinstance(loss, keras.losses.Loss) and loss.reduction not in (
                "sum_over_batch_size", "mean"):
            raise ValueError(
                "HetSeq weights each share's loss by its share of the batch, which equals "
                "the whole batch's loss only for a loss that averages over the batch. "
                f"Received: {type(loss).__name__} with reduction={loss.reduction!r}; use "
                "reduction='sum_over_batch_size' (the default).")


def plan_shares(model, cluster, batch_size: int, given: tuple[int, ...] | None) -> Shares:
    """The devices' shares of `batch_size` (module docstring)."""
    from hetpipe_tf.partitioner.layer_graph import LayerGraph
    from hetpipe_tf.partitioner.planner import measurable_devices
    from hetpipe_tf.partitioner.profiling import profile_model

    devices = cluster.devices
    if given is not None and len(given) != len(devices):
        raise ValueError(f"Shares given by hand need one size per device of the cluster. "
                         f"Received: shares={list(given)} for {len(devices)} devices "
                         f"({', '.join(d.name for d in devices)}).")
    if batch_size < len(devices):   # refused before profiling
        choose_shares(batch_size, uniform_speeds([d.name for d in devices]))
    types = sorted({d.type_name for d in devices})
    # Measured also for given shares: their predicted times are printed.
    profile = profile_model(LayerGraph.from_model(model), batch_size, types,
                            measure_on=measurable_devices(devices))
    # Devices hold weights and gradients; the one optimizer keeps its slots on the host.
    speeds = speeds_from_profile(profile, devices, cluster)
    if given is not None:
        return given_shares(given, speeds, batch_size)
    return choose_shares(batch_size, speeds)


def build_hetseq(options, model, program, batch_size: int, update_metrics, strategy):
    """The HetSeq executor of `model` over the cluster's devices (module docstring);
    `options`: the strategy's `StrategyOptions`."""
    from hetpipe_tf.strategy.planning import resolve_cluster

    check_loss_reduction(model)
    cluster = resolve_cluster(options.layout.cluster)
    with tf.init_scope():
        shares = plan_shares(model, cluster, batch_size, options.data_parallel.shares)
    print(f"HetSeq for {model.name}: {shares.table()}")   # the shares chosen and why
    stages = [ShareStage(program, d.tf_device, d.emulated_speed_factor, model)
              for d in cluster.devices]
    states = training_state.OptimizerStates(model, strategy, 1)
    with tf.init_scope():
        own = [stages[0].trainable]
        (optimizer,) = states.for_virtual_worker(own, own)
    # No plan: the strategy created the model's variables on the host; updates run there.
    weights = StageWeights(host_cpu_device(), stages[0].trainable, stages[0].versioned_nt, optimizer, 1,
                           counter=model.optimizer.iterations)
    return HetSeqExecutor(stages, weights, shares, update_metrics,
                          on_run_start=states.seed, on_run_end=states.merge)


# --- split batches over virtual workers under WSP (ps/split.py) ---------------------------
def split_shares(options, plans: Sequence[Any], batch_size: int) -> Shares:
    """The VWs' shares of `batch_size` from their plans' throughput (or `shares` given by
    hand, one per VW), printed with the VWs; refused before training when they cannot be
    used."""
    from hetpipe_tf.partitioner.shares import speeds_from_plans
    from hetpipe_tf.ps.split import split_description

    if options.schedule.synchronous:
        raise ValueError(
            "Split batches run each VW's share as one asynchronous minibatch. Received: "
            f"data_parallel={options.data_parallel.mode.value!r} with a synchronous "
            "schedule; drop schedule, or use data_parallel='wsp'.")
    given = options.data_parallel.shares
    if given is not None and len(given) != len(plans):
        raise ValueError(f"Split batches need one share per virtual worker. Received: "
                         f"shares={list(given)} for {len(plans)} VWs; give {len(plans)}.")
    speeds = speeds_from_plans(plans)
    shares = (given_shares(given, speeds, batch_size) if given is not None
              else choose_shares(batch_size, speeds))
    print(split_description(shares, plans))   # the shares chosen and why
    return shares


def whole_batch_note(plans: Sequence[Any], batch_size: int) -> str | None:
    """What split batches would predict against the default dispatch, for VWs of unequal
    pace (logged by the WSP layout; None when their pace is equal or the batch too small)."""
    from hetpipe_tf.partitioner.shares import ShareError, speeds_from_plans
    from hetpipe_tf.ps.split import dispatch_comparison

    try:   # a note: never in the way of training
        speeds = speeds_from_plans(plans)
        if len({s.seconds_per_sample for s in speeds}) < 2:
            return None
        shares = choose_shares(batch_size, speeds)
    except ShareError:
        return None
    return (f"Virtual workers of unequal pace take whole batches (data_parallel='wsp'); "
            f"data_parallel='wsp_split' would give them shares {list(shares.sizes)}. "
            + dispatch_comparison(shares))
