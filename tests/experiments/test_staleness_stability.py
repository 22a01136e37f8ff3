"""experiments/staleness_stability.py end to end, tiny settings: the model's bound against
its closed form without staleness, and finite eigenvalues (never an accuracy assertion)."""

from tests.benchmarks.binaries import run_binary, run_main, table_rows


def test_tiny_run_prints_both_parts():
    proc = run_main("experiments.staleness_stability", "--seeds=0", "--epochs=1",
                      "--power_iterations=2", "--best_row=false")
    assert proc.returncode == 0, proc.stderr[-2000:]
    rows = table_rows(proc.stdout)
    model = {r[0]: float(r[5]) for r in rows if len(r) == 6 and r[0] != "setting"}
    # Heavy ball without delay is stable iff lr h < 2 (1 + mu): h < 76 at lr 0.05, mu 0.9.
    assert abs(model["plain Keras (no staleness)"] - 76.0) < 0.5
    assert abs(model["plain Keras at BOTH's mu_e 0.6 (no staleness)"] - 64.0) < 0.5
    # Staleness narrows it; the compensations widen it again (the table's claim).
    assert model["paper's rule (NONE), s = 3"] < model["MOMENTUM (mu_e 0.6), s = 3"] < 76.0
    eig = [r for r in rows if len(r) == 4 and r[0] == "0"]
    assert [r[1] for r in eig] == ["0", "1"]
    assert all(float(r[3]) > 0 for r in eig)


def test_bad_seed_is_an_error():
    proc = run_binary("experiments.staleness_stability", "--seeds=x")
    assert proc.returncode != 0
