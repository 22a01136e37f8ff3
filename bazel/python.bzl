"""A Python toolchain for the interpreter of the active environment (offline, no downloads).

Bazel's native py_* rules run whatever interpreter the registered toolchain names. This
repository rule resolves the active interpreter once (PYTHON_BIN_PATH, else python3 on
PATH, else python) to its `sys.executable`, so tests see the packages pip installed
there, including a virtualenv's site-packages.
"""

def _local_python_toolchain_impl(rctx):
    python = rctx.os.environ.get("PYTHON_BIN_PATH", "").strip()
    if not python:
        python = rctx.which("python3") or rctx.which("python")
    if not python:
        fail("No Python interpreter found. Received: PATH=%s; activate an environment " %
             rctx.os.environ.get("PATH", "") + "or set PYTHON_BIN_PATH=/path/to/python3.")
    res = rctx.execute([
        python,
        "-c",
        "import sys; print(sys.executable); print(sys.version_info[0])",
    ])
    if res.return_code != 0:
        fail("Python interpreter %s does not run. Received: stderr=%s; set PYTHON_BIN_PATH." %
             (python, res.stderr))
    lines = res.stdout.strip().splitlines()
    executable, major = lines[0].strip(), lines[1].strip()
    if major != "3":
        fail("Python 3 is required. Received: %s is Python %s; set PYTHON_BIN_PATH." %
             (executable, major))
    rctx.file("BUILD.bazel", """\
load("@bazel_tools//tools/python:toolchain.bzl", "py_runtime_pair")

# Interpreter: {exe}
py_runtime(
    name = "py3_runtime",
    interpreter_path = "{exe}",
    python_version = "PY3",
    stub_shebang = "#!{exe}",
)

py_runtime_pair(
    name = "runtime_pair",
    py3_runtime = ":py3_runtime",
)

toolchain(
    name = "toolchain",
    toolchain = ":runtime_pair",
    toolchain_type = "@bazel_tools//tools/python:toolchain_type",
)
""".format(exe = executable))

local_python_toolchain = repository_rule(
    implementation = _local_python_toolchain_impl,
    environ = ["PYTHON_BIN_PATH", "PATH", "VIRTUAL_ENV", "PYENV_VERSION"],
    local = True,
)
