"""The switch suite's scripts (issue 19 point 5): short Keras scripts a MirroredStrategy user
writes, each run under four settings that differ only in the strategy line.

Settings (`SETTINGS`):
- `plain`: no strategy (Keras' default one), batch B = 8, SGD(lr);
- `mirrored`: `tf.distribute.MirroredStrategy` on 2 logical CPUs, global batch 2B, SGD(2 lr);
- `hetpipe_1vw`: `HetPipeStrategy(plan=even_plan(model, 2 devices, n_m=1))`, batch B, SGD(lr);
- `hetpipe_2vw`: two plans (2 stages each, 4 devices), N_m = 1, D = 0, batch B, SGD(lr);
- `hetpipe_1vw_nm2`, `hetpipe_2vw_nm2`: the same at N_m = 2 (pipelined: stale weights, no
  reference; the scripts must finish and keep their own promises);
- `hetseq`: `HetPipeStrategy(Cluster.local(2 CPUs), data_parallel="hetseq", shares=[5, 3])`,
  batch B, SGD(lr): one update per batch, equal to plain Keras.

Why these pairs. One VW at N_m = 1 trains exactly like plain Keras (the paper's special
case). Two VWs at N_m = 1, D = 0 are synchronous data parallelism: each wave both VWs take
one batch of B at the same weights and w_global gets the SUM of their two updates, where
MirroredStrategy averages its replicas' gradients over the global batch of 2B. So for SGD the
two agree when MirroredStrategy has batch 2B and twice the learning rate, and the scripts
take their batch size and learning rate from the setting (`s.batch`, `s.lr`), and step
counts as rows // s.batch. Every script starts from `keras.utils.set_random_seed(0)` (done
by `run`), so fit's shuffling draws the same permutation in every setting and the batches
pair up.

Each script returns a dict of results (weights, history, evaluate, predict, ...);
`max_difference` compares it with its reference setting's. `run` runs one script under one
setting (tests/strategy/test_switch.py and `python -m experiments.switch_table` share it).
"""

from __future__ import annotations

import dataclasses
import glob
import json
import os
import subprocess
import sys
import time
from typing import Any, Callable

import keras
import numpy as np
import tensorflow as tf

from hetpipe_tf.cluster.spec import Cluster
from hetpipe_tf.strategy import HetPipeStrategy, even_plan

DEVICES = ["/job:localhost/replica:0/task:0/device:CPU:%d" % i for i in range(4)]
B, LR, N = 8, 0.05, 64
ROOT = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))


@dataclasses.dataclass(frozen=True)
class Setting:
    name: str
    batch: int
    lr: float
    reference: str | None   # the setting whose results this one must equal
    n_m: int = 1

    def strategy(self, build: Callable[[], keras.Model]):
        """The one line that differs between the settings."""
        if self.name == "plain":
            return tf.distribute.get_strategy()
        if self.name == "mirrored":
            return _mirrored()
        if self.name == "hetseq":
            return _track(HetPipeStrategy(Cluster.local(["LOCAL_CPU"] * 2),
                                          data_parallel="hetseq", shares=[5, 3]))
        probe = build()   # a plan reads the model's layers; one model serves both VWs' plans
        if self.name.startswith("hetpipe_1vw"):
            return _track(HetPipeStrategy(plan=even_plan(probe, DEVICES[:2], n_m=self.n_m)))
        return _track(HetPipeStrategy(plan=[even_plan(probe, DEVICES[0:2], n_m=self.n_m),
                                            even_plan(probe, DEVICES[2:4], n_m=self.n_m)]))


SETTINGS = {s.name: s for s in (Setting("plain", B, LR, None),
                                Setting("mirrored", 2 * B, 2 * LR, None),
                                Setting("hetpipe_1vw", B, LR, "plain"),
                                Setting("hetpipe_2vw", B, LR, "mirrored"),
                                # Pipelined for real: stale weights, so no reference.
                                Setting("hetpipe_1vw_nm2", B, LR, None, n_m=2),
                                Setting("hetpipe_2vw_nm2", B, LR, None, n_m=2),
                                # HetSeq: 2 devices, each batch split 5 + 3, one update.
                                Setting("hetseq", B, LR, "plain"))}

_open: list = []   # HetPipe strategies a script made, closed after it (a user's exit would)
_MIRRORED: list = []


def _mirrored():
    # One instance per process: a second MirroredStrategy in the same process failed its
    # first all-reduce ("Shape mismatch in the collective instance 100") when its model's
    # shapes differed from the first one's (TF 2.21, logical CPUs; plain Keras script).
    if not _MIRRORED:
        _MIRRORED.append(tf.distribute.MirroredStrategy(DEVICES[:2]))
    return _MIRRORED[0]


