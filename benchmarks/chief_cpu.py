r"""What the chief of a cluster job costs per minibatch, for 1 to 8 virtual workers, next to
TensorFlow's ParameterServerStrategy (PSS) with ClusterCoordinator measured the same way.

  python -m benchmarks.chief_cpu                          # 1, 2, 4 and 8 VWs
  python -m benchmarks.chief_cpu --virtual_workers=2 --breakdown   # where the chief's CPU goes

Layout: V virtual workers (VWs) of one stage each, one per worker task, w_global on one ps
task, WSP with N_m and D (flags), Adam, an MLP of about --params parameters
(benchmarks/wire_speed.py's model). Each measurement runs in a fresh subprocess of this
binary (connecting to a cluster changes a process's TensorFlow context for good):

- "hetpipe": the chief of real `tf.distribute.Server` processes on 127.0.0.1 (V workers
  and 1 ps, `hetpipe_tf.cluster.serve.start_local_servers`, stopped by pid on exit, also
  on failure) training with HetPipeStrategy under Keras `fit`;
- "pss": the chief of a fresh set of the same servers running PSS: the same MLP as plain
  `tf.Variable`s on the ps task, Adam written out in TensorFlow ops, one
  `ClusterCoordinator.schedule` per minibatch ("PSS 1"), then one per --steps_per_function
  minibatches ("PSS K", a `tf.range` loop in the scheduled function); each worker reads
  a batch of the same shape from its own dataset (PSS's input path; HetPipe's chief reads
  the user's dataset and sends each minibatch to its VW);
- "1-proc": the same plans on V logical CPU devices of one process (`Cluster.local`).

`--steps_per_execution` (Keras' compile argument, default 1) runs that many minibatches per
call of Keras' train function in the HetPipe and one-process fits: Keras' own knob, the
counterpart of PSS K (its callbacks then see logs once per call, as with any strategy).

Every figure comes from one timed fit (or one schedule-and-join) of V x --minibatches
minibatches after an untimed one of the same length that builds and traces everything:
chief CPU ms per minibatch (the chief process's CPU time, `time.process_time`, every
thread of it), calls per minibatch (what the chief asked TensorFlow to run, counted as
benchmarks/wire_speed.py counts them: compiled calls, eager ops, host reads; on a chief
nearly each is a remote request), the cluster's CPU per minibatch (chief + every server
process, /proc), and against the one process: "CPU eff" = one process's CPU per minibatch
/ the cluster's, "wall eff" = the cluster's minibatches per second / the one process's.
`--breakdown` also prints the chief's voluntary context switches per minibatch (every
thread's, getrusage, with PSS's beside; and by live thread), its CPU by thread (both from
/proc/self/task) and its calls by op and calling line. One run on whatever machine runs
it; every process shares its cores.
"""

from __future__ import annotations

import os

os.environ.setdefault("TF_CPP_MIN_LOG_LEVEL", "3")

import json  # noqa: E402
import re  # noqa: E402
import resource  # noqa: E402
import subprocess  # noqa: E402
import sys  # noqa: E402
import time  # noqa: E402

from absl import app, flags  # noqa: E402

from benchmarks._cli import compensation, compensation_flag, run  # noqa: E402
from benchmarks._wire import (DEPTH, FEATURES, CallCounter, cpu_seconds, mlp,  # noqa: E402
                              width as mlp_width)

_VWS = flags.DEFINE_list("virtual_workers", ["1", "2", "4", "8"], "Numbers of VWs (and of "
                         "worker tasks, and of PSS workers) to measure, one row each.")
_PARAMS = flags.DEFINE_integer("params", 20_000, "About how many parameters the MLP has.",
                               lower_bound=1_000)
_MINIBATCHES = flags.DEFINE_integer("minibatches", 16, "Timed minibatches per VW (the "
                                    "timed fit has V times as many).", lower_bound=2)
