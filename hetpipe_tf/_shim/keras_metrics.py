"""Keras 3.15 internals for metrics: a metric the strategy adds to a model (the virtual
clock's), and whether a metric's state variables exist yet (strategy/vw_metrics.py)."""

from __future__ import annotations

from typing import Any


def track_metric(model: Any, metric: Any) -> None:
    """Make `metric` one of `model.metrics` (its result then appears in every log)."""
    # Reason: Keras lists a model's own metrics from `_metrics`, filled by attribute
    # tracking, which a built (locked) model no longer allows.
    if metric not in model._metrics:
        model._metrics.append(metric)


def replace_tracked_metric(model: Any, old: Any, new: Any) -> None:
    """Put `new` where `old` is among `model.metrics`."""
    # Reason: as track_metric.
    model._metrics[:] = [new if m is old else m for m in model._metrics]
    if new not in model._metrics:
        model._metrics.append(new)


def state_built(metric: Any) -> bool:
    """Whether `metric` has made all its state variables (some make them at their first
    update, from the shapes they see)."""
    # Reason: AUC, FBetaScore and R2Score (keras/src/metrics) record that in a private
    # `_built`, set by their `_build` at the first update; others make theirs in __init__.
    return getattr(metric, "_built", True) is not False
