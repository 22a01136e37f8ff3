"""experiments/keras_programs.py: what the docs promise, on the cheap programs.

With the planner at N_m = 1 and compensation "none", a program with Dropout (the
imbalanced-classification MLP) and one with augmentation layers in the model (RandomFlip,
RandomRotation, plus Dropout and BatchNormalization) have after 2 epochs plain Keras's
weights; under the default switch they run unchanged (finite losses, evaluate and predict
work). The other programs' figures are printed by `python -m experiments.keras_programs`.
"""

import importlib
import math
import sys

import pytest
from absl import flags

MODULE = "experiments.keras_programs"


@pytest.fixture(scope="module")
def kp():
    """The binary's module, its absl flags defined for this file's tests only: other
    binaries run in this process afterwards (tests/benchmarks/binaries.run_main) define
    flags of the same names."""
    before = set(flags.FLAGS)
    sys.modules.pop(MODULE, None)
    try:
        yield importlib.import_module(MODULE)
    finally:
        for name in set(flags.FLAGS) - before:
            if name in flags.FLAGS:   # a short name goes with its flag
                delattr(flags.FLAGS, name)
        sys.modules.pop(MODULE, None)


@pytest.mark.parametrize("program", ["imbalanced_mlp", "augmentation"])
def test_a_program_with_the_planner_at_one_microbatch_equals_plain_keras(kp, program):
    plain, ours = kp.run(program, "plain"), kp.run(program, "none")
    assert kp.max_dw(plain.weights, ours.weights) <= 1e-6
    assert ours.losses == pytest.approx(plain.losses, abs=1e-6)
    assert kp.runs_unchanged(ours)


def test_a_program_runs_unchanged_under_the_default_switch(kp):
    result = kp.run("imbalanced_mlp", "default")
    assert kp.runs_unchanged(result), result.losses
    assert len(result.losses) == 2 and all(math.isfinite(v) for v in result.losses)
