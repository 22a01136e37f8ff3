"""What the binaries of benchmarks/ share: how they end on bad input, --cluster,
--compensation, TensorFlow's thread pools and Markdown tables.

`run(main)` is absl's `app.run(main)`, except that an error of the user's making ends the
process with one line on stderr and a non-zero exit, without a traceback and without the
whole --help before it: `app.UsageError` (exit 2) and the library's validation errors,
`ValueError` (which `PartitionError`, `AllocationError` and `PlacementError` are) and
`OSError` (exit 1). Any other exception is a bug and keeps its traceback.
"""

from __future__ import annotations

import os
import sys
from typing import Callable

from absl import app, flags

# TF-free: the binaries' --help lists the names without loading TensorFlow.
from hetpipe_tf.pipeline.compensation import PRESET_NAMES, Compensation

USAGE_EXIT, ERROR_EXIT = 2, 1


def _one_line(message: str) -> str:
    return " ".join(str(message).split())


def run(main: Callable[[list[str]], object]) -> None:
    def checked(argv: list[str]):
        try:
            return main(argv)
        except app.UsageError as e:
            sys.stderr.write(f"usage error: {_one_line(e)}\n")
        except (ValueError, OSError) as e:
            sys.stderr.write(f"error: {_one_line(e)}\n")
            sys.exit(ERROR_EXIT)
        sys.exit(USAGE_EXIT)

    app.run(checked)


def load_cluster(value: str, flag: str = "--cluster"):
    """The cluster a --cluster flag names: 'paper' or a cluster JSON file ('local' is each
    binary's own). Custom device types in the file are registered by loading it."""
    from hetpipe_tf.cluster.spec import Cluster, paper_cluster

    if value == "paper":
        return paper_cluster()
    if not value.lstrip().startswith("{") and not os.path.isfile(value):
        raise app.UsageError(
            f"{flag} must be 'local', 'paper' or the path of a cluster JSON file. Received: "
            f"{flag}={value} (no such file); fix the name or write the file with "
            "hetpipe_tf.cluster.spec.Cluster.to_json.")
    try:
        return Cluster.from_json(value)
    except ValueError as e:
        raise ValueError(f"{flag}={value}: {e}") from None


def compensation_flag(default: str) -> flags.FlagHolder:
    """Defines --compensation, the staleness compensation of every HetPipeStrategy a binary
    builds; read it with `compensation(flag)` at the start of main. default "none": the
    paper's rules, which the runtime figures in docs/ were measured under; "": the
    strategy's own default (BOTH). Checked in main, not by absl at parsing, so a bad name
    is the one-line usage error of `run`."""
    if default == "none":
        what = ("Default none: the paper's rules, under which the figures in docs/ were "
                "measured (the strategy's own default is both).")
    else:
        what = "Empty (the default): the strategy's default, both."
    # The binary's flag, so that its --helpshort lists it (absl names __main__ by argv[0]).
    caller = sys._getframe(1).f_globals["__name__"]
    return flags.DEFINE_string(
        "compensation", default, "Staleness compensation of every HetPipeStrategy built: a "
        f"hetpipe_tf Compensation name ({', '.join(PRESET_NAMES)}; "
        f"docs/convergence.md). {what} HetSeq strategies always get none.",
        module_name=sys.argv[0] if caller == "__main__" else caller)


def compensation(flag: flags.FlagHolder):
    """The hetpipe_tf Compensation --compensation names; None for "" (the strategy's
    default). Any other value is an app.UsageError."""
    if not flag.value:
        return None
    try:
        return Compensation.parse(flag.value)
    except ValueError:
        raise app.UsageError(
            "--compensation must name a hetpipe_tf Compensation. Received: "
            f"--compensation={flag.value}; use one of "
            f"{', '.join(PRESET_NAMES)}.") from None


def speed_factors_flag(default: list[str], help: str) -> flags.FlagHolder:
    """Defines --speed_factors, the EMULATED speed factor of each logical CPU device: numbers
    in (0, 1], at least one (absl refuses anything else at parsing)."""
    caller = sys._getframe(1).f_globals["__name__"]
    holder = flags.DEFINE_list("speed_factors", default, help,
                               module_name=sys.argv[0] if caller == "__main__" else caller)
    flags.register_validator(
        "speed_factors", _speed_factors_ok, message="--speed_factors must be numbers in "
        "(0, 1], one per device, at least one device.")
    return holder


def _speed_factors_ok(values: list[str]) -> bool:
    try:
        return bool(values) and all(0 < float(v) <= 1 for v in values)
    except ValueError:
        return False


def op_threads(intra: int, inter: int) -> None:
    """Sets TensorFlow's intra- and inter-op thread pools the binary's figures are measured
    with (before its first op). In a process whose TensorFlow already runs, e.g. a test
    calling the binary's main, the pools cannot change and stay as they are."""
    import tensorflow as tf

    try:
        tf.config.threading.set_intra_op_parallelism_threads(intra)
        tf.config.threading.set_inter_op_parallelism_threads(inter)
    except RuntimeError:   # "cannot be modified after initialization"
        pass


def markdown_table(rows: list[tuple[str, ...]]) -> str:
    """rows[0] is the header; every cell a string. A Markdown table, columns padded."""
    widths = [max(len(r[i]) for r in rows) for i in range(len(rows[0]))]
    lines = ["| " + " | ".join(c.ljust(w) for c, w in zip(r, widths)) + " |" for r in rows]
    lines.insert(1, "| " + " | ".join("-" * w for w in widths) + " |")
    return "\n".join(lines)
