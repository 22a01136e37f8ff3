"""Tests of the communication model (hetpipe_tf.partitioner.comm)."""

import json
import os
import pathlib
import subprocess
import sys

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from hetpipe_tf.cluster.local import configure_logical_devices
from hetpipe_tf.cluster.spec import Cluster, Device, Host
from hetpipe_tf.partitioner.comm import (
    DEFAULT_INTRA_SCALE,
    CommModel,
    LinearFit,
    fit_inter_host,
    fit_intra_scale,
    measure_transfer,
)

REPO_ROOT = pathlib.Path(__file__).resolve().parents[2]
SIZES = [2**10, 2**16, 2**20]


@pytest.fixture(scope="module")
def two_logical_cpus():
    """Two logical CPU devices in this process, or None if TensorFlow was initialised
    earlier (by another test module) with fewer; the test then uses a fresh process."""
    try:
        configure_logical_devices(2)
    except RuntimeError:
        return None
    return ("/device:CPU:0", "/device:CPU:1")


def _cluster():
    h0 = Host("h0", (Device("h0/a", "TITAN_V", "h0", "/device:GPU:0"),
                     Device("h0/b", "TITAN_V", "h0", "/device:GPU:1")), 10e9)
    h1 = Host("h1", (Device("h1/a", "T4", "h1", "/device:GPU:2"),), 12e9)
    return Cluster((h0, h1), inter_bandwidth=4e9)


# ------------------------------------------------------------------ fitting


def test_linear_fit_recovers_known_line():
    intercept, slope = 2e-4, 1 / 5e9
    samples = [(n, intercept + slope * n) for n in (1_000, 10**5, 10**6, 10**7, 10**8)]
    fit = fit_inter_host(samples)
    assert fit.intercept_s == pytest.approx(intercept, rel=1e-6)
    assert fit.seconds_per_byte == pytest.approx(slope, rel=1e-9)
    assert fit.predict(5 * 10**7) == pytest.approx(intercept + slope * 5 * 10**7)


@settings(max_examples=40, deadline=None)
@given(intercept=st.floats(0.0, 1e-2), bandwidth=st.floats(1e8, 1e11),
       sizes=st.lists(st.integers(1, 10**9), min_size=2, max_size=8, unique=True))
def test_linear_fit_property(intercept, bandwidth, sizes):
    samples = [(n, intercept + n / bandwidth) for n in sizes]
    fit = fit_inter_host(samples)
    for n in sizes:
        assert fit.predict(n) == pytest.approx(intercept + n / bandwidth, rel=1e-6, abs=1e-12)


def test_linear_fit_least_squares_on_noisy_samples():
    # Symmetric noise around the line a + b*n leaves the least-squares line unchanged.
    a, b = 1e-3, 1e-9
    samples = []
    for n in (10**6, 2 * 10**6, 3 * 10**6):
        samples += [(n, a + b * n + 1e-5), (n, a + b * n - 1e-5)]
    fit = fit_inter_host(samples)
    assert fit.intercept_s == pytest.approx(a, rel=1e-6)
    assert fit.seconds_per_byte == pytest.approx(b, rel=1e-6)


def test_fit_needs_two_distinct_sizes():
    with pytest.raises(ValueError, match="at least 2 distinct sizes. Received: sizes=\\[100\\]"):
        fit_inter_host([(100, 1e-3), (100, 2e-3)])
    with pytest.raises(ValueError, match="Received: sizes=\\[\\]"):
        fit_inter_host([])


def test_fit_rejects_bad_samples():
    with pytest.raises(ValueError, match="Received: sample="):
        fit_inter_host([(100, 1e-3), (200, -1.0)])
    with pytest.raises(ValueError, match="Received: sample="):
        fit_inter_host([(100.5, 1e-3), (200, 1e-3)])
    with pytest.raises(ValueError, match="Received: sample=5"):
        fit_inter_host([5, (200, 1e-3)])
    with pytest.raises(ValueError, match="negative slope"):
        fit_inter_host([(100, 2e-3), (200, 1e-3)])


def test_predict_is_never_negative_and_zero_bytes_is_free():
    fit = LinearFit(intercept_s=-1e-3, seconds_per_byte=1e-9)
    assert fit.predict(10) == 0.0
    assert fit.predict(0) == 0.0
    assert fit.predict(10**7) == pytest.approx(9e-3)
    with pytest.raises(ValueError, match="Received: seconds_per_byte=-1"):
        LinearFit(0.0, -1.0)
    with pytest.raises(ValueError, match="Received: intercept_s=nan"):
        LinearFit(float("nan"), 1.0)


