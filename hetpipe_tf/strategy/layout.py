"""A model's layout: its virtual workers' plans, N_m and D, fixed at its first fit.

The strategy's options say what the user gave (plans, a planning callable, or nothing: the
planner's); what only a model can tell (its layers, the batch size, the N_m the
time-to-accuracy rule picks for the plans made, and under a cluster model the D and
allocation picked with it) is this per-model value, made once at the model's first traced
train step and kept by the strategy for that model (a new `compile()` rebuilds the executor
on the same layout).
"""

from __future__ import annotations

import dataclasses
from typing import Any

import tensorflow as tf

from hetpipe_tf.partitioner.plan import Plan
from hetpipe_tf.strategy.validation import check_n_m, check_plans


@dataclasses.dataclass(frozen=True)
class Picked:
    """What the planner picked by predicted time to accuracy under a cluster model
    (strategy/planning.py `plan_for_time_to_accuracy`); None where the user gave it."""

    clock_distance: int | None = None
    allocation: Any = None   # an AllocationPolicy


@dataclasses.dataclass(frozen=True)
class Layout:
    """One plan per virtual worker (none for HetSeq's own executor), their N_m, WSP's D
    between them (the one given, or picked), and what the planner picked."""

    plans: tuple
    n_m: int
    clock_distance: int = 0
    picked: Picked | None = None

    @property
    def plan(self) -> Plan | None:
        return self.plans[0] if len(self.plans) == 1 else None


def layout_for(options, model, batch_size: int) -> Layout:
    """The layout of `model` under `options` (`StrategyOptions`): the plans given, or made
    now (a planning callable, or the planner), checked against N_m and Max_m."""
    d = options.wsp.clock_distance
    if options.hetseq:   # every device the whole model, a share of each batch
        return Layout((), 1, d)
    pipeline = options.pipeline
    if options.layout.plans:
        return Layout(options.layout.plans, pipeline.n_m, d)
    picked = None
    with tf.init_scope():   # inside Keras' train-function trace: plan eagerly
        if options.layout.plan_fn is not None:
            got = options.layout.plan_fn(model)
            plans = (got,) if isinstance(got, Plan) else check_plans(got)
        else:
            from hetpipe_tf.strategy.planning import plan_layout
            plans, picked = plan_layout(options, model, batch_size)
            if picked is not None and picked.clock_distance is not None:
                d = picked.clock_distance
    n_m = pipeline.n_m if pipeline.n_m is not None else min(p.n_m for p in plans)
    for p in plans:
        check_n_m(n_m, pipeline.max_m, p)
    return Layout(tuple(plans), n_m, d, picked)
