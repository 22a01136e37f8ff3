r"""The switch table (issue 19 point 5): the switch suite's Keras scripts under plain Keras,
MirroredStrategy (2 logical CPUs) and HetPipeStrategy (1 VW x 2 stages; 2 VWs x 2 stages),
only the strategy line differing; prints, per script, whether each HetPipe setting finished
and its largest difference to its reference (1 VW: plain Keras; 2 VWs: MirroredStrategy
with the global batch 2B and twice the learning rate, see tests/strategy/switch_scripts.py).

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

HETPIPE = ("hetpipe_1vw", "hetpipe_2vw")


def _cell(result, reference) -> str:
    if isinstance(result, BaseException):
        return f"FAILS: {type(result).__name__}: {str(result).splitlines()[0][:60]}"
    if isinstance(reference, BaseException):
        return "runs (reference failed)"
    diff, where = sw.max_difference(result, reference)
    return f"runs, max |diff| {diff:.1e}" + (f" ({where})" if diff > 1e-5 else "")


def main(argv: list[str]) -> None:
    wanted = [name for name in sw.SCRIPTS if not argv or any(a in name for a in argv)]
    rows = []
    with tempfile.TemporaryDirectory() as tmp:
        for script in wanted:
            results = {}
            for setting in sw.SETTINGS:
                try:
                    results[setting] = sw.run(script, setting,
                                              os.path.join(tmp, script[:8], setting))
                except Exception as e:   # noqa: BLE001  (printed in the table)
                    results[setting] = e
            if script.startswith("save"):
                ok = {k: r for k, r in results.items() if not isinstance(r, BaseException)}
                x, _ = sw.data()
                loaded = sw.load_in_fresh_process([r["path"] for r in ok.values()], x)
                for r in ok.values():
                    r["predict"] = loaded[r["path"]]["predict"]   # as the new process sees it
            cells = [_cell(results[h], results[sw.SETTINGS[h].reference]) for h in HETPIPE]
            secs = "/".join(f"{r['seconds']:.1f}" if isinstance(r, dict) else "-"
                            for r in results.values())
            rows.append((script, *cells, secs))
            print(f"{script}: {cells} ({secs} s)", file=sys.stderr, flush=True)
    print("| script | 1 VW x 2 stages, N_m=1 vs plain Keras | 2 VWs x 2 stages, N_m=1, D=0 vs "
          "MirroredStrategy (2B, 2 lr) | seconds plain/mirrored/1 VW/2 VWs |")
    print("| --- | --- | --- | --- |")
    for row in rows:
        print("| " + " | ".join(row) + " |")


if __name__ == "__main__":
    main(sys.argv[1:])
