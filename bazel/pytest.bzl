"""pytest_tests(): one py_test per test_*.py file of a package, run by pytest.

A pytest module has no `if __name__ == "__main__"`, so running it as a py_test's main
would define the tests and exit 0 without running them. Each py_test therefore runs
//bazel:pytest_main.py with the test file as its argument.
"""

def pytest_tests(deps = [], data = [], size = "medium", timeout = "long", tags = []):
    """Declares the py_tests for every test_*.py below this package (not in subpackages).

    Other .py files in the package (helpers) become the py_library `helpers`, which test
    packages in other folders may depend on (`//tests/strategy:helpers`) when they import
    `tests.<folder>.<module>`.
    """
    test_files = native.glob(["**/test_*.py"])
    helpers = native.glob(["**/*.py"], exclude = test_files + ["conftest.py"])
    native.py_library(
        name = "helpers",
        srcs = helpers,
        deps = deps + ["//tests:conftest"],
        testonly = True,
        visibility = ["//tests:__subpackages__"],
    )
    for src in test_files:
        native.py_test(
            name = src[:-len(".py")],
            srcs = [src, "//bazel:pytest_main.py"],
            main = "//bazel:pytest_main.py",
            args = ["$(rootpath %s)" % src],
            deps = [":helpers"] + deps,
            data = data,
            python_version = "PY3",
            srcs_version = "PY3",
            size = size,
            timeout = timeout,
            tags = tags,
        )
