"""The compensation default on recurrent models (`time_to_accuracy --mode=recurrent`): an LSTM
seq2seq and a GRU tagger (hetpipe_tf.models), each trained plain and on a 2-stage pipeline
of 2 logical CPU devices at N_m = 2 with the strategy's default compensation and named
ones, from the same initial weights and data order; `fit` with validation data ends a
pipeline run at every epoch (run boundaries: the predictor's d restarts from zero). Rows:
the training loss of each epoch, and the last epoch's against compensation none."""

from __future__ import annotations

from typing import Callable

from experiments import _study

# name -> (train examples, validation examples, batch size, data(n, seed), model())
WORKLOADS: dict[str, tuple] = {}


def _workloads() -> dict[str, tuple]:
    from hetpipe_tf import models

    if not WORKLOADS:
        WORKLOADS.update({
            "seq2seq": (3072, 256, 32, models.seq2seq_data, models.lstm_seq2seq),
            "tagger": (4096, 512, 32, models.tagging_data, models.gru_tagger)})
    return WORKLOADS


def losses(workload: str, optimizer: tuple[str, dict], setting: str, epochs: int,
           weights0: list, seed: int = 0, examples: int = 0) -> tuple[list[float], object]:
    """(training loss per epoch, the compensation used) of one row: setting "plain" (Keras,
    one device), "default" (no compensation given) or a compensation's name; `examples`
    > 0 trains on that many (and validates on a quarter as many) instead of the
    workload's."""
    import tensorflow as tf

    import hetpipe_tf as hp

    n, n_val, batch, data, build = _workloads()[workload]
    if examples:
        n, n_val = examples, max(examples // 4, 1)
    x, y = data(n, 0)
    xv, yv = data(n_val, 1)
    ds = (tf.data.Dataset.from_tensor_slices((x, y)).shuffle(n, seed=seed)
          .batch(batch, drop_remainder=True))
    val = tf.data.Dataset.from_tensor_slices((xv, yv)).batch(256)
    strategy = None
    if setting != "plain":
        strategy = hp.HetPipeStrategy(hp.Cluster.local(["LOCAL_CPU"] * 2), n_m=2,
                                      compensation=None if setting == "default" else setting)
    with _study.compiled(build, optimizer, weights0, strategy) as model:
        history = model.fit(ds, validation_data=val, epochs=epochs, verbose=0)
        chosen = strategy.extended.compensation.value if strategy is not None else None
    return history.history["loss"], chosen


def table(workloads, optimizers: dict[str, tuple], settings, epochs: int, seed: int = 0,
          log: Callable[[str], None] = print, examples: int = 0) -> list[tuple[str, ...]]:
    """Rows (header first) of workload x optimizer x setting."""
    import keras

    rows = [("workload", "optimizer", "setting", "loss per epoch", "last vs none")]
    for workload in workloads:
        keras.utils.set_random_seed(seed)
        weights0 = _workloads()[workload][4]().get_weights()
        for opt_name, opt in optimizers.items():
            results = {}
            for setting in settings:
                per_epoch, chosen = losses(workload, opt, setting, epochs, weights0, seed,
                                           examples)
                label = f"default ({chosen})" if setting == "default" else setting
                results[setting] = (label, per_epoch)
                log(f"  done: {workload} {opt_name} {label}")
            none = results.get("none", (None, None))[1]
            for label, per_epoch in results.values():
                vs = "" if none is None else f"{per_epoch[-1] - none[-1]:+.3f}"
                rows.append((workload, opt_name, label,
                             " / ".join(f"{v:.3f}" for v in per_epoch), vs))
    return rows
