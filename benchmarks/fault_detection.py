r"""How long a cluster job takes to name a lost task: SIGKILL and SIGSTOP of a worker and
of the parameter server, in the middle of a fit.

  python -m benchmarks.fault_detection                       # fault_timeout_s = 5
  python -m benchmarks.fault_detection --fault_timeout_s=30 --faults=worker:SIGSTOP
  python -m benchmarks.fault_detection --on_fault=continue --faults=worker:SIGKILL,worker:SIGSTOP

For each fault: real `tf.distribute.Server` processes on 127.0.0.1 (2 workers + 1 ps,
`hetpipe_tf.cluster.serve.start_local_servers`, stopped on exit), a chief process
(tests/ps/chief_faults.py: 2 one-stage VWs, NP allocation) that sends the signal after
--at_batch batches; prints the seconds from the signal to `fit` raising, the error's type
and task, and the seconds `strategy.close()` took. A dead task is found by its refused
probes (about two probe intervals); a frozen one when it has not answered for
fault_timeout_s (docs/cluster_jobs.md). With --on_fault=continue (2 epochs; a worker
fault), prints instead the seconds from the signal to the lost VW's drop and to the first
batch after it, the VWs dropped, and whether fit and evaluate completed with finite losses.
One run on whatever machine runs it.
"""

from __future__ import annotations

import json
import math
import subprocess
import sys
import time

from absl import app, flags

from benchmarks._cli import run

_TIMEOUT = flags.DEFINE_float("fault_timeout_s", 5.0, "HetPipeStrategy's fault_timeout_s.",
                              lower_bound=0.5)
_FAULTS = flags.DEFINE_list("faults", ["worker:SIGKILL", "worker:SIGSTOP", "ps:SIGKILL",
                                       "ps:SIGSTOP"], "Faults, each job:signal.")
_AT_BATCH = flags.DEFINE_integer("at_batch", 8, "Batches before the signal.", lower_bound=1)
_ON_FAULT = flags.DEFINE_enum("on_fault", "stop", ["stop", "continue"],
                              "HetPipeStrategy's on_fault.")

_VICTIM = {"worker": 1, "ps": 2}   # index in LocalServers.pids: worker:1, ps:0


def main(argv: list[str]) -> None:
    if len(argv) > 1:
        raise app.UsageError(f"Unexpected arguments: {argv[1:]}.")
    from hetpipe_tf.cluster.serve import start_local_servers

    cont = _ON_FAULT.value == "continue"
    print(f"fault_timeout_s={_TIMEOUT.value}  on_fault={_ON_FAULT.value}  "
          "(2 workers + 1 ps + chief on 127.0.0.1)")
    if cont:
        print(f"{'fault':<16} {'raised':<16} {'dropped':<8} {'drop_s':>7} "
              f"{'next_batch_s':>12} {'finite':>7} {'close_s':>8}")
    else:
        print(f"{'fault':<16} {'raised':<16} {'task':<9} {'detect_s':>9} {'close_s':>8}")
    for fault in _FAULTS.value:
        job, _, sig = fault.partition(":")
        if job not in _VICTIM or sig not in ("SIGKILL", "SIGSTOP"):
            raise app.UsageError(f"A fault is job:signal with job worker|ps and signal "
                                 f"SIGKILL|SIGSTOP. Received: {fault!r}.")
        with start_local_servers({"worker": 2, "ps": 1}) as servers:
            args = {"cluster": servers.cluster, "victim_pid": servers.pids[_VICTIM[job]],
                    "signal": sig, "timeout_s": _TIMEOUT.value, "at_batch": _AT_BATCH.value,
                    "samples": 2048, "on_fault": _ON_FAULT.value, "epochs": 2 if cont else 1}
            t0 = time.monotonic()
            proc = subprocess.run([sys.executable, "-m", "tests.ps.chief_faults",
                                   json.dumps(args)], capture_output=True, text=True,
                                  timeout=600 + 4 * _TIMEOUT.value)
        if proc.returncode != 0:
            raise RuntimeError(f"The chief of {fault} failed after {time.monotonic() - t0:.0f}"
                               f" s:\n{proc.stderr[-3000:]}")
        out = json.loads(proc.stdout.strip().splitlines()[-1])
        if cont:
            def r(v):
                return v if v is None else round(v, 3)
            finite = (out["raised"] is None and all(math.isfinite(v) for v in out["losses"])
                      and math.isfinite(out["evaluate"]))
            print(f"{fault:<16} {str(out['raised']):<16} {str(out.get('dropped')):<8} "
                  f"{r(out.get('drop_s'))!s:>7} {r(out.get('first_batch_s'))!s:>12} "
                  f"{finite!s:>7} {out['close_s']:>8.2f}", flush=True)
            continue
        after = out["after_s"]
        print(f"{fault:<16} {str(out['raised']):<16} {str(out.get('task')):<9} "
              f"{after if after is None else round(after, 2)!s:>9} "
              f"{out['close_s']:>8.2f}", flush=True)


if __name__ == "__main__":
    run(main)
