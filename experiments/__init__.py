"""Experiment programs (paper reproduction, simulator validation): not installed."""