_BATCH_SIZE = flags.DEFINE_integer("batch_size", 32, "Minibatch size.", lower_bound=1)
_N_M = flags.DEFINE_integer("n_m", 1, "N_m: minibatches per wave.", lower_bound=1)
_D = flags.DEFINE_integer("clock_distance", 1, "WSP clock distance D.", lower_bound=0)
_K = flags.DEFINE_integer("steps_per_function", 8, "K: minibatches per scheduled function "
                          "of the PSS K column.", lower_bound=1)
_SPE = flags.DEFINE_integer("steps_per_execution", 1, "Keras' compile(steps_per_execution=) "
                            "of the HetPipe and one-process fits: minibatches per call of "
                            "Keras' train function (HetPipe's counterpart of PSS K).",
                            lower_bound=1)
_BREAKDOWN = flags.DEFINE_bool("breakdown", False, "Also print where the HetPipe chief's "
                               "CPU goes: by thread, and its calls by op and calling line.")
_COMPENSATION = compensation_flag("none")
_MODE = flags.DEFINE_enum("mode", None, ["hetpipe", "pss", "local"], "Internal: measure "
                          "one mode in this process and print its figures as JSON.")
_MAX_VWS = 16
flags.register_validator(
    "virtual_workers", lambda v: bool(v) and all(x.isdigit() and 1 <= int(x) <= _MAX_VWS
                                                 for x in v),
    message=f"--virtual_workers must list integers in 1..{_MAX_VWS}, e.g. 1,2,4,8.")


def _by_kind(per_thread: dict[str, float]) -> dict[str, float]:
    """Per-thread figures summed by kind: the thread's name with its numbers replaced by N."""
    out: dict[str, float] = {}
    for name, value in per_thread.items():
        kind = re.sub(r"\d+", "N", name)
        out[kind] = out.get(kind, 0.0) + value
    return out


def _thread_cpu() -> dict[str, float]:
    """CPU seconds so far of this process's threads, by kind (observe/threads.py)."""
    from hetpipe_tf.observe.threads import thread_cpu
    return _by_kind(thread_cpu("(unnamed native threads)"))


def _thread_switches() -> dict[str, float]:
    """Voluntary context switches so far of this process's threads, by kind."""
    from hetpipe_tf.observe.threads import thread_switches
    return _by_kind(thread_switches("(unnamed native threads)"))


def _switches() -> int:
    """Voluntary context switches of every thread of this process so far, ended ones
    included (getrusage): a thread that blocks (a wait for another thread's hand-off, a
    reply, a lock) makes one; the involuntary ones count the machine's load instead."""
    return resource.getrusage(resource.RUSAGE_SELF).ru_nvcsw


class _Meter:
    """Chief CPU (this process), the servers' CPU, wall time and calls over a timed span."""

    def __init__(self, counter, server_pids):
        self.counter, self.server_pids = counter, list(server_pids)

    def __enter__(self):
        self._servers0 = cpu_seconds(self.server_pids)
        self._threads0 = _thread_cpu()
        self.counter.counts.clear()
        self.counter.counting = True
        self._switches0, self._thread_switches0 = _switches(), _thread_switches()
        self._cpu0, self._t0 = time.process_time(), time.perf_counter()
        return self

    def __exit__(self, *exc):
        self.wall = time.perf_counter() - self._t0
        self.chief = time.process_time() - self._cpu0
        self.switches = _switches() - self._switches0
        ts = _thread_switches()
        self.thread_switches = {k: v - self._thread_switches0.get(k, 0.0)
                                for k, v in ts.items()}
        self.counter.counting = False
        self.servers = cpu_seconds(self.server_pids) - self._servers0
        t1 = _thread_cpu()
        self.threads = {k: v - self._threads0.get(k, 0.0) for k, v in t1.items()}
        # Threads that ended within the span are gone from /proc/self/task; their CPU is
        # in the process's (ticks of 10 ms against process_time: a few ms either way).
        self.threads["(threads that ended)"] = self.chief - sum(self.threads.values())
        return False

    def figures(self, n: int) -> dict:
        by_kind = self.counter.by_kind()
        return {"chief_ms": self.chief / n * 1e3, "total_ms": (self.chief + self.servers)
                / n * 1e3, "mb_per_s": n / self.wall,
                "calls": sum(c for k, c in by_kind.items() if k != "trace") / n,
                "traces": by_kind.get("trace", 0), "switches": self.switches / n,
                "thread_switches": {k: v / n for k, v in self.thread_switches.items()
                                    if v > 0},
                "threads": {k: v / n * 1e3 for k, v in self.threads.items() if v > 0},
                "by_op": {f"{k} {o}": c / n for (k, o), c in self.counter.counts.items()}}


