"""Shared pytest setup: quiet TensorFlow logs, 4 logical CPU devices, the `slow` marker.

Every test process sees exactly 4 logical CPU devices (/device:CPU:0 .. CPU:3), made
before TensorFlow initialises its runtime, so multi-device tests can place stages on them.
"""

import os
import sys
import warnings

os.environ.setdefault("TF_CPP_MIN_LOG_LEVEL", "2")

import tensorflow as tf  # noqa: E402  (after TF_CPP_MIN_LOG_LEVEL)

NUM_LOGICAL_CPUS = 4


def _configure_logical_cpus(n=NUM_LOGICAL_CPUS):
    cpu = tf.config.list_physical_devices("CPU")[0]
    if tf.config.get_logical_device_configuration(cpu):
        return  # configured already (e.g. by a test runner that imported us first)
    try:
        tf.config.set_logical_device_configuration(
            cpu, [tf.config.LogicalDeviceConfiguration() for _ in range(n)]
        )
    except RuntimeError as e:  # the runtime was initialised before this conftest ran
        warnings.warn(f"Could not create {n} logical CPU devices: {e}", stacklevel=1)


_configure_logical_cpus()


def pytest_configure(config):
    config.addinivalue_line(
        "markers", "slow: long-running test (deselect with -m 'not slow')"
    )


def pytest_unconfigure(config):
    # The server zygote of `start_local_servers` (hetpipe_tf/cluster/forked.py), stopped by
    # its pid: it would also end with this process.
    forked = sys.modules.get("hetpipe_tf.cluster.forked")
    if forked is not None:
        forked.stop()
