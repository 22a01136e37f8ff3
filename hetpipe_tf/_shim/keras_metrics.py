"""Keras 3.15 internals for a metric the strategy adds to a model (the virtual clock's)."""

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
