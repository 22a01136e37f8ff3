r"""The CPU time of a command and every process it starts, by kind of process.

  python -m benchmarks.process_cpu -- python -m pytest -q -n 2 --dist loadscope tests
  python -m benchmarks.process_cpu --top=40 -- python -m pytest -q tests/ps/test_faults.py

Runs the command, reads /proc every --interval_s for the processes descended from it
(user + system CPU-seconds of each, last seen before it ended, so within one interval of
the truth; a process that outlives its parent is followed once seen), and prints one row
per kind: pytest-xdist workers (the tests that run in the test process), server processes
(`python -m hetpipe_tf.cluster.serve`, the zygote of `start_local_servers` and its forks),
`python -m <module>` by module, `python <script>` by script, other commands by their
first word. Where a CPU-second goes in a suite that starts many TensorFlow processes:
the figures of docs/building.md "What the suite costs". Linux only (/proc). The command's
exit status is this binary's.
"""

from __future__ import annotations

import collections
import dataclasses
import os
import shlex
import subprocess
import time

from absl import app, flags

from benchmarks._cli import run

_INTERVAL = flags.DEFINE_float("interval_s", 0.3, "Seconds between two reads of /proc.",
                               lower_bound=0.01)
_TOP = flags.DEFINE_integer("top", 25, "Rows printed (the kinds that used most CPU).",
                            lower_bound=1)


@dataclasses.dataclass
class Seen:
    kind: str
    cpu_s: float = 0.0


def _stat(pid: str) -> tuple[int, float, int] | None:
    """(ppid, user + system CPU-seconds, start time in ticks) of process `pid`."""
    try:
        with open(f"/proc/{pid}/stat") as f:
            fields = f.read().rsplit(")", 1)[1].split()
    except OSError:
        return None
    ticks = os.sysconf("SC_CLK_TCK")
    return int(fields[1]), (int(fields[11]) + int(fields[12])) / ticks, int(fields[19])


def _argv(pid: int) -> list[str]:
    try:
        with open(f"/proc/{pid}/cmdline") as f:
            return [w for w in f.read().split("\0") if w]
    except OSError:
        return []   # gone


def kind_of(words: list[str]) -> str:
    """The row a process counts in, from its command line's words."""
    if not words:
        return "(no command line)"
    text = " ".join(words)
    if "xdist" in text or "exec(eval(sys.stdin.readline()))" in text:
        return "pytest-xdist worker (in-process tests)"
    if "hetpipe_tf.cluster.serve" in text or "hetpipe_tf.cluster.forked" in text:
        return "servers (hetpipe_tf.cluster.serve / forked)"
    if "-m" in words[:-1]:
        return "python -m " + words[words.index("-m") + 1]
    if len(words) > 1 and words[1].endswith(".py"):
        return "python " + words[1]
    if len(words) > 1 and words[1] == "-c":
        return "python -c ..."
    return os.path.basename(words[0])


def measure(command: list[str], interval_s: float) -> tuple[int, dict[tuple, Seen]]:
    """Run `command`; its exit status and every descendant seen: (pid, start) -> Seen."""
    proc = subprocess.Popen(command)
    first = _stat(str(proc.pid))
    seen: dict[tuple, Seen] = {}
    family = {(proc.pid, first[2])} if first else set()   # (pid, start): pids are reused
    while True:
        done = proc.poll() is not None
        stats = {int(p): s for p in os.listdir("/proc") if p.isdigit()
                 and (s := _stat(p)) is not None}
        current = {pid for pid, (_, _, start) in stats.items() if (pid, start) in family}
        grew = True
        while grew:   # descendants of the command, and those seen before they were left
            grew = False
            for pid, (ppid, _, start) in stats.items():
                if ppid in current and pid not in current:
                    current.add(pid)
                    family.add((pid, start))
                    grew = True
        for pid in current:
            ppid, cpu_s, start = stats[pid]
            key = (pid, start)
            if key not in seen:
                seen[key] = Seen(kind_of(_argv(pid)))
            elif cpu_s > 1.0 and seen[key].cpu_s <= 1.0:
                # A fork shows its parent's command line until it execs: read it again.
                if argv := _argv(pid):   # empty: gone, or a zombie
                    seen[key].kind = kind_of(argv)
            seen[key].cpu_s = cpu_s
        if done:
            return proc.returncode, seen
        time.sleep(interval_s)


def table(seen: dict[tuple, Seen], top: int) -> str:
    by_kind: dict[str, list[float]] = collections.defaultdict(list)
    for s in seen.values():
        by_kind[s.kind].append(s.cpu_s)
    total = sum(sum(v) for v in by_kind.values())
    rows = sorted(by_kind.items(), key=lambda kv: -sum(kv[1]))
    lines = [f"{len(seen)} processes, {total:,.1f} CPU-seconds in all", "",
             "| kind | processes | CPU-s | share | CPU-s a process |", "|---|---|---|---|---|"]
    for kind, cpus in rows[:top]:
        lines.append(f"| {kind} | {len(cpus)} | {sum(cpus):,.1f} | "
                     f"{sum(cpus) / max(total, 1e-9):.0%} | {sum(cpus) / len(cpus):.1f} |")
    if len(rows) > top:
        rest = [c for _, cpus in rows[top:] for c in cpus]
        lines.append(f"| {len(rows) - top} other kinds | {len(rest)} | {sum(rest):,.1f} | "
                     f"{sum(rest) / max(total, 1e-9):.0%} | |")
    return "\n".join(lines)


def main(argv: list[str]) -> int:
    command = argv[1:]
    if not command:
        raise app.UsageError("Name the command to measure after `--`. Received: no command; "
                             "e.g. python -m benchmarks.process_cpu -- python -m pytest -q tests")
    if not os.path.isdir("/proc/self"):
        raise OSError("benchmarks.process_cpu reads /proc (Linux). Received: no /proc here.")
    code, seen = measure(command, _INTERVAL.value)
    print(f"\n`{shlex.join(command)}` (exit status {code}); CPU read from /proc every "
          f"{_INTERVAL.value:g} s, one run on this machine:\n")
    print(table(seen, _TOP.value))
    return code


if __name__ == "__main__":
    run(main)