def _connect(tf, spec: dict) -> None:
    resolver = tf.distribute.cluster_resolver.SimpleClusterResolver(
        tf.train.ClusterSpec(spec), task_type="chief", task_id=0, rpc_layer="grpc")
    tf.config.experimental_connect_to_cluster(resolver, job_name="chief",
                                              make_master_device_default=False)


def _data(vws: int):
    import numpy as np

    rs = np.random.RandomState(0)
    n = vws * _MINIBATCHES.value * _BATCH_SIZE.value
    return rs.rand(n, FEATURES).astype("float32"), rs.randint(0, 10, n)


def _measure_hetpipe(vws: int, info: dict | None) -> dict:
    """HetPipe's chief (info: the cluster and the servers' pids) or the one process."""
    if info is None:
        from hetpipe_tf.cluster.local import configure_logical_devices
        configure_logical_devices(vws)
    import keras
    import tensorflow as tf

    from hetpipe_tf.cluster.spec import Cluster
    from hetpipe_tf.strategy import HetPipeStrategy, even_plan

    counter = CallCounter()
    counter.where = _BREAKDOWN.value
    if info is not None:
        _connect(tf, info["cluster"])
        cluster = Cluster.from_tf_cluster_spec(
            info["cluster"], {f"worker:{i}": ["LOCAL_CPU"] for i in range(vws)})
    else:
        cluster = Cluster.local(["LOCAL_CPU"] * vws)
    width = mlp_width(_PARAMS.value)
    probe = mlp(keras, width, "probe")
    plans = [even_plan(probe, [d.tf_device], n_m=_N_M.value) for d in cluster.devices]
    x, y = _data(vws)
    with HetPipeStrategy(cluster, plan=plans, clock_distance=_D.value,
                         compensation=compensation(_COMPENSATION)) as strategy:
        with strategy.scope():
            model = mlp(keras, width, "mlp")
            model.compile(keras.optimizers.Adam(1e-4),
                          keras.losses.SparseCategoricalCrossentropy(from_logits=True),
                          steps_per_execution=_SPE.value)
        bs = _BATCH_SIZE.value
        model.fit(x, y, batch_size=bs, verbose=0)   # build and trace
        with _Meter(counter, info["pids"] if info else []) as meter:
            model.fit(x, y, batch_size=bs, verbose=0)
        out = meter.figures(len(x) // bs)
        out["params"] = model.count_params()
    return out


def _measure_pss(vws: int, info: dict) -> dict:
    """TensorFlow's PSS + ClusterCoordinator on the same servers' layout, model and batch:
    one scheduled function per minibatch ("pss1"), then one per K ("pssk")."""
    import tensorflow as tf

    counter = CallCounter()
    resolver = tf.distribute.cluster_resolver.SimpleClusterResolver(
        tf.train.ClusterSpec(info["cluster"]), task_type="chief", task_id=0,
        rpc_layer="grpc")
    strategy = tf.distribute.experimental.ParameterServerStrategy(resolver)
    coordinator = tf.distribute.experimental.coordinator.ClusterCoordinator(strategy)
    width, bs, k = mlp_width(_PARAMS.value), _BATCH_SIZE.value, _K.value
    sizes = [FEATURES] + [width] * DEPTH + [10]
    with strategy.scope():
        weights = []
        for i, (a, b) in enumerate(zip(sizes[:-1], sizes[1:])):
            weights.append(tf.Variable(tf.random.stateless_uniform((a, b), (0, i), -0.05,
                                                                   0.05), name=f"k{i}"))
            weights.append(tf.Variable(tf.zeros((b,)), name=f"b{i}"))
        slots = [(tf.Variable(tf.zeros_like(w)), tf.Variable(tf.zeros_like(w)))
                 for w in weights]
        t = tf.Variable(0.0, name="t")

    def dataset_fn():
        x = tf.random.stateless_uniform((bs, FEATURES), (1, 2))
        y = tf.random.stateless_uniform((bs,), (3, 4), 0, 10, dtype=tf.int32)
        return tf.data.Dataset.from_tensors((x, y)).repeat()

    def replica_step(x, y):
        with tf.GradientTape() as tape:
            h = x
            for i in range(0, len(weights), 2):
                h = tf.matmul(h, weights[i]) + weights[i + 1]
                if i + 2 < len(weights):
                    h = tf.nn.relu(h)
            loss = tf.reduce_mean(tf.nn.sparse_softmax_cross_entropy_with_logits(y, h))
        grads = tape.gradient(loss, weights)
        t.assign_add(1.0)
        lr = 1e-4 * tf.sqrt(1 - 0.999 ** t) / (1 - 0.9 ** t)
        for w, g, (m, v) in zip(weights, grads, slots):   # Adam
            m.assign(0.9 * m + 0.1 * g)
            v.assign(0.999 * v + 0.001 * g * g)
            w.assign_sub(lr * m / (tf.sqrt(v) + 1e-7))
        return loss

    @tf.function
    def one_step(iterator):
        return strategy.run(replica_step, args=next(iterator))

    @tf.function
    def k_steps(iterator):
        for _ in tf.range(k):
            loss = strategy.run(replica_step, args=next(iterator))
        return loss

    iterator = iter(coordinator.create_per_worker_dataset(dataset_fn))
    n = vws * _MINIBATCHES.value
    out = {}
    for name, fn, per_call in (("pss1", one_step, 1), ("pssk", k_steps, k)):
        calls = max(1, n // per_call)
        for _ in range(calls):   # trace and warm up
            coordinator.schedule(fn, args=(iterator,))
        coordinator.join()
        with _Meter(counter, info["pids"]) as meter:
            for _ in range(calls):
                coordinator.schedule(fn, args=(iterator,))
            coordinator.join()
        out[name] = meter.figures(calls * per_call)
    return out


def _child(mode: str, vws: int, info: dict | None) -> dict:
    args = [sys.executable, "-m", "benchmarks.chief_cpu", f"--mode={mode}",
            f"--virtual_workers={vws}", f"--params={_PARAMS.value}",
            f"--minibatches={_MINIBATCHES.value}", f"--batch_size={_BATCH_SIZE.value}",
            f"--n_m={_N_M.value}", f"--clock_distance={_D.value}",
            f"--steps_per_function={_K.value}", f"--steps_per_execution={_SPE.value}",
            f"--breakdown={_BREAKDOWN.value}",
            f"--compensation={_COMPENSATION.value}"]
    if info is not None:
        args.append(json.dumps(info))
    env = {**os.environ, "TF_CPP_MIN_LOG_LEVEL": "3"}
    proc = subprocess.run(args, capture_output=True, text=True, env=env)
    if proc.returncode != 0:
        raise RuntimeError(f"The {mode} measurement with {vws} VWs failed:\n"
                           f"{proc.stderr[-3000:]}")
    return json.loads(proc.stdout.strip().splitlines()[-1])


def _in_cluster(mode: str, vws: int) -> dict:
    """`mode` measured by a chief of fresh servers (vws workers, 1 ps), stopped after."""
    from hetpipe_tf.cluster.serve import start_local_servers

    with start_local_servers({"worker": vws, "ps": 1}) as servers:
        return _child(mode, vws, {"cluster": servers.cluster, "pids": list(servers.pids)})


def _breakdown(h: dict, pss: dict) -> None:
    print(" " * 4 + "chief voluntary context switches per minibatch: "
          f"{h['switches']:.0f} (PSS 1 {pss['pss1']['switches']:.0f}, PSS K "
          f"{pss['pssk']['switches']:.1f}); by live thread: " + ", ".join(
              f"{k} {v:.1f}" for k, v in sorted(h["thread_switches"].items(),
                                                key=lambda kv: -kv[1]) if v >= 0.5))
    print(" " * 4 + "chief CPU ms per minibatch by thread: " + ", ".join(
        f"{k} {v:.2f}" for k, v in sorted(h["threads"].items(), key=lambda kv: -kv[1])
        if v >= 0.05))
    print(" " * 4 + "chief calls per minibatch by op and calling line:")
    for op, c in sorted(h["by_op"].items(), key=lambda kv: -kv[1]):
        print(" " * 8 + f"{c:7.2f}  {op}")


def main(argv: list[str]) -> None:
    if len(argv) > 2 or (len(argv) == 2 and _MODE.value not in ("hetpipe", "pss")):
        raise app.UsageError(f"Unexpected arguments: {argv[1:]}.")
    comp = compensation(_COMPENSATION)
    vws_list = [int(v) for v in _VWS.value]
    if _MODE.value is not None:
        info = json.loads(argv[1]) if len(argv) == 2 else None
        if _MODE.value == "pss":
            print(json.dumps(_measure_pss(vws_list[0], info)))
        else:
            print(json.dumps(_measure_hetpipe(vws_list[0], info)))
        return
    w = mlp_width(_PARAMS.value)
    params = (FEATURES + 1) * w + (DEPTH - 1) * (w + 1) * w + (w + 1) * 10
    print(f"setting: V VWs x 1 stage, one per worker task, w_global on 1 ps task; MLP of "
          f"{params:,} parameters, batch {_BATCH_SIZE.value}, Adam, N_m={_N_M.value}, "
          f"D={_D.value}, compensation {comp.value}, Keras steps_per_execution "
          f"{_SPE.value}; PSS: the same model on V workers + 1 "
          f"ps, K={_K.value}; one timed fit of V x {_MINIBATCHES.value} minibatches; all "
          "processes on 127.0.0.1 (one machine, shared cores)")
    print(f"{'V':>3} {'chief CPU ms/mb':>15} {'PSS 1':>6} {'PSS K':>6} "
          f"{'calls/mb':>8} {'PSS 1':>6} {'PSS K':>6} {'cluster CPU ms/mb':>17} "
          f"{'1-proc':>7} {'CPU eff':>7} {'wall eff':>8} {'PSS 1 cluster CPU':>17}",
          flush=True)
    rows = []
    for vws in vws_list:   # each row as soon as it is measured
        local = _child("local", vws, None)
        het = _in_cluster("hetpipe", vws)
        pss = _in_cluster("pss", vws)
        p1, pk = pss["pss1"], pss["pssk"]
        print(f"{vws:>3} {het['chief_ms']:>15.2f} {p1['chief_ms']:>6.2f} "
              f"{pk['chief_ms']:>6.2f} {het['calls']:>8.1f} {p1['calls']:>6.2f} "
              f"{pk['calls']:>6.2f} {het['total_ms']:>17.2f} {local['chief_ms']:>7.2f} "
              f"{local['chief_ms'] / het['total_ms']:>7.2f} "
              f"{het['mb_per_s'] / local['mb_per_s']:>8.2f} {p1['total_ms']:>17.2f}",
              flush=True)
        rows.append((vws, het, pss))
    for vws, het, pss in rows:
        if _BREAKDOWN.value:
            print(f"V={vws}:")
            _breakdown(het, pss)
        if het["traces"]:
            print(f"V={vws}: functions traced in the timed fit: {het['traces']}")

if __name__ == "__main__":
    run(main)
