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


def test_every_public_name_resolves_to_what_its_module_defines():
    import importlib

    for name, module in hetpipe_tf._PUBLIC.items():
        assert getattr(hetpipe_tf, name) is getattr(importlib.import_module(module), name)
    # What users catch and pass by name (docs/cluster_jobs.md, docs/hetseq.md).
    assert issubclass(hetpipe_tf.TaskLostError, RuntimeError)
    assert hetpipe_tf.DataParallel("hetseq") is hetpipe_tf.DataParallel.HETSEQ
    assert hetpipe_tf.FaultPolicy("continue") is hetpipe_tf.FaultPolicy.CONTINUE


def test_conftest_provides_four_logical_cpus():
    assert len(tf.config.list_logical_devices("CPU")) == 4
