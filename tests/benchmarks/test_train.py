"""benchmarks/train.py (the README's main job) end to end, tiny settings."""

import re

from tests.benchmarks.binaries import run_binary, run_main

TINY = ("--epochs=1", "--examples=1024", "--min_accuracy=0")


def _plan_blocks(stdout: str) -> list[str]:
    """The text printed for each virtual worker's plan, in VW order."""
    starts = [m.start() for m in re.finditer(r"^virtual worker \d+ \(", stdout, re.M)]
    return [stdout[a:b] for a, b in zip(starts, starts[1:] + [len(stdout)])]


def test_default_job_is_two_virtual_workers_under_wsp():
    proc = run_main("benchmarks.train", *TINY)   # the default: Adam, D=1
    out = proc.stdout
    assert proc.returncode == 0, proc.stderr[-2000:]
    assert "WSP clock distance D=1, optimizer adam" in out
    assert "staleness compensation both (the strategy's default)" in out
    assert "2 virtual workers by NP allocation: vw0=[host0/cpu0, host0/cpu1], " \
           "vw1=[host1/cpu0, host1/cpu1]" in out
    blocks = _plan_blocks(out)
    assert len(blocks) == 2, out
    for block in blocks:
        assert "2 stages" in block and "bottleneck stage" in block
    # Only the last device is slower: it is in VW 1's plan, not in VW 0's.
    assert "emulated x0.5" not in blocks[0] and "emulated x0.5" in blocks[1]
    reached = int(re.search(r"largest clock distance reached: (\d+) \(WSP bound D\+1 = 2\)",
                            out).group(1))
    assert 0 <= reached <= 2
    waits = {int(w): float(s) for w, s in
             re.findall(r"^virtual worker (\d+): waited (\d+\.\d+) s for global weights",
                        out, re.M)}
    assert sorted(waits) == [0, 1] and all(s >= 0 for s in waits.values())
    accuracy = float(re.search(r"Final validation accuracy: (\d\.\d+)", out).group(1))
    assert 0 <= accuracy <= 1


def test_one_virtual_worker_mode_stays_reachable():
    proc = run_main("benchmarks.train", *TINY, "--virtual_workers=1",
                      "--speed_factors=1.0,0.5", "--optimizer=sgd", "--compensation=none")
    out = proc.stdout
    assert proc.returncode == 0, proc.stderr[-2000:]
    assert "1 virtual worker over every device, optimizer sgd" in out
    assert "staleness compensation none\n" in out   # named by --compensation
    blocks = _plan_blocks(out)
    assert len(blocks) == 1 and "emulated x0.5" in blocks[0]
    assert "clock distance" not in out and "global weights" not in out  # no servers
    assert "Final validation accuracy" in out


def test_train_rejects_bad_speed_factors():
    proc = run_binary("benchmarks.train", "--speed_factors=1.0,2")
    assert proc.returncode != 0 and "--speed_factors must be numbers in (0, 1]" in proc.stderr


def test_train_rejects_a_layout_the_devices_cannot_form():
    proc = run_binary("benchmarks.train", "--speed_factors=1,1,1", "--hosts=1")
    assert proc.returncode != 0
    assert "--hosts and --virtual_workers must each divide the number of devices" \
        in proc.stderr


def test_train_refuses_ed_with_one_slow_device_before_training():
    # ED needs identical VWs; one emulated-slower device makes host1's devices unequal.
    proc = run_binary("benchmarks.train", "--allocation=ED")
    assert proc.returncode != 0
    assert "ED needs identical virtual workers" in proc.stderr
    assert "Traceback" not in proc.stderr and "Epoch 1" not in proc.stdout


def test_train_rejects_an_unknown_optimizer():
    proc = run_binary("benchmarks.train", "--optimizer=rmsprop")
    assert proc.returncode != 0 and "--optimizer" in proc.stderr


def test_train_rejects_an_unknown_compensation_in_one_line():
    proc = run_binary("benchmarks.train", "--compensation=magic")
    assert proc.returncode == 2 and "Traceback" not in proc.stderr
    assert "usage error: --compensation must name a hetpipe_tf Compensation. Received: " \
           "--compensation=magic" in proc.stderr
    assert "--helpfull" not in proc.stderr and "Epoch 1" not in proc.stdout
