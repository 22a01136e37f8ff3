"""The package imports and reports its version; the test environment has 4 CPU devices."""

import re

import tensorflow as tf

import hetpipe_tf


def test_version_is_a_release_string():
    assert re.fullmatch(r"\d+\.\d+\.\d+", hetpipe_tf.__version__)


def test_subpackages_import():
    import hetpipe_tf.cluster  # noqa: F401
    import hetpipe_tf.partitioner  # noqa: F401
    import hetpipe_tf.ps  # noqa: F401
    import hetpipe_tf.sim  # noqa: F401
    import hetpipe_tf.strategy  # noqa: F401


def test_conftest_provides_four_logical_cpus():
    assert len(tf.config.list_logical_devices("CPU")) == 4
