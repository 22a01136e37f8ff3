r"""Why momentum SGD across two pipelined VWs stays behind plain Keras at equal epochs
(issue 20's open cell; docs/convergence.md, "A stability argument").

  python -m experiments.staleness_stability            # both parts, seeds 0 and 1
  python -m experiments.staleness_stability --seeds=0 --epochs=4

Part 1, a model: heavy-ball momentum on one quadratic direction f = h w^2 / 2 whose gradient
is s updates stale and taken at a linear look-ahead a of the last update (weight
prediction),

    w_{t+1} - w_t = mu (w_t - w_{t-1}) - lr h [(1 + a) w_{t-s} - a w_{t-s-1}],

is stable iff every root of z^{s+2} - (1 + mu) z^{s+1} + mu z^s + lr h ((1 + a) z - a) has
|z| < 1. The table gives the largest stable curvature h per setting: plain Keras (s = 0),
the paper's rule and the compensations at the open cell's effective staleness s = 3
((N_m - 1) + (N - 1) N_m for N_m = 2, N = 2), and the best any momentum and look-ahead
reach at plain Keras's progress per update lr / (1 - mu) = 0.5.

Part 2, the measurement it is compared with: the largest Hessian eigenvalue of the training
loss (power iteration on Hessian-vector products, the whole training set) of the gap
benchmark's digits MLP (64-128-64-64-10) along plain Keras training with momentum SGD (lr
0.05, mu 0.9, batch 32), the same initial weights and data order as
`experiments.time_to_accuracy --mode=gap --seed=S`. Where it exceeds a setting's bound,
that setting cannot follow plain Keras's path at plain Keras's step.
"""

from __future__ import annotations

import os

os.environ.setdefault("TF_CPP_MIN_LOG_LEVEL", "3")

from absl import app, flags  # noqa: E402

from experiments import _study  # noqa: E402

_SEEDS = flags.DEFINE_list("seeds", ["0", "1"], "Seeds of part 2 (empty: part 1 only).")
flags.register_validator("seeds", lambda v: all(x.isdigit() for x in v),
                         "--seeds must be integers >= 0, e.g. --seeds=0,1.")
_EPOCHS = flags.DEFINE_integer("epochs", 4, "Epochs of plain Keras in part 2.", lower_bound=0)
_BEST = flags.DEFINE_bool("best_row", True, "Part 1: also the best momentum and look-ahead "
                          "at plain Keras's lr / (1 - mu) (a grid search, ~30 s).")
_ITERS = flags.DEFINE_integer("power_iterations", 30, "Power iterations per eigenvalue.",
                              lower_bound=1)

LR, MU = 0.05, 0.9   # the open cell's optimizer
# (label, mu, lr, s, a): BOTH runs mu_e = 1 - (1 - mu)(s + 1) = 0.6 and looks ahead N k = 2.
SETTINGS = (("plain Keras (no staleness)", MU, LR, 0, 0),
            ("paper's rule (NONE), s = 3", MU, LR, 3, 0),
            ("MOMENTUM (mu_e 0.6), s = 3", 0.6, LR, 3, 0),
            ("BOTH (mu_e 0.6, look-ahead 2), s = 3", 0.6, LR, 3, 2),
            ("plain Keras at BOTH's mu_e 0.6 (no staleness)", 0.6, LR, 0, 0))


def spectral_radii(xs, mu: float, s: int, a: float):
    """Largest |root| of the characteristic polynomial at each lr * h = x of `xs` (module
    docstring): the eigenvalues of the polynomials' companion matrices, all at once."""
    import numpy as np

    xs = np.asarray(xs, dtype=float)
    c = np.zeros((len(xs), s + 3))
    c[:, 0], c[:, 1] = 1.0, -(1.0 + mu)
    c[:, 2] += mu
    c[:, s + 1] += xs * (1.0 + a)
    c[:, s + 2] -= xs * a
    companion = np.zeros((len(xs), s + 2, s + 2))
    companion[:, 0, :] = -c[:, 1:]
    companion[:, np.arange(1, s + 2), np.arange(s + 1)] = 1.0
    return np.abs(np.linalg.eigvals(companion)).max(axis=1)


