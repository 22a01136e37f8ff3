"""Mid-epoch checkpoints and in-process resume (issue 8 points 2 and 6, docs/state.md).

The strategy drains the pipeline before `model.save_weights`/`model.get_weights`, so a
`BackupAndRestore(save_freq=k)` or `ModelCheckpoint(save_freq=k)` taken in the middle of an
epoch holds the state as of that step. Keras 3's `BackupAndRestore` does NOT skip the steps
already done on a mid-epoch resume: it restores the backed-up weights and optimizer state
and restarts the interrupted epoch from its first step (checked on plain Keras below: the
iteration count of the resumed flow is the backup's plus a whole epoch). The strategy must
do the same; references are plain Keras (N_m = 1, exact) and, at N_m = 2, the independent
staleness reference of tests/strategy/helpers.py, where every drain starts a run.
"""

import copy
import json
import os
import shutil

import keras
import numpy as np
import pytest

from hetpipe_tf.strategy import HetPipeStrategy, even_plan
from tests.strategy.helpers import (DEVICES, assert_weights_close, regression_data,
                                    skip_model, staleness_reference)

BATCH = 8
STEPS = 8           # minibatches per epoch (64 examples)
EPOCHS = 2
SAVE_FREQ = 3       # backups after global minibatches 3, 6, 9, 12, ...
CRASH = (1, 4)      # (epoch, batch): minibatch 13, one after the backup of minibatch 12

OPTIMIZERS = {
    "sgd": lambda: keras.optimizers.SGD(0.05),
    "adam": lambda: keras.optimizers.Adam(0.01),
}


class _RaiseAt(keras.callbacks.Callback):
    def __init__(self, epoch, batch):
        super().__init__()
        self.at, self.epoch = (epoch, batch), None

    def on_epoch_begin(self, epoch, logs=None):
        self.epoch = epoch

    def on_train_batch_end(self, batch, logs=None):
        if (self.epoch, batch) == self.at:
            raise RuntimeError("preempted")


class _Steps(keras.callbacks.Callback):
    """Counts the minibatches of one fit and notes after which ones the backup was written
    (the metadata BackupAndRestore writes names the epoch and batch it was saved at)."""

    def __init__(self, backup_dir):
        super().__init__()
        self.metadata = os.path.join(backup_dir, "training_metadata.json")
        self.steps, self.saves, self.epoch_starts, self.epoch = 0, [], [], None

    def on_epoch_begin(self, epoch, logs=None):
        self.epoch = epoch
        self.epoch_starts.append(self.steps + 1)

    def on_train_batch_end(self, batch, logs=None):
        self.steps += 1
        if os.path.exists(self.metadata):
            with open(self.metadata) as f:
                saved = json.load(f)
            if (saved["epoch"], saved["batch"]) == (self.epoch, batch):
                self.saves.append(self.steps)


def _backup_state(path, make):
    """Weights and optimizer variables of a backup file, read by plain Keras."""
    model = skip_model(0)
    model.compile(make(), "mse")
    model.optimizer.build(model.trainable_variables)
    model.load_weights(path)
    return model.get_weights(), [v.numpy() for v in model.optimizer.variables]


def _crash(model, backup_dir, x, y):
    """fit with a backup every SAVE_FREQ minibatches until a callback raises at CRASH.
    Returns the callback, the fit's step record and a copy of the backup directory as it
    was after the crash."""
    backup = keras.callbacks.BackupAndRestore(backup_dir, save_freq=SAVE_FREQ)
    steps = _Steps(backup_dir)
    with pytest.raises(RuntimeError, match="preempted"):
        model.fit(x, y, batch_size=BATCH, epochs=EPOCHS, shuffle=False, verbose=0,
                  callbacks=[backup, steps, _RaiseAt(*CRASH)])
    kept = backup_dir.rstrip("/") + "_after_crash"
    shutil.copytree(backup_dir, kept)
    return backup, steps, kept


def _resume(model, backup, x, y):
    """fit again with `backup` (restores it, then trains to the end)."""
    steps = _Steps(backup.backup_dir)
    model.fit(x, y, batch_size=BATCH, epochs=EPOCHS, shuffle=False, verbose=0,
              callbacks=[backup, steps])
    return steps