def _track(strategy):
    _open.append(strategy)
    return strategy


# --- models and data: named layers, seeded initialisers ----------------------------------
def _dense(units, name, seed, activation=None):
    return keras.layers.Dense(units, activation=activation, name=name,
                              kernel_initializer=keras.initializers.GlorotUniform(seed))


def mlp(outputs: int = 1, activation=None) -> keras.Model:
    x = keras.Input((8,), name="x")
    h = _dense(16, "d1", 1, "tanh")(x)
    h = _dense(16, "d2", 2, "tanh")(h)
    return keras.Model(x, _dense(outputs, "out", 3, activation)(h), name="mlp")


def two_inputs() -> keras.Model:
    a, b = keras.Input((8,), name="a"), keras.Input((4,), name="b")
    h = keras.layers.Concatenate(name="cat")([_dense(8, "da", 1, "tanh")(a),
                                             _dense(8, "db", 2, "tanh")(b)])
    h = _dense(8, "d2", 3, "tanh")(h)
    return keras.Model([a, b], _dense(1, "out", 4)(h), name="two_inputs")


def two_outputs() -> keras.Model:
    x = keras.Input((8,), name="x")
    h = _dense(16, "d1", 1, "tanh")(x)
    h = _dense(16, "d2", 2, "tanh")(h)
    return keras.Model(x, {"reg": _dense(1, "reg", 3)(h),
                           "cls": _dense(3, "cls", 4, "softmax")(h)}, name="two_outputs")


def data(n: int = N, seed: int = 0):
    rs = np.random.RandomState(seed)
    x = rs.randn(n, 8).astype("float32")
    y = (np.sin(x[:, :1]) + 0.5 * x[:, 1:2] * x[:, 2:3]).astype("float32")
    return x, y


def labels(x) -> np.ndarray:
    return (np.digitize(x[:, 0], [-0.5, 0.5])).astype("int32")


def _sgd(s: Setting):
    return keras.optimizers.SGD(s.lr)


def _out(model, history=None, **extra) -> dict:
    out = {"weights": [w.copy() for w in model.get_weights()]}
    if history is not None:
        out["history"] = {k: list(v) for k, v in history.history.items()}
        out["epochs"] = list(history.epoch)
    out.update(extra)
    return out


def _compiled(s: Setting, build, loss="mse", **compile_kw):
    strategy = s.strategy(build)
    with strategy.scope():
        model = build()
        model.compile(_sgd(s), loss, **compile_kw)
    return model


def _fit_kw(s: Setting, **kw):
    return dict(batch_size=s.batch, verbose=0, **kw)


# --- the scripts ---------------------------------------------------------------------------
def fit_evaluate_predict_summary(s: Setting, tmp: str) -> dict:
    model = _compiled(s, mlp, metrics=["mae"])
    lines: list[str] = []
    model.summary(print_fn=lambda text, *a, **k: lines.append(text))
    x, y = data()
    h = model.fit(x, y, epochs=2, **_fit_kw(s))
    ev = model.evaluate(x, y, batch_size=s.batch, verbose=0, return_dict=True)
    model.summary(print_fn=lambda text, *a, **k: lines.append(text))
    counts = [ln.split(":", 1)[1].split("(")[0].strip() for ln in "\n".join(lines).splitlines()
              if "params:" in ln and ("Total" in ln or "Trainable" in ln)]
    return _out(model, h, evaluate=ev, predict=model.predict(x, batch_size=s.batch, verbose=0),
                summary_params=counts)


def save_and_load(s: Setting, tmp: str) -> dict:
    model = _compiled(s, mlp)
    x, y = data()
    model.fit(x, y, epochs=1, **_fit_kw(s))
    path = os.path.join(tmp, "x.keras")
    model.save(path)
    return _out(model, predict=model.predict(x, batch_size=s.batch, verbose=0), path=path)


def class_weight(s: Setting, tmp: str) -> dict:
    model = _compiled(s, lambda: mlp(3, "softmax"), "sparse_categorical_crossentropy",
                      metrics=["accuracy"])
    x, _ = data()
    h = model.fit(x, labels(x), epochs=2, class_weight={0: 1.0, 1: 2.0, 2: 0.5},
                  **_fit_kw(s))
    return _out(model, h)


def sample_weight(s: Setting, tmp: str) -> dict:
    model = _compiled(s, mlp)
    x, y = data()
    sw = np.linspace(0.1, 2.0, len(x)).astype("float32")
    return _out(model, model.fit(x, y, sample_weight=sw, epochs=2, **_fit_kw(s)))


