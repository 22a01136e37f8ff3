"""What the strategy chose for a model, as the short block printed at its first fit.

`describe` is a pure function of the strategy's options, the model's layout, its training
mode and the cluster: the cluster's hosts and devices (emulated ones labelled), each
virtual worker's stages (first..last layer, how many, on which device), N_m and why, the
clock distance D (several VWs) and the allocation policy when the planner picked them under
a cluster model (strategy/planning.py), the schedule, and the staleness compensation, with why
when it is the default and whether anything is stale for it to act on. `print_summary`
prints it through Keras' own output, so `fit(verbose=0)` silences it (docs/strategy.md
"What the strategy prints").
"""

from __future__ import annotations

from typing import Any, Sequence

from hetpipe_tf.strategy.compensation import implied_staleness, optimizer_adjustment, predicts
from hetpipe_tf.strategy.data_parallel import DataParallel
from hetpipe_tf.strategy.planning import PICK_ALLOCATIONS as _ALLOCATIONS
from hetpipe_tf.strategy.planning import PICK_DISTANCES as _DISTANCES

# What each training mode (strategy/modes.py) does, by class name.
_MODES = {
    "HetSeq": "every device trains the whole model on its share of each batch",
    "VirtualWorkers": "virtual workers under WSP through parameter servers",
    "SynchronousPipeline": "one virtual worker, one update per minibatch",
    "OneVirtualWorker": "one pipelined virtual worker",
}


def describe(options, layout, mode, cluster=None, *, model_name: str = "",
             executor: str = "", shares: Sequence[int] | None = None) -> str:
    """The block (no trailing newline) for `options` (`StrategyOptions`), `layout`
    (`Layout`), `mode` (a `TrainingMode` or its class) and `cluster` (a hetpipe_tf
    `Cluster`, or None when only plans were given). `executor`: the executor's class name;
    `shares`: the per-device (HetSeq) or per-VW (split batches) shares of a batch."""
    name = mode.__name__ if isinstance(mode, type) else type(mode).__name__
    vws = len(layout.plans)
    head = f"HetPipeStrategy for {model_name!r}: " if model_name else "HetPipeStrategy: "
    detail = "; ".join(x for x in (_MODES.get(name, ""), executor) if x)
    lines = [f"{head}{name}" + (f" ({detail})" if detail else "")]
    lines += _cluster_lines(cluster)
    for w, plan in enumerate(layout.plans):
        lines.append(f"  VW {w}: {plan.num_stages} stage{'s' if plan.num_stages > 1 else ''}")
        for s in plan.stages:
            layers = (s.layer_names[0] if s.num_layers == 1
                      else f"{s.layer_names[0]}..{s.layer_names[-1]}")
            count = f"{s.num_layers} layer{'s' if s.num_layers > 1 else ''}"
            lines.append(f"    stage {s.index}: {layers} ({count}) on {_stage_device(s)}")
    if not layout.plans:
        lines.append("  every device: the whole model"
                     + (f", shares {list(shares)} of each batch" if shares else ""))
    elif shares and options.splits_batches:
        lines.append(f"  every batch split over the VWs: shares {list(shares)}")
    lines.append(f"  N_m = {layout.n_m} ({_n_m_reason(options, layout)})")
    picked = layout.picked.allocation if layout.picked is not None else None
    if picked is not None:
        lines.append(f"  allocation: {picked.name} ({_PICKED} over "
                     f"{', '.join(_ALLOCATIONS)} where the cluster admits several VWs; pass "
                     "allocation= to choose)")
    if vws > 1:
        why = (f"; {_PICKED} over D = {', '.join(map(str, _DISTANCES))}; pass "
               "clock_distance= to choose" if _d_picked(layout) else "")
        lines.append(f"  D = {layout.clock_distance} (clock distance between the "
                     f"{vws} VWs{why}), parameters placed {options.wsp.placement.value}")
    lines.append(f"  schedule: {_schedule(options)}")
    lines.append(f"  compensation: {_compensation(options, layout)}")
    return "\n".join(lines)


