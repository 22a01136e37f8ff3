r"""The switch table (issue 19 point 5): the switch suite's Keras scripts under plain Keras,
MirroredStrategy (2 logical CPUs) and HetPipeStrategy (1 VW x 2 stages; 2 VWs x 2 stages),
only the strategy line differing; prints, per script, whether each HetPipe setting finished
and its largest difference to its reference (1 VW: plain Keras; 2 VWs: MirroredStrategy
with the global batch 2B and twice the learning rate, see tests/strategy/switch_scripts.py),
and at N_m = 2 (pipelined, stale weights) how far its final weights are from the same layout's
at N_m = 1 (what staleness alone changes).

  python -m experiments.switch_table [script substring ...]

Asserts nothing (tests/strategy/test_switch.py does); about 2-3 minutes on the 2-core machine.
"""

from __future__ import annotations

import os
import sys
import tempfile

os.environ.setdefault("TF_CPP_MIN_LOG_LEVEL", "2")

import tensorflow as tf  # noqa: E402

_cpu = tf.config.list_physical_devices("CPU")[0]
tf.config.set_logical_device_configuration(_cpu, [tf.config.LogicalDeviceConfiguration()] * 4)

from tests.strategy import switch_scripts as sw  # noqa: E402

COMPARED = ("hetpipe_1vw", "hetpipe_2vw", "hetseq")     # equal to a reference
PIPELINED = ("hetpipe_1vw_nm2", "hetpipe_2vw_nm2")   # stale weights: only how far off


def _error(e: BaseException) -> str:
    return f"FAILS: {type(e).__name__}: {str(e).splitlines()[0][:70]}"


def _cell(result, reference) -> str:
    if isinstance(result, BaseException):
        return _error(result)
    if isinstance(reference, BaseException):
        return "runs (reference failed)"
    diff, where = sw.max_difference(result, reference)
    return f"equal, max diff {diff:.1e}" if diff <= 1e-5 else f"DIFFERS {diff:.2g} at {where}"


def _weights_off(result, synchronous) -> str:
    if isinstance(result, BaseException):
        return _error(result)
    diff, _ = sw.max_difference(result["weights"], synchronous["weights"])
    return f"runs, weights differ by {diff:.2g}"


def main(argv: list[str]) -> None:
    wanted = [name for name in sw.SCRIPTS if not argv or any(a in name for a in argv)]
    rows, seconds = [], {k: 0.0 for k in sw.SETTINGS}
    with tempfile.TemporaryDirectory() as tmp:
        results: dict = {}

        def get(script, setting):
            if (script, setting) not in results:
                try:
                    r = sw.run(script, setting, os.path.join(tmp, str(len(results))))
                    seconds[setting] += r["seconds"]
                except Exception as e:   # noqa: BLE001  (printed in the table)
                    r = e
                results[(script, setting)] = r
            return results[(script, setting)]

        for script in wanted:
            for setting in sw.SETTINGS:
                get(script, setting)
            if script.startswith("save"):
                ok = [r for (n, _), r in results.items()
                      if n == script and not isinstance(r, BaseException)]
                x, _ = sw.data()
                loaded = sw.load_in_fresh_process([r["path"] for r in ok], x)
                for r in ok:
                    r["predict"] = loaded[r["path"]]["predict"]   # as the new process sees it
            cells = [_cell(get(script, s), get(*sw.reference(script, s))) for s in COMPARED]
            # Staleness alone: N_m = 2 against the same layout at N_m = 1.
            cells += [_weights_off(get(script, s), get(script, s.replace("_nm2", "")))
                      for s in PIPELINED]
            rows.append((script, *cells))
            print(f"{script}: {cells}", file=sys.stderr, flush=True)
    print("| script | 1 VW x 2 stages, N_m=1: vs plain Keras | 2 VWs x 2 stages, N_m=1, D=0: "
          "vs MirroredStrategy (2B, 2 lr) | HetSeq, 2 devices, shares 5+3: vs plain Keras | "
          "1 VW, N_m=2: vs N_m=1 | 2 VWs, N_m=2, D=0: vs N_m=1 |")
    print("| --- | --- | --- | --- | --- | --- |")
    for row in rows:
        print("| " + " | ".join(row) + " |")
    print("\nwall seconds per setting, all scripts (tracing dominates; not a speed figure): "
          + ", ".join(f"{k} {v:.0f}" for k, v in seconds.items()))
    print("MirroredStrategy references for the PyDataset and generator rows: the same batches "
          "as NumPy arrays (tests/strategy/switch_scripts.py TWO_VW_REFERENCE_SCRIPT).")


if __name__ == "__main__":
    main(sys.argv[1:])
