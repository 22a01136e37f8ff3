r"""A small HetPipe job that runs offline; every process of the job runs this program.

  python -m hetpipe_tf.launch --workers=2 --ps=1 -- python examples/train_mlp.py

The launcher sets TF_CONFIG for each process: in the worker and parameter-server
processes `HetPipeStrategy(...)` serves and never returns; in the chief it connects to
them and the program trains: two virtual workers (one per worker task, NP allocation),
one stage each, w_global on the ps task, Wave Synchronous Parallel with clock distance D,
on a generated regression task. `--backup_dir` adds Keras' BackupAndRestore, so a job
started again after a fault resumes from the last epoch. See docs/cluster_jobs.md.
"""

from __future__ import annotations

import argparse
import os

os.environ.setdefault("TF_CPP_MIN_LOG_LEVEL", "2")

import keras  # noqa: E402
import numpy as np  # noqa: E402

import hetpipe_tf as hp  # noqa: E402


def parse_args() -> argparse.Namespace:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--epochs", type=int, default=2)
    p.add_argument("--samples", type=int, default=512)
    p.add_argument("--batch_size", type=int, default=16)
    p.add_argument("--clock_distance", type=int, default=0)
    p.add_argument("--fault_timeout_s", type=float, default=30.0)
    p.add_argument("--on_fault", default="stop", choices=("stop", "continue"),
                   help="what a lost worker does: stop the job (TaskLostError) or continue "
                        "without its virtual workers")
    p.add_argument("--backup_dir", default=None)
    p.add_argument("--seed", type=int, default=0)
    return p.parse_args()


def main() -> None:
    args = parse_args()
    strategy = hp.HetPipeStrategy(allocation="NP", n_m=1, clock_distance=args.clock_distance,
                                  fault_timeout_s=args.fault_timeout_s,
                                  on_fault=args.on_fault)
    # Only the chief gets here.
    rng = np.random.default_rng(args.seed)
    x = rng.normal(size=(args.samples, 16)).astype("float32")
    y = (x @ rng.normal(size=(16, 1)) + 0.1 * np.sin(3 * x[:, :1])).astype("float32")
    keras.utils.set_random_seed(args.seed)
    with strategy.scope():
        model = keras.Sequential([keras.Input((16,)), keras.layers.Dense(32, activation="relu"),
                                  keras.layers.Dense(1)])
        model.compile(keras.optimizers.Adam(0.01), "mse")
    callbacks = []
    if args.backup_dir:
        callbacks.append(keras.callbacks.BackupAndRestore(args.backup_dir))
    history = model.fit(x, y, batch_size=args.batch_size, epochs=args.epochs, shuffle=False,
                        verbose=2, callbacks=callbacks)
    print(f"final loss {history.history['loss'][-1]:.4f}", flush=True)
    strategy.close()


if __name__ == "__main__":
    main()
