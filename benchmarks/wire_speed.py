r"""Speed of the wire: a multi-process cluster job against the same plans in one process,
and the bytes on each link per minibatch next to the minimum WSP needs.

  python -m benchmarks.wire_speed                     # small and 3.4 M MLP, N_m = 1 and 4, D = 1

Layout: 2 virtual workers (VWs) of one stage each, w_global on a parameter server, WSP with
clock distance D, --compensation (none: the paper's rules), Adam. "cluster": real
`tf.distribute.Server` processes on 127.0.0.1 (2 worker tasks, one VW each, and 1 ps
task; `hetpipe_tf.cluster.serve.start_local_servers`, stopped by pid on exit) driven by a
chief process over TensorFlow's gRPC runtime, as a cluster job runs. "one process": the
same plans on 2 logical CPU devices of one process (`Cluster.local`). Each mode runs in a
fresh subprocess of this binary (connecting to a cluster changes a process's TensorFlow
context for good); both see the same 2-core machine.

Throughput is minibatches per second of one fit of N minibatches (one run: it includes the
run's start and end, w_global seeded from the model and the last pull, as a user's epoch
does), after a fit of N that builds and traces everything (the functions still traced in
the timed fit are counted and printed). Bytes are the TCP counters of every
process's sockets (`ss -tinp`, iproute2) over that fit, per link (two tasks; both directions
summed), per minibatch (the run's boundaries included, so at least the minimum). CPU ms
is the CPU time (user + system, /proc) per minibatch of every process of the mode (the
chief and the 3 servers; the one process): what the gRPC path costs in work, which on one
machine competes with the compute for the same cores. (A slope
over fits of N and 3N was tried: on the shared cores it came out negative now and then.)
Calls per minibatch are what the chief (and the one process) asked TensorFlow to run
during the timed fit: compiled calls, eager ops and host reads (`.numpy()`); on the chief
nearly each is a remote request and its reply. The minimum is what WSP needs:
on a VW's link to the ps, one push and one pull of the VW's parameters per wave of N_m
minibatches (2 x model bytes / N_m per minibatch of that VW, times the share of the
job's minibatches it took); on the chief's link to a worker, the input
of the minibatches that VW took (the chief reads the dataset). One run on whatever machine
runs it; every task shares its cores (docs/cluster_jobs.md, "Speed of the wire").
"""

from __future__ import annotations

import os

os.environ.setdefault("TF_CPP_MIN_LOG_LEVEL", "3")

import json  # noqa: E402
import re  # noqa: E402
import shutil  # noqa: E402
import subprocess  # noqa: E402
import sys  # noqa: E402
import time  # noqa: E402

from absl import app, flags  # noqa: E402

from benchmarks._cli import compensation, compensation_flag, run  # noqa: E402
from benchmarks._wire import FEATURES, DEPTH, CallCounter, cpu_seconds  # noqa: E402
from benchmarks._wire import mlp as _model, width as _width  # noqa: E402

_PARAMS = flags.DEFINE_list("params", ["100000", "3400000"], "About how many parameters each "
                            "MLP has (one table row group per model).")
_N_M = flags.DEFINE_list("n_m", ["1", "4"], "N_m values (minibatches per wave).")
_D = flags.DEFINE_integer("clock_distance", 1, "WSP clock distance D.", lower_bound=0)
_MINIBATCHES = flags.DEFINE_integer("minibatches", 64, "N: the timed fit's minibatches.",
                                    lower_bound=2)
_BATCH_SIZE = flags.DEFINE_integer("batch_size", 32, "Minibatch size.", lower_bound=1)
_CALLS_BY_OP = flags.DEFINE_bool("calls_by_op", False, "Also list the calls per minibatch "
                                  "of each op or compiled function.")
_COMPENSATION = compensation_flag("none")
_MODE = flags.DEFINE_enum("mode", None, ["cluster", "local"], "Internal: measure one mode "
                          "in this process and print its figures as JSON.")

_MB = 1e6


def socket_bytes() -> list[tuple[str, str, int, int]]:
    """(local address, peer address, bytes sent, pid) of every TCP socket `ss` shows."""
    out = subprocess.run(["ss", "-tinpH"], capture_output=True, text=True, check=True).stdout
    rows, cur = [], None
    for line in out.splitlines():
        if line and not line[0].isspace():
            parts = line.split()
            pid = re.search(r"pid=(\d+),", line)
            cur = [parts[3], parts[4], 0, int(pid.group(1)) if pid else -1] if len(parts) > 4 else None
            rows.append(cur)
        elif cur is not None:
            s = re.search(r"bytes_sent:(\d+)", line)
            cur[2] += int(s.group(1)) if s else 0
    return [tuple(r) for r in rows if r is not None]