def test_fit_intra_scale():
    bandwidth = 15.75e9
    achieved = 0.6 * bandwidth
    samples = [(n, 5e-5 + n / achieved) for n in (2**16, 2**20, 2**24)]
    assert fit_intra_scale(samples, bandwidth) == pytest.approx(0.6, rel=1e-6)
    with pytest.raises(ValueError, match="Received: bandwidth=0"):
        fit_intra_scale(samples, 0)
    with pytest.raises(ValueError, match="does not grow with size"):
        fit_intra_scale([(2**10, 1e-4), (2**20, 1e-4)], bandwidth)


# ---------------------------------------------------------------- the model


def test_seconds_same_device_is_zero():
    c = _cluster()
    assert CommModel().seconds(10**6, "h0/a", "h0/a", c) == 0.0
    assert CommModel().seconds(0, "h0/a", "h1/a", c) == 0.0


def test_seconds_same_host_uses_scaled_pcie():
    c = _cluster()
    m = CommModel(intra_scale=0.5)
    assert m.seconds(10**9, "h0/a", "h0/b", c) == pytest.approx(10**9 / (10e9 * 0.5))
    assert CommModel().intra_scale == DEFAULT_INTRA_SCALE == 0.7
    assert CommModel().seconds(7 * 10**8, c.device("h0/b"), c.device("h0/a"), c) == \
        pytest.approx(0.1)


def test_seconds_cross_host():
    c = _cluster()
    assert CommModel().seconds(8 * 10**9, "h0/a", "h1/a", c) == pytest.approx(2.0)
    fitted = CommModel(inter=LinearFit(intercept_s=1e-3, seconds_per_byte=1e-9))
    assert fitted.seconds(10**6, "h1/a", "h0/b", c) == pytest.approx(1e-3 + 1e-3)
    # The intra-host term does not use the inter-host fit.
    assert fitted.seconds(10**9, "h0/a", "h0/b", c) == pytest.approx(10**9 / (10e9 * 0.7))


def test_comm_model_validation_and_json():
    with pytest.raises(ValueError, match="Received: intra_scale=0"):
        CommModel(intra_scale=0)
    with pytest.raises(ValueError, match="Received: inter="):
        CommModel(inter=(1.0, 2.0))
    with pytest.raises(ValueError, match="Received: nbytes=-1"):
        CommModel().seconds(-1, "h0/a", "h1/a", _cluster())
    with pytest.raises(ValueError, match="Received: name='zz'"):
        CommModel().seconds(1, "h0/a", "zz", _cluster())
    for m in (CommModel(), CommModel(0.55, LinearFit(2e-4, 3e-10))):
        assert CommModel.from_dict(json.loads(json.dumps(m.to_dict()))) == m


# -------------------------------------------------------------- measurement

_MEASURE_SCRIPT = """
import json, sys
from hetpipe_tf.cluster.local import configure_logical_devices
from hetpipe_tf.partitioner.comm import measure_transfer
configure_logical_devices(2)
print(json.dumps(measure_transfer("/device:CPU:0", "/device:CPU:1", %r, repeats=2)))
"""


def test_measure_transfer_between_logical_cpus(two_logical_cpus):
    if two_logical_cpus is not None:
        samples = measure_transfer(*two_logical_cpus, SIZES, repeats=2)
    else:
        env = {**os.environ, "TF_CPP_MIN_LOG_LEVEL": "2", "PYTHONPATH": os.pathsep.join(
            [str(REPO_ROOT), os.environ.get("PYTHONPATH", "")])}
        proc = subprocess.run([sys.executable, "-c", _MEASURE_SCRIPT % (SIZES,)], env=env,
                              capture_output=True, text=True, timeout=120)
        assert proc.returncode == 0, proc.stderr[-2000:]
        samples = [tuple(s) for s in json.loads(proc.stdout.strip().splitlines()[-1])]
    assert [n for n, _ in samples] == SIZES
    assert all(isinstance(n, int) for n, _ in samples)
    assert all(isinstance(t, float) and t > 0 for _, t in samples)


def test_measure_transfer_validation():
    with pytest.raises(ValueError, match="Received: size=0"):
        measure_transfer("/device:CPU:0", "/device:CPU:0", [0])
    with pytest.raises(ValueError, match="Received: repeats=0"):
        measure_transfer("/device:CPU:0", "/device:CPU:0", [8], repeats=0)
