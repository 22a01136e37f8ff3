"""The package's import graph runs one way (DESIGN.md "The pieces"):

cluster -> partitioner -> core -> pipeline -> ps -> strategy -> observe, with sim beside
(it reads plans and core rules), no cycles between subpackages, and core/ free of
TensorFlow and Keras, also at run time. The partitioner reads core's schedules (their
memory rules); core imports no subpackage.
"""

from __future__ import annotations

import ast
import pathlib
import subprocess
import sys

ROOT = pathlib.Path(__file__).resolve().parents[2]
PKG = ROOT / "hetpipe_tf"

# Which subpackages each one may import (besides itself and the top-level helpers).
ALLOWED = {
    "core": set(),
    "cluster": set(),
    "partitioner": {"cluster", "core"},
    "pipeline": {"core", "cluster", "partitioner"},
    "ps": {"core", "cluster", "partitioner", "pipeline"},
    "strategy": {"core", "cluster", "partitioner", "pipeline", "ps"},
    "observe": {"core", "cluster", "partitioner", "pipeline", "ps", "strategy"},
    "sim": {"core", "cluster", "partitioner", "ps"},
}
TOP_LEVEL = {"_shim", "_args", "models", "launch"}   # modules directly under hetpipe_tf/


def _imports(path: pathlib.Path) -> set[str]:
    """Every `hetpipe_tf.*` / `benchmarks` / `experiments` module a file imports (also
    inside functions)."""
    out = set()
    for node in ast.walk(ast.parse(path.read_text(), str(path))):
        if isinstance(node, ast.Import):
            out.update(a.name for a in node.names)
        elif isinstance(node, ast.ImportFrom) and node.module and node.level == 0:
            out.add(node.module)
            out.update(f"{node.module}.{a.name}" for a in node.names)
    return out


def _subpackage_edges() -> dict[str, set[str]]:
    edges: dict[str, set[str]] = {}
    for f in PKG.rglob("*.py"):
        rel = f.relative_to(PKG).parts
        src = rel[0] if len(rel) > 1 else pathlib.Path(rel[0]).stem
        for mod in _imports(f):
            parts = mod.split(".")
            if parts[0] in ("benchmarks", "experiments", "tests"):
                edges.setdefault(src, set()).add(parts[0])
            if parts[0] == "hetpipe_tf" and len(parts) > 1 and parts[1] != src:
                edges.setdefault(src, set()).add(parts[1])
    return edges


def test_subpackages_import_only_what_the_flow_allows():
    bad = []
    for src, dsts in sorted(_subpackage_edges().items()):
        if src in TOP_LEVEL or src == "__init__":
            continue
        for dst in sorted(dsts):
            if dst in TOP_LEVEL or dst == "__version__":
                continue
            if dst not in ALLOWED.get(src, set()):
                bad.append(f"{src} -> {dst}")
    assert not bad, f"imports against the one-way flow: {bad}"


def test_no_cycles_between_subpackages():
    edges = {s: {d for d in ds if d in ALLOWED} for s, ds in _subpackage_edges().items()
             if s in ALLOWED}
    state: dict[str, int] = {}

    def visit(n, path):
        state[n] = 1
        for m in edges.get(n, ()):
            if state.get(m) == 1:
                raise AssertionError(f"import cycle: {' -> '.join(path + [m])}")
            if m not in state:
                visit(m, path + [m])
        state[n] = 2

    for n in edges:
        if n not in state:
            visit(n, [n])


def _module_edges(subpackage: str) -> dict[str, set[str]]:
    """Module -> the modules of the same subpackage it imports (also inside functions)."""
    prefix = f"hetpipe_tf.{subpackage}."
    edges: dict[str, set[str]] = {}
    for f in (PKG / subpackage).glob("*.py"):
        deps = set()
        for mod in _imports(f):
            if mod.startswith(prefix):
                name = mod[len(prefix):].split(".")[0]
                if (PKG / subpackage / f"{name}.py").exists():
                    deps.add(name)
        edges[f.stem] = deps - {f.stem}
    return edges


def test_no_cycles_between_modules_of_core_and_partitioner():
    for subpackage in ("core", "partitioner"):
        edges = _module_edges(subpackage)
        state: dict[str, int] = {}

        def visit(n, path):
            state[n] = 1
            for m in sorted(edges.get(n, ())):
                if state.get(m) == 1:
                    raise AssertionError(f"import cycle in {subpackage}/: "
                                         f"{' -> '.join(path + [m])}")
                if m not in state:
                    visit(m, path + [m])
            state[n] = 2

        for n in sorted(edges):
            if n not in state:
                visit(n, [n])


def test_core_imports_no_tensorflow_at_run_time():
    code = ("import sys, hetpipe_tf.core.schedule, hetpipe_tf.core.sync_schedule, "
            "hetpipe_tf.core.wsp; "
            "bad = [m for m in ('tensorflow', 'keras', 'numpy') if m in sys.modules]; "
            "print(bad); sys.exit(1 if bad else 0)")
    res = subprocess.run([sys.executable, "-c", code], cwd=ROOT, capture_output=True,
                         text=True, timeout=120)
    assert res.returncode == 0, res.stdout + res.stderr


def test_profiles_plans_and_the_simulator_import_no_tensorflow_at_run_time():
    # A ModelProfile is a JSON value: reading one, planning from it and simulating the plan
    # need no TensorFlow (profiling.py measures with it).
    sim = " ".join(f"hetpipe_tf.sim.{f.stem}," for f in sorted((PKG / "sim").glob("*.py"))
                   if f.stem != "__init__")
    code = (f"import sys, hetpipe_tf.partitioner.profile, hetpipe_tf.partitioner.milp, {sim} "
            "hetpipe_tf.sim; bad = [m for m in ('tensorflow', 'keras') if m in sys.modules]; "
            "print(bad); sys.exit(1 if bad else 0)")
    res = subprocess.run([sys.executable, "-c", code], cwd=ROOT, capture_output=True,
                         text=True, timeout=120)
    assert res.returncode == 0, res.stdout + res.stderr


def test_core_sources_name_no_tensorflow():
    for f in (PKG / "core").rglob("*.py"):
        mods = {m.split(".")[0] for m in _imports(f)}
        assert not mods & {"tensorflow", "keras"}, f"{f.name} imports {mods}"


def test_experiments_stand_on_the_installed_package_alone():
    """No module of experiments/ imports benchmarks/ (DESIGN.md "The pieces": what both
    use is in hetpipe_tf, e.g. hetpipe_tf.models)."""
    bad = {f.name: sorted(m for m in _imports(f) if m.split(".")[0] == "benchmarks")
           for f in (ROOT / "experiments").glob("*.py")}
    assert not {k: v for k, v in bad.items() if v}, bad