def link_bytes(tasks: dict[int, str]) -> dict[tuple[str, str], int]:
    """Bytes sent so far between each pair of tasks (pid -> task name), both directions.
    A socket's peer is found by its address among the other sockets (all on 127.0.0.1)."""
    rows = socket_bytes()
    owner = {local: pid for local, _, _, pid in rows if pid in tasks}
    links: dict[tuple[str, str], int] = {}
    for local, peer, sent, pid in rows:
        if pid not in tasks or owner.get(peer) not in tasks:
            continue
        a, b = sorted((tasks[pid], tasks[owner[peer]]))
        if a != b:
            links[(a, b)] = links.get((a, b), 0) + sent
    return links


def _measure(mode: str, cluster_json: str | None) -> list[dict]:
    """Every (model, N_m) setting in this process: throughput and (cluster) link bytes."""
    if mode == "local":
        from hetpipe_tf.cluster.local import configure_logical_devices
        configure_logical_devices(2)
    import keras
    import numpy as np
    import tensorflow as tf

    from hetpipe_tf.cluster.spec import Cluster
    from hetpipe_tf.strategy import HetPipeStrategy, even_plan

    tasks: dict[int, str] = {}
    counter = CallCounter()
    counter.where = _CALLS_BY_OP.value
    if mode == "cluster":
        info = json.loads(cluster_json)
        spec = info["cluster"]
        resolver = tf.distribute.cluster_resolver.SimpleClusterResolver(
            tf.train.ClusterSpec(spec), task_type="chief", task_id=0, rpc_layer="grpc")
        tf.config.experimental_connect_to_cluster(resolver, job_name="chief",
                                                  make_master_device_default=False)
        cluster = Cluster.from_tf_cluster_spec(
            spec, {"worker:0": ["LOCAL_CPU"], "worker:1": ["LOCAL_CPU"]})
        tasks = {os.getpid(): "chief", **{int(p): t for p, t in info["pids"].items()}}
    else:
        cluster = Cluster.local(["LOCAL_CPU"] * 2)
    comp = compensation(_COMPENSATION)
    bs, n = _BATCH_SIZE.value, _MINIBATCHES.value
    rs = np.random.RandomState(0)
    x = rs.rand(n * bs, FEATURES).astype("float32")
    y = rs.randint(0, 10, len(x))
    results = []
    for params in map(int, _PARAMS.value):
        width = _width(params)
        for n_m in map(int, _N_M.value):
            probe = _model(keras, width, "probe")
            plans = [even_plan(probe, [d.tf_device], n_m=n_m) for d in cluster.devices]
            strategy = HetPipeStrategy(cluster, plan=plans, clock_distance=_D.value,
                                       compensation=comp)
            with strategy.scope():
                model = _model(keras, width, "mlp")
                model.compile(keras.optimizers.Adam(1e-4),
                              keras.losses.SparseCategoricalCrossentropy(from_logits=True))
            # Build and trace: a fit as long as the timed one, so that it also meets the
            # variants a pull's rebase is traced for (one per number of later versions it
            # moves; a shorter fit left 3 traces, ~0.1 s of the chief, in the timed one).
            model.fit(x, y, batch_size=bs, verbose=0)
            coord = strategy.coordinator(model)
            taken0 = [len(a) for a in coord.assignment]
            b0 = link_bytes(tasks) if tasks else {}
            pids = list(tasks) or [os.getpid()]
            c0 = [cpu_seconds([p]) for p in pids]
            counter.counts.clear()
            counter.counting = True
            t0 = time.perf_counter()
            model.fit(x, y, batch_size=bs, verbose=0)
            dt = time.perf_counter() - t0
            counter.counting = False
            cpu = [cpu_seconds([p]) - c for p, c in zip(pids, c0)]
            b1 = link_bytes(tasks) if tasks else {}
            share = [(len(a) - t) / n for a, t in zip(coord.assignment, taken0)]
            links = {f"{k[0]}-{k[1]}": (b1[k] - b0.get(k, 0)) / n for k in b1}
            results.append({"params": model.count_params(), "n_m": n_m, "mb_per_s": n / dt,
                            "cpu_ms": sum(cpu) / n * 1e3,
                            "cpu_by_task": {tasks.get(p, "process"): c / n * 1e3
                                            for p, c in zip(pids, cpu)},
                            "links": links, "share": share,
                            "calls": {k: c / n for k, c in counter.by_kind().items()
                                      if k != "trace"},
                            "traces": counter.by_kind().get("trace", 0),
                            "calls_by_op": {f"{k} {o}": c / n
                                            for (k, o), c in counter.counts.items()},
                            "input_bytes": bs * (FEATURES * 4 + 8)})
            strategy.close()
            del model, strategy
    return results


