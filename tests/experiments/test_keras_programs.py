"""experiments/keras_programs.py: what the docs promise, on the cheap programs.

With the planner at N_m = 1 and compensation "none", a program with Dropout (the
imbalanced-classification MLP) and one with augmentation layers in the model (RandomFlip,
RandomRotation, plus Dropout and BatchNormalization) have after 2 epochs plain Keras's
weights; under the default switch they run unchanged (finite losses, evaluate and predict
work). The other programs' figures are printed by `python -m experiments.keras_programs`.
"""

import math

import pytest

from experiments import keras_programs as kp


@pytest.mark.parametrize("program", ["imbalanced_mlp", "augmentation"])
def test_a_program_with_the_planner_at_one_microbatch_equals_plain_keras(program):
    plain, ours = kp.run(program, "plain"), kp.run(program, "none")
    assert kp.max_dw(plain.weights, ours.weights) <= 1e-6
    assert ours.losses == pytest.approx(plain.losses, abs=1e-6)
    assert kp.runs_unchanged(ours)


def test_a_program_runs_unchanged_under_the_default_switch():
    result = kp.run("imbalanced_mlp", "default")
    assert kp.runs_unchanged(result), result.losses
    assert len(result.losses) == 2 and all(math.isfinite(v) for v in result.losses)