def _flow(model, backup_dir, x, y):
    """The interrupted fit, then the in-process resume with the same BackupAndRestore.
    Returns both fits' step records and the backup file as it was after the crash."""
    backup, first, kept = _crash(model, backup_dir, x, y)
    second = _resume(model, backup, x, y)
    return first, second, os.path.join(kept, "latest.weights.h5")


def _strategy_model(make, n_m, seed=0):
    strategy = HetPipeStrategy(plan=even_plan(skip_model(seed), DEVICES[:2], n_m=n_m),
                               compensation="none")   # the paper's rule: the reference
    with strategy.scope():
        model = skip_model(seed)
        model.compile(make(), "mse")
    return strategy, model


@pytest.mark.parametrize("name", sorted(OPTIMIZERS))
def test_mid_epoch_backup_and_in_process_resume_equal_plain_keras(tmp_path, name):
    make = OPTIMIZERS[name]
    x, y = regression_data(BATCH * STEPS, 21)
    plain = skip_model(0)
    plain.compile(make(), "mse")
    p_first, p_second, p_kept = _flow(plain, str(tmp_path / "plain" / "backup"), x, y)
    # What Keras 3 does: the backup of minibatch 12 is restored and epoch 1 restarts from
    # its first step (8 more updates), so 12 + 8 updates, not 13 + 4 nor 16.
    assert p_first.saves == [3, 6, 9, 12] and p_first.steps == 13
    assert p_second.steps == STEPS and p_second.epoch_starts == [1]
    assert int(plain.optimizer.iterations.numpy()) == 12 + STEPS

    strategy, model = _strategy_model(make, n_m=1)
    with strategy:
        first, second, kept = _flow(model, str(tmp_path / "hetpipe" / "backup"), x, y)
        assert (first.saves, first.steps, second.steps) == ([3, 6, 9, 12], 13, STEPS)
        # The backup holds minibatch 12's state (weights and optimizer), not epoch 1's start.
        w_kept, opt_kept = _backup_state(kept, make)
        w_plain, opt_plain = _backup_state(p_kept, make)
        assert_weights_close(w_kept, w_plain)
        assert len(opt_kept) == len(opt_plain)
        for a, b in zip(opt_kept, opt_plain):
            np.testing.assert_allclose(a, b, rtol=1e-5, atol=1e-6)
        assert int(opt_kept[0]) == 12   # iterations
        assert_weights_close(model.get_weights(), plain.get_weights())
        assert int(model.optimizer.iterations.numpy()) == 12 + STEPS
        for a, b in zip(model.optimizer.variables, plain.optimizer.variables):
            np.testing.assert_allclose(a.numpy(), b.numpy(), rtol=1e-5, atol=1e-6)


def _seeded(make, values, made):
    """`make()` whose variables take `values` when built (the backup's optimizer state)."""
    def factory():
        opt = make()
        build = opt.build

        def seeded_build(variables):
            build(variables)
            if values is not None:
                for v, a in zip(opt.variables, values):
                    v.assign(a)
        opt.build = seeded_build
        made.append(opt)
        return opt
    return factory


def _runs(steps):
    """First minibatch (1-based) of every run of one fit: its start, every epoch start
    (Keras drains at epoch ends) and the minibatch after every backup (saving drains)."""
    return {1} | set(steps.epoch_starts) | {s + 1 for s in steps.saves}


