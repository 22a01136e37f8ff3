r"""The virtual clock's figures: repeatability and virtual time against the cluster model.

  python -m experiments.virtual_clock
  python -m experiments.virtual_clock --settings=2:1:2:160,3:2:1:96 --runs=2

Trains a small regression MLP (8 -> 16 -> 16 -> 16 -> 1 with a skip connection) with 2
virtual workers on the paper's cluster (`paper_cluster()`: a TITAN V + TITAN RTX pair and
a slower RTX 2060 + Quadro P4000 pair, stage times set by hand) under
`HetPipeStrategy(clock=VirtualClock(paper_cluster()))` on 4 logical CPU devices. For each
setting N_m:D:stages:batches it runs one epoch `--runs` times and prints whether every run
gave bit-identical weights and virtual times, and the virtual seconds per minibatch beside
the cluster model's (`simulate` of as many minibatches, each VW as many waves; the virtual
run gives the faster VW up to (D + 1) N_m minibatches more, so the two meet as the epoch
grows). docs/virtual_clock.md explains the figures.
"""

from __future__ import annotations

import os

os.environ.setdefault("TF_CPP_MIN_LOG_LEVEL", "3")

import dataclasses  # noqa: E402

from absl import app, flags, logging  # noqa: E402

_SETTINGS = flags.DEFINE_list("settings", ["2:1:2:160", "1:0:1:64", "3:2:1:96", "3:2:1:384"],
                              "N_m:D:stages:batches per setting.")
_RUNS = flags.DEFINE_integer("runs", 3, "Runs per setting (bit-identity is checked).")

BATCH = 8
# (hosts, seconds per minibatch of each stage) of the two VWs.
VWS = (((0, 1), (0.004, 0.005)), ((2, 3), (0.009, 0.011)))


def _model(seed: int = 0):
    from hetpipe_tf.models import skip_net
    return skip_net(seed)


def _plans(n_m: int, stages: int, devices):
    from hetpipe_tf.strategy import even_plan
    out = []
    for v, (hosts, times) in enumerate(VWS):
        p = even_plan(_model(), devices[stages * v:stages * (v + 1)], n_m=n_m,
                      batch_size=BATCH)
        st = tuple(dataclasses.replace(s, device=f"host{h}/gpu0", compute_s=t)
                   for s, h, t in zip(p.stages, hosts, times))
        out.append(dataclasses.replace(p, stages=st))
    return out


def _run(n_m: int, d: int, stages: int, n: int, devices):
    import keras
    import numpy as np
    from hetpipe_tf.cluster.spec import paper_cluster
    from hetpipe_tf.sim import VirtualClock
    from hetpipe_tf.strategy import HetPipeStrategy

    rs = np.random.RandomState(0)
    x = rs.randn(n * BATCH, 8).astype("float32")
    y = (np.sin(x[:, :1]) + 0.5 * x[:, 1:2] * x[:, 2:3]).astype("float32")
    clock = VirtualClock(paper_cluster())
    plans = _plans(n_m, stages, devices)
    strategy = HetPipeStrategy(plan=plans, clock_distance=d, compensation="none",
                               clock=clock)
    with strategy.scope():
        model = _model()
        model.compile(keras.optimizers.SGD(0.05), "mse")
    history = model.fit(x, y, batch_size=BATCH, epochs=1, shuffle=False, verbose=0)
    seconds = history.history["virtual_time_s"][-1]
    param_bytes = [[int(sum(np.prod(v.shape) * 4 for v in s.trainable))
                    for s in strategy.pipeline(model, v).stages] for v in range(2)]
    sim = clock.simulate(plans, n_m, d, param_bytes, num_waves=n // (2 * n_m))
    weights = model.get_weights()
    strategy.close()
    return weights, history.history, seconds / n, 1 / sim.minibatches_per_s


def main(argv) -> None:
    del argv
    logging.set_verbosity(logging.WARNING)   # not the VWs' plans the build logs
    from hetpipe_tf.cluster.local import configure_logical_devices
    devices = configure_logical_devices(4)
    import numpy as np
    print("N_m  D  stages  batches  identical  virtual ms/mb  cluster model ms/mb  ratio")
    for setting in _SETTINGS.value:
        n_m, d, stages, n = (int(v) for v in setting.split(":"))
        runs = [_run(n_m, d, stages, n, devices) for _ in range(_RUNS.value)]
        same = all(h == runs[0][1] and all(np.array_equal(a, b) for a, b in zip(w, runs[0][0]))
                   for w, h, _, _ in runs[1:])
        _, _, virtual, model = runs[0]
        print(f"{n_m:>3} {d:>2} {stages:>7} {n:>8}  {'yes' if same else 'NO':>9}  "
              f"{virtual * 1e3:>13.4f}  {model * 1e3:>19.4f}  {virtual / model:.4f}")


if __name__ == "__main__":
    app.run(main)
