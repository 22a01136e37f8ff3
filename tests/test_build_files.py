"""The Bazel BUILD files list what the code imports and runs (docs/building.md "Bazel").

A test folder's py_tests get only the deps its BUILD names; a module they import (or run
as `python -m <module>`, or read from examples/) that no listed dep provides fails under
Bazel only. This check reads the sources and the BUILD files, so such drift fails the
ordinary test suite in a second, and CI's Bazel step only builds every target and runs a
sample of them.
"""

from __future__ import annotations

import ast
import pathlib
import re

ROOT = pathlib.Path(__file__).resolve().parents[1]
TESTS = ROOT / "tests"
_LABEL = re.compile(r'"(//[A-Za-z0-9_/]*(?::[A-Za-z0-9_./]+)?)"')
# Modules named in strings: `python -m benchmarks.train`, a child script `tests.ps.x`.
_RUN = re.compile(r"\b((?:benchmarks|experiments)\.[a-z_][a-z0-9_]*"
                  r"|tests\.[a-z_]+\.[a-z_][a-z0-9_]*)\b")
_EXAMPLE = re.compile(r"\bexamples/([A-Za-z0-9_]+\.py)\b")


def _labels(build: pathlib.Path) -> set[str]:
    return set(_LABEL.findall(build.read_text()))


def _needs(path: pathlib.Path, strings: bool = True) -> tuple[set[str], set[str]]:
    """(top-level repo modules imported, or run when `strings`, examples/ files read) by
    one file."""
    tree = ast.parse(path.read_text(), str(path))
    docstrings = {id(n.body[0].value) for n in ast.walk(tree)
                  if isinstance(n, (ast.Module, ast.FunctionDef, ast.ClassDef))
                  and n.body and isinstance(n.body[0], ast.Expr)
                  and isinstance(n.body[0].value, ast.Constant)}
    mods: set[str] = set()
    examples: set[str] = set()
    for node in ast.walk(tree):
        if isinstance(node, ast.Import):
            mods.update(a.name for a in node.names)
        elif isinstance(node, ast.ImportFrom) and node.module and node.level == 0:
            mods.add(node.module)
            mods.update(f"{node.module}.{a.name}" for a in node.names)
        elif (strings and isinstance(node, ast.Constant) and isinstance(node.value, str)
              and id(node) not in docstrings):
            mods.update(_RUN.findall(node.value))
            examples.update(_EXAMPLE.findall(node.value))
    keep = {m for m in mods if m.split(".")[0] in
            ("hetpipe_tf", "benchmarks", "experiments", "tests")}
    return keep, examples


def _provided(label: str, seen: set[str] | None = None) -> set[str]:
    """Top-level names (and `tests.<folder>`) a label makes importable, transitively."""
    seen = set() if seen is None else seen
    if label in seen:
        return set()
    seen.add(label)
    pkg = label[2:].split(":")[0]
    first = pkg.split("/")[0]
    if first in ("hetpipe_tf", "benchmarks", "experiments"):
        out = {first}
        build = ROOT / first / "BUILD"
        for dep in _labels(build) if build.exists() else ():
            if not dep.startswith(f"//{first}"):
                out |= _provided(dep, seen)
        return out
    if first == "tests" and "/" in pkg:
        folder = pkg.split("/")[1]
        out = {f"tests.{folder}"}
        for dep in _labels(TESTS / folder / "BUILD"):
            out |= _provided(dep, seen)
        return out
    return set()


def _rel(path: pathlib.Path) -> str:
    return str(path.relative_to(ROOT)) if path.is_relative_to(ROOT) else str(path)


def _missing(folder: pathlib.Path, build: pathlib.Path) -> list[str]:
    labels = _labels(build)
    # Every py_test depends on //tests:conftest (bazel/pytest.bzl), which the tests'
    # set-up imports.
    have = {"tests", "tests.conftest"} | (set() if folder == TESTS
                                          else {f"tests.{folder.name}"})
    for label in labels:
        have |= _provided(label)
    bad = []
    for py in sorted(folder.glob("*.py")):
        if py.resolve() == pathlib.Path(__file__).resolve():
            continue   # its own strings are examples of drift, not uses
        mods, examples = _needs(py)
        for mod in sorted(mods):
            parts = mod.split(".")
            key = ".".join(parts[:2]) if parts[0] == "tests" else parts[0]
            if key not in have and not (key == "tests" and "tests" in have):
                bad.append(f"{_rel(py)} uses {mod}: add the dep that provides "
                           f"{key} to {_rel(build)}")
        for ex in sorted(examples):
            if f"//examples:{ex}" not in labels:
                bad.append(f"{_rel(py)} reads examples/{ex}: add "
                           f'data = ["//examples:{ex}"] to {_rel(build)}')
    return bad


def test_every_test_folder_has_a_build_file_that_lists_what_its_files_use():
    bad = []
    for folder in sorted(p for p in TESTS.iterdir() if p.is_dir()):
        if not list(folder.glob("*.py")):
            continue
        build = folder / "BUILD"
        if not build.exists():
            bad.append(f"{folder.relative_to(ROOT)} has Python files but no BUILD file")
            continue
        bad += _missing(folder, build)
    bad += _missing(TESTS, TESTS / "BUILD")
    assert not bad, "\n".join(bad)


def test_programs_build_files_list_the_other_top_level_packages_they_import():
    bad = []
    for pkg, other in (("benchmarks", "experiments"), ("experiments", "benchmarks")):
        labels = _labels(ROOT / pkg / "BUILD")
        lists_other = any(label.startswith(f"//{other}") for label in labels)
        for py in sorted((ROOT / pkg).glob("*.py")):
            mods, _ = _needs(py, strings=False)   # a program's messages name others
            if any(m.split(".")[0] == other for m in mods) and not lists_other:
                bad.append(f"{_rel(py)} imports {other} but {pkg}/BUILD "
                           f"names no //{other} target")
    assert not bad, "\n".join(bad)


def test_the_check_finds_a_missing_dep(tmp_path):
    """The rule above can fail: a folder importing another folder's helper without it."""
    folder = tmp_path / "tests" / "x"
    folder.mkdir(parents=True)
    (folder / "test_a.py").write_text("import tests.strategy.helpers\n"
                                      "CMD = ['python', '-m', 'benchmarks.train']\n")
    build = folder / "BUILD"
    build.write_text('pytest_tests(deps = ["//hetpipe_tf"])\n')
    bad = _missing(folder, build)
    assert any("tests.strategy.helpers" in b for b in bad)
    assert any("benchmarks.train" in b for b in bad)
    build.write_text('pytest_tests(deps = ["//hetpipe_tf", "//tests/strategy:helpers",'
                     ' "//benchmarks"])\n')
    assert _missing(folder, build) == []