def initial_epoch(s: Setting, tmp: str) -> dict:
    model = _compiled(s, mlp)
    x, y = data()
    return _out(model, model.fit(x, y, epochs=3, initial_epoch=1, **_fit_kw(s)))


def steps_per_epoch_repeat(s: Setting, tmp: str) -> dict:
    model = _compiled(s, mlp)
    x, y = data()
    ds = tf.data.Dataset.from_tensor_slices((x, y)).batch(s.batch).repeat()
    return _out(model, model.fit(ds, steps_per_epoch=48 // s.batch, epochs=2, verbose=0))


class EpochWeights(keras.callbacks.Callback):
    """The weights at every epoch end (before the callbacks listed after it)."""

    def __init__(self):
        super().__init__()
        self.weights = []

    def on_epoch_end(self, epoch, logs=None):
        self.weights.append(self.model.get_weights())


def early_stopping(s: Setting, tmp: str) -> dict:
    # min_delta so large that epoch 2 never "improves": fit stops after it and restores the
    # weights of epoch 1, the best.
    model = _compiled(s, mlp)
    x, y = data()
    stop = keras.callbacks.EarlyStopping("val_loss", min_delta=10.0, patience=1,
                                         restore_best_weights=True)
    seen = EpochWeights()
    h = model.fit(x, y, epochs=5, validation_data=data(32, 1), callbacks=[seen, stop],
                  **_fit_kw(s))
    return _out(model, h, stopped_epoch=stop.stopped_epoch, epoch_weights=seen.weights)


def validation_data_model_checkpoint(s: Setting, tmp: str) -> dict:
    model = _compiled(s, mlp)
    x, y = data()
    path = os.path.join(tmp, "best.weights.h5")
    best = keras.callbacks.ModelCheckpoint(path, "val_loss", save_best_only=True,
                                           save_weights_only=True)
    seen = EpochWeights()
    h = model.fit(x, y, epochs=3, validation_data=data(32, 1), callbacks=[seen, best],
                  **_fit_kw(s))
    plain = mlp()
    plain.load_weights(path)
    return _out(model, h, best=plain.get_weights(), epoch_weights=seen.weights)


class Preempted(Exception):
    pass


class _PreemptAt(keras.callbacks.Callback):
    def __init__(self, epoch):
        super().__init__()
        self.epoch = epoch

    def on_epoch_begin(self, epoch, logs=None):
        if epoch == self.epoch:
            raise Preempted(f"preempted before epoch {epoch}")


def backup_and_restore(s: Setting, tmp: str) -> dict:
    # A fit preempted before its third epoch, then the same script again (new strategy,
    # new model): BackupAndRestore restores epoch 2's state and trains epoch 3.
    x, y = data()
    backup_dir = os.path.join(tmp, "backup")
    model = _compiled(s, mlp)
    try:
        model.fit(x, y, epochs=3, callbacks=[keras.callbacks.BackupAndRestore(backup_dir),
                                             _PreemptAt(2)], **_fit_kw(s))
        raise AssertionError("the preemption did not happen")
    except Preempted:
        pass
    interrupted = [w.copy() for w in model.get_weights()]
    _close_open()
    model = _compiled(s, mlp)
    h = model.fit(x, y, epochs=3, callbacks=[keras.callbacks.BackupAndRestore(backup_dir)],
                  **_fit_kw(s))
    return _out(model, h, interrupted=interrupted)


def reduce_lr_on_plateau(s: Setting, tmp: str) -> dict:
    model = _compiled(s, mlp)
    x, y = data()
    reduce = keras.callbacks.ReduceLROnPlateau("loss", factor=0.5, patience=0, min_delta=10.0)
    h = model.fit(x, y, epochs=3, callbacks=[reduce], **_fit_kw(s))
    lr = float(keras.ops.convert_to_numpy(model.optimizer.learning_rate))
    return _out(model, h, lr_ratio=lr / s.lr)


def validation_split_tensorboard(s: Setting, tmp: str) -> dict:
    model = _compiled(s, mlp)
    x, y = data()
    logs = os.path.join(tmp, "logs")
    h = model.fit(x, y, epochs=2, validation_split=0.25,
                  callbacks=[keras.callbacks.TensorBoard(logs)], **_fit_kw(s))
    written = sorted(os.path.basename(os.path.dirname(p))
                     for p in glob.glob(os.path.join(logs, "*", "events.out.tfevents.*")))
    return _out(model, h, event_dirs=written)


def two_inputs_script(s: Setting, tmp: str) -> dict:
    model = _compiled(s, two_inputs)
    x, y = data()
    xs = {"a": x, "b": np.tanh(x[:, :4] * 2.0)}
    h = model.fit(xs, y, epochs=2, **_fit_kw(s))
    return _out(model, h, predict=model.predict(xs, batch_size=s.batch, verbose=0))


def two_outputs_script(s: Setting, tmp: str) -> dict:
    model = _compiled(s, two_outputs, {"reg": "mse", "cls": "sparse_categorical_crossentropy"},
                      loss_weights={"reg": 1.0, "cls": 0.5})
    x, y = data()
    h = model.fit(x, {"reg": y, "cls": labels(x)}, epochs=2, **_fit_kw(s))
    ev = model.evaluate(x, {"reg": y, "cls": labels(x)}, batch_size=s.batch, verbose=0,
                        return_dict=True)
    return _out(model, h, evaluate=ev)


class Rows(keras.utils.PyDataset):
    def __init__(self, x, y, batch):
        super().__init__()
        self.x, self.y, self.batch = x, y, batch

    def __len__(self):
        return len(self.x) // self.batch

    def __getitem__(self, i):
        sl = slice(i * self.batch, (i + 1) * self.batch)
        return self.x[sl], self.y[sl]


def py_dataset(s: Setting, tmp: str) -> dict:
    model = _compiled(s, mlp, metrics=["mae"])
    x, y = data()
    # shuffle=False: under any tf.distribute strategy (MirroredStrategy too) Keras reads one
    # batch before training to build the model, which draws one more `random.shuffle` of a
    # PyDataset's order than plain Keras does, so shuffled orders differ from plain Keras'.
    h = model.fit(Rows(x, y, s.batch), epochs=2, shuffle=False, verbose=0)
    return _out(model, h, evaluate=model.evaluate(x, y, batch_size=s.batch, verbose=0))


def python_generator(s: Setting, tmp: str) -> dict:
    model = _compiled(s, mlp, metrics=["mae"])
    x, y = data()

    def batches():
        while True:
            for i in range(0, len(x), s.batch):
                yield x[i:i + s.batch], y[i:i + s.batch]

    h = model.fit(batches(), steps_per_epoch=len(x) // s.batch, epochs=2, verbose=0)
    return _out(model, h, evaluate=model.evaluate(x, y, batch_size=s.batch, verbose=0))


def arrays_in_order(s: Setting, tmp: str) -> dict:
    """The PyDataset and generator scripts' batches as NumPy arrays (not in SCRIPTS)."""
    model = _compiled(s, mlp, metrics=["mae"])
    x, y = data()
    h = model.fit(x, y, epochs=2, batch_size=s.batch, shuffle=False, verbose=0)
    return _out(model, h, evaluate=model.evaluate(x, y, batch_size=s.batch, verbose=0))


SCRIPTS: dict[str, Callable[[Setting, str], dict]] = {
    "fit/evaluate/predict, model.summary()": fit_evaluate_predict_summary,
    "save + load_model (fresh process)": save_and_load,
    "validation_split + TensorBoard": validation_split_tensorboard,
    "validation_data + ModelCheckpoint(save_best_only)": validation_data_model_checkpoint,
    "EarlyStopping(restore_best_weights)": early_stopping,
    "class_weight": class_weight,
    "sample_weight": sample_weight,
    "initial_epoch": initial_epoch,
    "steps_per_epoch + .repeat()": steps_per_epoch_repeat,
    "BackupAndRestore (preempted, resumed)": backup_and_restore,
    "ReduceLROnPlateau": reduce_lr_on_plateau,
    "two inputs": two_inputs_script,
    "two outputs, dict losses, loss_weights": two_outputs_script,
    "keras.utils.PyDataset": py_dataset,
    "Python generator": python_generator,
}

# MirroredStrategy's input pipeline reads Python data (a generator, a PyDataset) ahead
# from background threads while Keras restarts its iterator, so which batches its later
# steps get varies from run to run (2 epochs: 3 of 6 runs with a generator, 1 of 6 with a
# PyDataset; 2 HetPipe VWs: 0 of 3 each). For these the 2-VW reference is MirroredStrategy
# on the same batches given as NumPy arrays.
TWO_VW_REFERENCE_SCRIPT = {"keras.utils.PyDataset": "arrays in order",
                           "Python generator": "arrays in order"}
HIDDEN_SCRIPTS = {"arrays in order": arrays_in_order}

# What the settings may differ in, by design (everything else must be equal).
IGNORED_KEYS = {"path"}


# --- running and comparing -----------------------------------------------------------------
def _close_open() -> None:
    while _open:
        _open.pop().close()


def run(script: str, setting: str, tmp: str) -> dict:
    """One script under one setting in directory `tmp`; its HetPipe strategies are closed
    after it."""
    os.makedirs(tmp, exist_ok=True)
    # The same auto names in every setting. free_memory=False: no full garbage collection
    # per run (about 0.3 CPU-seconds each with TensorFlow loaded); Python's own collector
    # still runs, and every HetPipe strategy is closed explicitly.
    keras.backend.clear_session(free_memory=False)
    keras.utils.set_random_seed(0)  # the same shuffling in every setting
    t0 = time.perf_counter()
    try:
        out = {**SCRIPTS, **HIDDEN_SCRIPTS}[script](SETTINGS[setting], tmp)
    finally:
        _close_open()
    out["seconds"] = time.perf_counter() - t0
    if "learning_rate" in out.get("history", {}):   # logged by ReduceLROnPlateau
        out["history"]["learning_rate"] = [v / SETTINGS[setting].lr
                                           for v in out["history"]["learning_rate"]]
    return out


def reference(script: str, setting: str) -> tuple[str, str] | None:
    """(script, setting) whose results `script` under `setting` must equal, if any."""
    ref = SETTINGS[setting].reference
    if ref is None:
        return None
    if ref == "mirrored":
        return TWO_VW_REFERENCE_SCRIPT.get(script, script), ref
    return script, ref


def max_difference(a: Any, b: Any, key: str = "") -> tuple[float, str]:
    """The largest absolute difference between two results (inf where they differ in
    structure or in a non-numeric value), and where it is."""
    if isinstance(a, dict) and isinstance(b, dict):
        if set(a) - IGNORED_KEYS - {"seconds"} != set(b) - IGNORED_KEYS - {"seconds"}:
            return float("inf"), f"{key}: keys {sorted(a)} != {sorted(b)}"
        worst = (0.0, key)
        for k in a:
            if k in IGNORED_KEYS or k == "seconds":
                continue
            worst = max(worst, max_difference(a[k], b[k], f"{key}.{k}" if key else k),
                        key=lambda t: t[0])
        return worst
    if isinstance(a, str) or isinstance(b, str):
        return (0.0, key) if a == b else (float("inf"), f"{key}: {a!r} != {b!r}")
    if isinstance(a, (list, tuple)) and not _numeric(a):
        if not isinstance(b, (list, tuple)) or len(a) != len(b):
            return float("inf"), f"{key}: lengths differ"
        worst = (0.0, key)
        for i, (u, v) in enumerate(zip(a, b)):
            worst = max(worst, max_difference(u, v, f"{key}[{i}]"), key=lambda t: t[0])
        return worst
    u, v = np.asarray(a, dtype="float64"), np.asarray(b, dtype="float64")
    if u.shape != v.shape:
        return float("inf"), f"{key}: shapes {u.shape} != {v.shape}"
    return (float(np.max(np.abs(u - v))) if u.size else 0.0), key


def _numeric(seq) -> bool:
    return all(isinstance(e, (int, float, np.number)) for e in seq)


LOADER = r"""
import json, os, sys
os.environ["TF_CPP_MIN_LOG_LEVEL"] = "3"
import numpy as np, keras
assert "hetpipe_tf" not in sys.modules
x = np.asarray(json.loads(sys.stdin.read()), dtype="float32")
out = {}
for path in sys.argv[1:]:
    model = keras.models.load_model(path)
    out[path] = {"predict": model.predict(x, verbose=0).tolist(),
                 "optimizer": type(model.optimizer).__name__,
                 "modules": sorted(m for m in sys.modules if m.startswith("hetpipe"))}
print(json.dumps(out))
"""


def load_in_fresh_process(paths: list[str], x: np.ndarray, timeout: float = 240.0) -> dict:
    """`keras.models.load_model` of every path in ONE new Python process (plain Keras, no
    hetpipe_tf imported), its predictions on x; the process is killed on timeout or error."""
    env = dict(os.environ, CUDA_VISIBLE_DEVICES="")
    child = subprocess.Popen([sys.executable, "-c", LOADER, *paths], stdin=subprocess.PIPE,
                             stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True,
                             cwd=ROOT, env=env)
    try:
        out, err = child.communicate(json.dumps(x.tolist()), timeout=timeout)
    finally:
        if child.poll() is None:
            child.kill()
            child.wait()
    if child.returncode != 0:
        raise RuntimeError(f"load_model in a fresh process failed:\n{err[-2000:]}")
    return json.loads(out.strip().splitlines()[-1])