def max_stable_curvature(mu: float, lr: float, s: int, a: float, grid: int = 4000,
                         top: float = 8.0) -> float:
    """The first lr * h on a geometric grid over [1e-4, top] that is unstable (a resolution
    of 0.25% at the default grid), divided by lr."""
    import numpy as np

    xs = 1e-4 * (top / 1e-4) ** (np.arange(grid + 1) / grid)
    unstable = np.flatnonzero(spectral_radii(xs, mu, s, a) >= 1.0)
    return float(xs[unstable[0]] if unstable.size else top) / lr


def model_table(best_row: bool = True) -> list[tuple[str, ...]]:
    rows = [("setting", "mu", "lr", "s", "look-ahead a", "largest stable h")]
    for label, mu, lr, s, a in SETTINGS:
        rows.append((label, f"{mu:g}", f"{lr:g}", str(s), f"{a:g}",
                     f"{max_stable_curvature(mu, lr, s, a):.2f}"))
    if not best_row:
        return rows
    best, arg = 0.0, None   # at plain Keras's lr / (1 - mu) = 0.5
    for mu in [i / 100 for i in range(0, 100)]:
        for a in (0, 1, 2, 3, 4):
            h = max_stable_curvature(mu, 0.5 * (1 - mu), 3, a, grid=800)
            if h > best:
                best, arg = h, (mu, a)
    rows.append((f"best of mu in 0..0.99, a in 0..4 at lr / (1 - mu) = 0.5, s = 3",
                 f"{arg[0]:g}", f"{0.5 * (1 - arg[0]):g}", "3", str(arg[1]), f"{best:.2f}"))
    return rows


def sharpness_rows(seed: int, epochs: int, iters: int) -> list[tuple[str, ...]]:
    """(epoch, validation accuracy, largest Hessian eigenvalue) along plain Keras training."""
    import keras
    import numpy as np
    import tensorflow as tf

    from hetpipe_tf import models

    xt, yt, xv, yv = models.digits()   # time_to_accuracy's task, split and model
    keras.utils.set_random_seed(seed)
    model = models.digits_mlp()
    model.compile(keras.optimizers.SGD(LR, momentum=MU), "sparse_categorical_crossentropy",
                  metrics=["accuracy"])
    loss_fn = keras.losses.SparseCategoricalCrossentropy()
    xs, ys = tf.constant(xt), tf.constant(yt)
    weights = model.trainable_variables

    def dot(a, b):
        return tf.add_n([tf.reduce_sum(p * q) for p, q in zip(a, b)])

    def hvp(v):
        with tf.GradientTape() as outer:
            with tf.GradientTape() as inner:
                loss = loss_fn(ys, model(xs))
            gv = dot(inner.gradient(loss, weights), v)
        return outer.gradient(gv, weights)

    def top_eigenvalue():
        rs = np.random.RandomState(seed)
        v = [tf.constant(rs.randn(*w.shape).astype("float32")) for w in weights]
        lam = 0.0
        for _ in range(iters):
            norm = tf.sqrt(dot(v, v))
            v = [p / norm for p in v]
            hv = hvp(v)
            lam = float(dot(hv, v))
            v = hv
        return lam

    ds = (tf.data.Dataset.from_tensor_slices((xt, yt)).shuffle(len(xt), seed=seed)
          .batch(32, drop_remainder=True))
    rows = [(str(seed), "0", "", f"{top_eigenvalue():.1f}")]
    for e in range(epochs):
        h = model.fit(ds, validation_data=(xv, yv), epochs=1, verbose=0)
        rows.append((str(seed), str(e + 1), f"{h.history['val_accuracy'][-1]:.3f}",
                     f"{top_eigenvalue():.1f}"))
    return rows


def main(argv: list[str]) -> int:
    if len(argv) > 1:
        raise app.UsageError(f"Unexpected arguments: {argv[1:]}")
    seeds = [int(s) for s in _SEEDS.value]
    print("Part 1: heavy ball on f = h w^2 / 2 with an s-update stale gradient taken at a "
          "look-ahead a of the last update; the largest stable curvature h.")
    print(_study.markdown_table(model_table(_BEST.value)))
    if seeds:
        print("\nPart 2: the largest Hessian eigenvalue of the digits MLP's training loss "
              f"along plain Keras training (SGD lr {LR}, momentum {MU}, batch 32).")
        rows = [("seed", "epoch", "val acc", "largest Hessian eigenvalue")]
        for seed in seeds:
            rows += sharpness_rows(seed, _EPOCHS.value, _ITERS.value)
        print(_study.markdown_table(rows))
    return 0


if __name__ == "__main__":
    app.run(main)