_PICKED = ("picked with N_m by predicted time to accuracy in the cluster model "
           "(strategy/pick.py)")


def _d_picked(layout) -> bool:
    return layout.picked is not None and layout.picked.clock_distance is not None


def _cluster_lines(cluster) -> list[str]:
    if cluster is None:
        return ["  cluster: none given (the devices are the plans')"]
    hosts = [h for h in cluster.hosts if h.devices]
    lines = [f"  cluster: {len(hosts)} host{'s' if len(hosts) != 1 else ''}, "
             f"{len(cluster.devices)} device{'s' if len(cluster.devices) != 1 else ''}"]
    for h in hosts:
        devices = []
        for d in h.devices:
            note = ""
            if cluster.device_is_emulated(d):
                note = (", EMULATED" if d.emulated_speed_factor == 1.0 else
                        f", EMULATED at {d.emulated_speed_factor:g}x speed")
            devices.append(f"{d.name} ({d.type_name} on {d.tf_device}{note})")
        lines.append(f"    {h.name}: " + ", ".join(devices))
    return lines


def _stage_device(s) -> str:
    parts = [] if s.device_type == "MANUAL" else [s.device_type]
    if s.tf_device != s.device:
        parts.append(f"on {s.tf_device}")
    if s.emulated_speed_factor != 1.0:
        parts.append(f"EMULATED at {s.emulated_speed_factor:g}x speed")
    return s.device + (f" ({', '.join(parts)})" if parts else "")


def _n_m_reason(options, layout) -> str:
    if options.data_parallel.mode is DataParallel.HETSEQ:
        return "one minibatch at a time: HetSeq mode"
    if options.schedule.synchronous:
        return "one minibatch at a time: synchronous schedule"
    if options.pipeline.n_m is not None:
        plans = options.layout.plans
        return "the plan's" if plans and plans[0].n_m == options.pipeline.n_m else "given"
    if options.layout.plan_fn is not None:
        return "the plans'"
    if options.clock.virtual:   # strategy/planning.py: the pick in the cluster model
        return ("picked by predicted time to accuracy in the cluster model: its simulated "
                "time per minibatch x the epochs local staleness costs (strategy/pick.py), "
                "jointly with what else was not given; pass n_m= to choose")
    return ("chosen by the planner: at most min(Max_m, stages of a VW), lowered where local "
            "staleness costs more epochs than the fuller pipeline saves time; pass n_m= to "
            "choose")


def _schedule(options) -> str:
    if options.hetseq:
        return "HetSeq, one synchronous update per batch"
    sched = options.schedule
    if not sched.synchronous:
        return "HetPipe, N_m minibatches in flight per VW, one update per minibatch"
    label = {"gpipe": "GPipe", "1f1b": "1F1B"}.get(sched.schedule.value, sched.schedule.value)
    m = sched.micro_batches
    text = (f"{label}, {m} micro-batch{'es' if m != 1 else ''} per minibatch, one update "
            "per minibatch")
    return text + (", re-materialized" if sched.rematerialize else "")


def _compensation(options, layout) -> str:
    chosen = options.compensation
    value, vws = chosen.value, max(len(layout.plans), 1)
    d = layout.clock_distance
    default = (" (the default in HetSeq mode)"
               if options.data_parallel.mode is DataParallel.HETSEQ
               else " (the default where weights can be stale)")
    text = value.name + (default if chosen.by_default else "")
    if value.name == "NONE":
        return text
    acts = (optimizer_adjustment(value, layout.n_m, vws, d) is not None
            or predicts(value, layout.n_m))
    if not acts:
        return text + ", inactive: nothing is stale here"
    return (text + f", implied staleness {implied_staleness(layout.n_m, vws, d)}; "
            "compensation=\"none\" trains by the paper's rules exactly (docs/convergence.md)")


def print_summary(text: str, verbose: Any) -> None:
    """Print `text` through Keras' own output unless `verbose` (the running fit's) is 0 or
    None (no fit runs: train_on_batch prints nothing)."""
    if verbose is None or verbose == 0:
        return
    from hetpipe_tf._shim import keras_trainer
    keras_trainer.print_msg(text)
