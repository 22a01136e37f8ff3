"""benchmarks/chief_cpu.py end to end on real server processes, tiny setting (1 VW, 2
minibatches): one table row with HetPipe's chief CPU and calls per minibatch beside
ParameterServerStrategy's, and the cluster-against-one-process ratios. main runs in this
process; it starts the measuring chiefs and the servers as processes of their own (a
chief's TensorFlow context is connected to its cluster for good). No timing assertions
(the figures come from one run of the binary)."""

import re

import pytest
from absl import flags

from tests.benchmarks.binaries import run_main

_ROW = re.compile(r"^\s*(\d+)" + r"\s+([\d.]+)" * 11 + r"$")


def test_one_row_per_vw_count_with_pss_beside():
    ran = run_main("benchmarks.chief_cpu", "--virtual_workers=1", "--minibatches=2",
                   "--params=2000", "--batch_size=4", "--steps_per_function=2")
    lines = ran.stdout.strip().splitlines()
    assert lines[0].startswith("setting: V VWs x 1 stage") and "K=2" in lines[0], ran.stdout
    assert "chief CPU ms/mb" in lines[1] and "PSS K" in lines[1] and "wall eff" in lines[1]
    row = _ROW.match(lines[2])
    assert row, ran.stdout
    v, chief, pss1, pssk, calls, pss1_calls, pssk_calls, cluster, local, cpu_eff, wall_eff, \
        pss_cluster = (float(g) for g in row.groups())
    assert v == 1 and chief > 0 and cluster >= chief and local > 0, ran.stdout
    assert pss1 > 0 and pss_cluster > 0 and cpu_eff > 0 and wall_eff > 0, ran.stdout
    # Every HetPipe minibatch makes at least its stage's call and the Keras step's; PSS
    # makes one scheduled call a minibatch, one per K = 2 in the K column.
    assert calls >= 2 and pss1_calls == 1.0 and pssk_calls == 0.5, ran.stdout


def test_bad_vw_counts_are_refused_by_absl():
    with pytest.raises(flags.IllegalFlagValueError, match="--virtual_workers must list"):
        run_main("benchmarks.chief_cpu", "--virtual_workers=0")