def test_pipelined_backup_and_resume_equal_the_staleness_reference(tmp_path):
    """N_m = 2, Adam: the backup holds minibatch 12's state as the staleness reference
    computes it, and the resumed epoch continues from it with a new run at every drain."""
    make = OPTIMIZERS["adam"]
    x, y = regression_data(BATCH * STEPS, 22)
    batches = [(x[i:i + BATCH], y[i:i + BATCH]) for i in range(0, len(x), BATCH)]
    strategy, model = _strategy_model(make, n_m=2)
    w0 = model.get_weights()
    with strategy:
        first, second, kept = _flow(model, str(tmp_path / "backup"), x, y)
        final, iterations = model.get_weights(), int(model.optimizer.iterations.numpy())
    assert first.saves == [3, 6, 9, 12] and second.epoch_starts == [1]
    # Before the crash: epoch 0, then minibatches 0..3 of epoch 1 (backed up at 12).
    made = []
    ref_w, _ = staleness_reference(lambda: skip_model(0), w0, _seeded(make, None, made),
                                   batches + batches[:4], 2, _runs(first))
    ref_opt = [v.numpy() for v in made[-1].variables]
    w_kept, opt_kept = _backup_state(kept, make)
    assert_weights_close(w_kept, ref_w)
    for a, b in zip(opt_kept, ref_opt):
        np.testing.assert_allclose(a, b, rtol=1e-5, atol=1e-6)
    # The resume: the backup's state, then all of epoch 1 again.
    ref_final, _ = staleness_reference(lambda: skip_model(0), w_kept,
                                       _seeded(make, opt_kept, []), batches, 2,
                                       _runs(second))
    assert_weights_close(final, ref_final)
    assert iterations == 12 + STEPS


def test_pipelined_in_process_resume_equals_a_resume_in_a_fresh_model(tmp_path):
    """N_m = 2, Adam: resuming in the process that was interrupted equals building a new
    model and strategy and resuming from the same backup with the same save points (a
    copy of the interrupted callback: it counts minibatches since its last save)."""
    make = OPTIMIZERS["adam"]
    x, y = regression_data(BATCH * STEPS, 23)
    backup_dir = str(tmp_path / "backup")
    strategy, model = _strategy_model(make, n_m=2)
    with strategy:
        backup, _, kept = _crash(model, backup_dir, x, y)
        twin = copy.copy(backup)
        twin.delete_checkpoint = False   # the in-process resume reads the directory next
        fresh_strategy, fresh = _strategy_model(make, n_m=2, seed=5)   # other weights
        with fresh_strategy:
            in_fresh = _resume(fresh, twin, x, y)
            resumed_fresh = fresh.get_weights()
        shutil.rmtree(backup_dir)
        shutil.copytree(kept, backup_dir)   # the backup as the crash left it
        in_process = _resume(model, backup, x, y)
        assert (in_fresh.saves, in_fresh.steps) == (in_process.saves, in_process.steps)
        assert in_process.saves == [2, 5, 8]   # 1 counted before the crash, then every 3
        assert_weights_close(model.get_weights(), resumed_fresh, atol=1e-6)


def test_a_mid_epoch_model_checkpoint_holds_that_steps_state_with_two_vws(tmp_path):
    """2 VWs x 1 stage, N_m = 1, D = 0: the weights file of ModelCheckpoint(save_freq=4)
    equals model.get_weights() read in a callback at the same step, and its optimizer
    counts the updates applied by then (not the epoch start's)."""
    x, y = regression_data(12 * BATCH, 24)
    plans = [even_plan(skip_model(0), DEVICES[w:w + 1], n_m=1) for w in range(2)]
    strategy = HetPipeStrategy(plan=plans, clock_distance=0)
    with strategy.scope():
        model = skip_model(0)
        model.compile(keras.optimizers.SGD(0.05, momentum=0.9), "mse")
    w0 = model.get_weights()
    pattern = str(tmp_path / "ck-{epoch}-{batch}.weights.h5")
    seen = {}
    read = keras.callbacks.LambdaCallback(on_train_batch_end=lambda b, logs: seen.update(
        {b + 1: model.get_weights()} if (b + 1) % 4 == 0 else {}))
    checkpoint = keras.callbacks.ModelCheckpoint(pattern, save_weights_only=True,
                                                 save_freq=4)
    with strategy:
        model.fit(x, y, batch_size=BATCH, epochs=1, shuffle=False, verbose=0,
                  callbacks=[checkpoint, read])
    assert sorted(seen) == [4, 8, 12]
    previous = w0
    for step in (4, 8, 12):
        path = pattern.format(epoch=1, batch=step)
        assert os.path.exists(path), os.listdir(tmp_path)
        weights, opt = _backup_state(path, lambda: keras.optimizers.SGD(0.05, momentum=0.9))
        assert_weights_close(weights, seen[step], atol=0)
        assert int(opt[0]) == step                 # every update of both VWs by then
        assert max(np.abs(a - b).max() for a, b in zip(weights, previous)) > 1e-4
        previous = weights