def _child(mode: str, extra: list[str]) -> list[dict]:
    args = [sys.executable, "-m", "benchmarks.wire_speed", f"--mode={mode}",
            f"--params={','.join(_PARAMS.value)}", f"--n_m={','.join(_N_M.value)}",
            f"--clock_distance={_D.value}", f"--minibatches={_MINIBATCHES.value}",
            f"--batch_size={_BATCH_SIZE.value}", f"--calls_by_op={_CALLS_BY_OP.value}",
            f"--compensation={_COMPENSATION.value}",
            *extra]
    env = {**os.environ, "TF_CPP_MIN_LOG_LEVEL": "3"}
    proc = subprocess.run(args, capture_output=True, text=True, env=env)
    if proc.returncode != 0:
        raise RuntimeError(f"The {mode} measurement failed:\n{proc.stderr[-3000:]}")
    return json.loads(proc.stdout.strip().splitlines()[-1])


def _check_flags() -> None:
    for name, values in (("params", _PARAMS.value), ("n_m", _N_M.value)):
        if not values or not all(v.isdigit() and int(v) > 0 for v in values):
            raise app.UsageError(f"--{name} must list positive integers. Received: "
                                 f"--{name}={','.join(values)}; pass e.g. --{name}=1,4.")


def main(argv: list[str]) -> None:
    if len(argv) > 2 or (len(argv) == 2 and _MODE.value != "cluster"):
        raise app.UsageError(f"Unexpected arguments: {argv[1:]}.")
    _check_flags()
    comp = compensation(_COMPENSATION)
    if shutil.which("ss") is None:
        raise OSError("This benchmark reads socket counters with `ss` (iproute2), which is "
                      "not installed. Received: no `ss` on PATH; apt-get install iproute2.")
    if _MODE.value is not None:
        print(json.dumps(_measure(_MODE.value, argv[1] if len(argv) == 2 else None)))
        return
    from hetpipe_tf.cluster.serve import start_local_servers

    local = _child("local", [])
    with start_local_servers({"worker": 2, "ps": 1}) as servers:
        names = [f"{job}{i}" for job, n in (("worker", 2), ("ps", 1)) for i in range(n)]
        info = {"cluster": servers.cluster, "pids": dict(zip(servers.pids, names))}
        remote = _child("cluster", [json.dumps(info)])
    print(f"setting: 2 VWs x 1 stage (cluster: one per worker task, w_global on a ps task; "
          f"one process: 2 logical CPU devices), D={_D.value}, compensation "
          f"{comp.value}, Adam, batch "
          f"{_BATCH_SIZE.value}, MLP {FEATURES}-in x {DEPTH} Dense; throughput and bytes "
          f"of one fit (run) of {_MINIBATCHES.value} minibatches; all "
          "tasks on 127.0.0.1 (one machine, shared cores)")
    print(f"{'params':>10} {'N_m':>4} {'1-proc mb/s':>12} {'cluster mb/s':>13} "
          f"{'ratio':>6} {'1-proc CPU ms':>13} {'cluster CPU ms':>14}  {'link':<14} {'MB/minibatch':>13} {'WSP min MB':>11} "
          f"{'x min':>6}")
    for a, b in zip(local, remote):
        size = b["params"] * 4
        head = (f"{b['params']:>10,} {b['n_m']:>4} {a['mb_per_s']:>12.2f} "
                f"{b['mb_per_s']:>13.2f} {b['mb_per_s'] / a['mb_per_s']:>6.2f} "
                f"{a['cpu_ms']:>13.1f} {b['cpu_ms']:>14.1f}")
        for link in sorted(b["links"]):
            got = b["links"][link]
            ends = link.split("-")
            if ends[0].startswith("ps") and ends[1].startswith("worker"):
                # One push and one pull a wave of the VW, which took this share of them.
                minimum = 2 * size / b["n_m"] * b["share"][int(ends[1][len("worker"):])]
            elif ends[0] == "chief" and ends[1].startswith("worker"):
                minimum = b["input_bytes"] * b["share"][int(ends[1][len("worker"):])]
            else:
                minimum = 0.0
            ratio = f"{got / minimum:>6.2f}" if minimum else f"{'-':>6}"
            print(f"{head}  {link:<14} {got / _MB:>13.3f} {minimum / _MB:>11.3f} {ratio}")
            head = " " * len(head)
        print(" " * 16 + "cluster CPU ms by task: " + ", ".join(
            f"{t} {ms:.1f}" for t, ms in sorted(b["cpu_by_task"].items())))
        for mode, r in (("chief", b), ("one process", a)):
            calls = r["calls"]
            print(" " * 16 + f"{mode} calls per minibatch: {sum(calls.values()):.1f} ("
                  + ", ".join(f"{k} {calls.get(k, 0.0):.1f}"
                              for k in ("compiled", "eager op", "host read"))
                  + f"); functions traced in the timed fit: {r['traces']}")
            if _CALLS_BY_OP.value:
                for op, c in sorted(r["calls_by_op"].items(), key=lambda kv: -kv[1]):
                    print(" " * 20 + f"{c:7.2f}  {op}")


if __name__ == "__main__":
    run(main)
