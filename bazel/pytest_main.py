"""Runs the pytest file(s) given as arguments inside a Bazel test (see pytest.bzl)."""

import os
import sys

import pytest

if __name__ == "__main__":
    args = list(sys.argv[1:])
    tmp = os.environ.get("TEST_TMPDIR")
    if tmp:  # the runfiles tree is read-only: keep caches in the test's scratch dir
        os.environ.setdefault("HYPOTHESIS_STORAGE_DIRECTORY", os.path.join(tmp, "hypothesis"))
        args += ["-p", "no:cacheprovider"]
    if os.environ.get("XML_OUTPUT_FILE"):
        args += ["--junitxml", os.environ["XML_OUTPUT_FILE"]]
    if os.environ.get("TESTBRIDGE_TEST_ONLY"):  # bazel test --test_filter=EXPR
        args += ["-k", os.environ["TESTBRIDGE_TEST_ONLY"]]
    sys.exit(pytest.main(args))
