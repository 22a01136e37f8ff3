r"""Chief traffic of a cluster job: how many bytes pass through the chief process per
minibatch and per run (epoch), in model sizes.

  python -m benchmarks.chief_traffic                       # 1 VW x 2 stages, 2 workers
  python -m benchmarks.chief_traffic --virtual_workers=2   # 2 VWs x 1 stage + a ps task

This process is the chief: it starts real `tf.distribute.Server` processes on 127.0.0.1
(`hetpipe_tf.cluster.serve.start_local_servers`, stopped on exit), connects to them, and
trains an MLP of about --params parameters with HetPipeStrategy, stages and w_local on the
worker tasks, w_global on the ps task. It reads the TCP byte counters of the chief's own
sockets (`ss -tinp`, iproute2) around two fits of N and 4N minibatches and separates
per-minibatch traffic (the slope) from per-run traffic (the intercept: run-boundary copies
of the model and optimizer state, which live on the chief's host). For scale it prints the
input batch's bytes: the chief reads the user's dataset, so each minibatch's input passes
through it. One run on whatever machine runs it; every task shares its cores.
"""

from __future__ import annotations

import os

os.environ.setdefault("TF_CPP_MIN_LOG_LEVEL", "3")

import re  # noqa: E402
import shutil  # noqa: E402
import subprocess  # noqa: E402
import time  # noqa: E402

from absl import app, flags  # noqa: E402

from benchmarks._cli import compensation, compensation_flag, run  # noqa: E402

_VWS = flags.DEFINE_integer("virtual_workers", 1, "1: one VW of 2 stages, one per worker "
                            "task; 2: two VWs of 1 stage under WSP, w_global on a ps task.",
                            lower_bound=1, upper_bound=2)
_MINIBATCHES = flags.DEFINE_integer("minibatches", 40, "N: the first timed fit's "
                                    "minibatches (the second has 4N).", lower_bound=2)
_PARAMS = flags.DEFINE_integer("params", 3_400_000, "About how many model parameters.",
                               lower_bound=10_000)
_COMPENSATION = compensation_flag("none")
_BATCH_SIZE = flags.DEFINE_integer("batch_size", 32, "Minibatch size.", lower_bound=1)

FEATURES, DEPTH = 1024, 4


def chief_bytes() -> tuple[int, int]:
    """(bytes sent, bytes received) over this process's TCP sockets so far."""
    out = subprocess.run(["ss", "-tinp"], capture_output=True, text=True, check=True).stdout
    me = f"pid={os.getpid()},"
    sent = recv = 0
    mine = False
    for line in out.splitlines():
        if line and not line[0].isspace():
            mine = me in line
        elif mine:
            s = re.search(r"bytes_sent:(\d+)", line)
            r = re.search(r"bytes_received:(\d+)", line)
            sent += int(s.group(1)) if s else 0
            recv += int(r.group(1)) if r else 0
    return sent, recv


def _width(params: int) -> int:
    # FEATURES*w + (DEPTH-1)*w^2 ~ params.
    a, b = DEPTH - 1, FEATURES
    return max(8, int((-b + (b * b + 4 * a * params) ** 0.5) / (2 * a)))


def main(argv: list[str]) -> None:
    if len(argv) > 1:
        raise app.UsageError(f"Unexpected arguments: {argv[1:]}.")
    if shutil.which("ss") is None:
        raise OSError("This benchmark reads socket counters with `ss` (iproute2), which is "
                      "not installed. Received: no `ss` on PATH; apt-get install iproute2.")
    comp = compensation(_COMPENSATION)
    from hetpipe_tf.cluster.serve import start_local_servers

    vws = _VWS.value
    jobs = {"worker": 2} if vws == 1 else {"worker": 2, "ps": 1}
    with start_local_servers(jobs) as servers:
        import keras
        import numpy as np
        import tensorflow as tf

        from hetpipe_tf.cluster.spec import Cluster
        from hetpipe_tf.strategy import HetPipeStrategy, even_plan

        resolver = tf.distribute.cluster_resolver.SimpleClusterResolver(
            tf.train.ClusterSpec(servers.cluster), task_type="chief", task_id=0,
            rpc_layer="grpc")
        tf.config.experimental_connect_to_cluster(resolver, job_name="chief",
                                                  make_master_device_default=False)
        cluster = Cluster.from_tf_cluster_spec(
            servers.cluster, {"worker:0": ["LOCAL_CPU"], "worker:1": ["LOCAL_CPU"]})
        width = _width(_PARAMS.value)

        def build():
            inp = keras.Input((FEATURES,))
            h = inp
            for i in range(DEPTH):
                h = keras.layers.Dense(width, activation="relu", name=f"d{i}")(h)
            return keras.Model(inp, keras.layers.Dense(10, name="out")(h))

        probe = build()
        devices = [d.tf_device for d in cluster.devices]
        plans = (even_plan(probe, devices, n_m=2) if vws == 1
                 else [even_plan(probe, [d], n_m=1) for d in devices])
        with HetPipeStrategy(cluster, plan=plans, clock_distance=0,
                             compensation=comp) as strategy:
            with strategy.scope():
                model = build()
                model.compile(keras.optimizers.Adam(1e-4),
                              keras.losses.SparseCategoricalCrossentropy(from_logits=True))
            bs, n = _BATCH_SIZE.value, _MINIBATCHES.value
            rs = np.random.RandomState(0)
            x = rs.rand(4 * n * bs, FEATURES).astype("float32")
            y = rs.randint(0, 10, len(x))
            model.fit(x[:2 * bs], y[:2 * bs], batch_size=bs, verbose=0)   # build, warm up
            measured = []
            for m in (n, 4 * n):
                s0, r0 = chief_bytes()
                t0 = time.perf_counter()
                model.fit(x[:m * bs], y[:m * bs], batch_size=bs, verbose=0)
                dt = time.perf_counter() - t0
                s1, r1 = chief_bytes()
                measured.append((m, s1 - s0, r1 - r0, dt))
        size = model.count_params() * 4
        (m1, s1, r1, _), (m2, s2, r2, dt2) = measured
        per_mb = ((s2 - s1) / (m2 - m1), (r2 - r1) / (m2 - m1))
        per_run = (s1 - per_mb[0] * m1, r1 - per_mb[1] * m1)
        layout = ("1 VW x 2 stages (one per worker task)" if vws == 1 else
                  "2 VWs x 1 stage (one per worker task), w_global on the ps task, D=0")
        print(f"setting: {layout}; MLP of {model.count_params():,} parameters "
              f"({size / 1e6:.1f} MB), batch {bs}, Adam, compensation {comp.value}; fits "
              f"of {m1} and {m2} minibatches; all tasks on 127.0.0.1 (one machine, shared "
              "cores)")
        print(f"input batch: {bs * FEATURES * 4:,} bytes")
        print(f"chief per minibatch: sent {per_mb[0]:,.0f} bytes ({per_mb[0] / size:.3f} model "
              f"sizes), received {per_mb[1]:,.0f} bytes ({per_mb[1] / size:.3f} model sizes)")
        print(f"chief per run: sent {max(per_run[0], 0) / size:.2f} model sizes, received "
              f"{max(per_run[1], 0) / size:.2f} model sizes (run-boundary state copies)")
        print(f"time per minibatch ({m2}-minibatch fit): {dt2 / m2 * 1e3:.1f} ms")


if __name__ == "__main__":
    run(main)
