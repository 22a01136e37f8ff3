"""docs/*.md and README.md name only files and modules that exist.

Every repository path a document names (`hetpipe_tf/...`, `tests/...`, `benchmarks/...`,
`experiments/...`, `docs/...`, `examples/...`, in backticks, links or prose, with or without
a `:line` suffix) must exist, as must every module run with `python -m <module>` and every
relative Markdown link. Globs and placeholders (`tests/**/test_*.py`, `benchmarks/<name>`)
name no one file and are skipped.
"""

from __future__ import annotations

import pathlib
import re

import pytest

ROOT = pathlib.Path(__file__).resolve().parents[1]
DOCS = sorted((ROOT / "docs").glob("*.md")) + [ROOT / "README.md"]
TOP_DIRS = ("hetpipe_tf", "tests", "benchmarks", "experiments", "docs", "examples", "bazel")
# Subpackages of hetpipe_tf, named in prose without the package prefix ("pipeline/tied.py").
SUBPACKAGES = tuple(p.name for p in (ROOT / "hetpipe_tf").iterdir()
                    if p.is_dir() and (p / "__init__.py").exists())

# A path: a known first folder, then name characters; stops at backticks, brackets, spaces.
_PATH = re.compile(r"(?<![\w./-])((?:%s)/[\w.*<>/-]*)" % "|".join(TOP_DIRS))
_SUBPATH = re.compile(r"(?<![\w./-])((?:%s)/[\w/-]+\.py)\b" % "|".join(SUBPACKAGES))
_MODULE = re.compile(r"python3? -m ([A-Za-z_][\w.]*)")
_LINK = re.compile(r"\]\(([^)\s#]+)(?:#[^)]*)?\)")
_LINE_SUFFIX = re.compile(r":\d+(?:-\d+)?$")
# A dotted name after a module's path (`benchmarks/_cli.run`) names `benchmarks/_cli.py`.
_ATTRIBUTE = re.compile(r"\.(?!(?:py|md|json|txt|rst|toml|cfg|sh|bzl|bazel|png|csv|yaml|yml)$)"
                        r"[A-Za-z_]\w*$")


def _clean(path: str) -> str | None:
    """The file a matched path names, or None for a glob or placeholder."""
    path = _LINE_SUFFIX.sub("", path).rstrip(".,;:")
    if any(c in path for c in "*<>"):
        return None
    if _ATTRIBUTE.search(path):
        path = _ATTRIBUTE.sub(".py", path)
    return path


def extract_paths(text: str) -> set[str]:
    """Repository paths named in `text`, relative to the repository root."""
    found = set()
    for m in _PATH.finditer(text):
        path = _clean(m.group(1))
        if path:
            found.add(path)
    for m in _SUBPATH.finditer(text):
        path = _clean(m.group(1))
        if path:
            found.add(f"hetpipe_tf/{path}")
    return found


def extract_modules(text: str) -> set[str]:
    """Modules run as `python -m <module>` in `text`, for this repository's folders."""
    found = set()
    for m in _MODULE.finditer(text):
        module = m.group(1).rstrip(".")
        if module.split(".")[0] in TOP_DIRS:
            found.add(module)
    return found


def _module_exists(module: str) -> bool:
    base = ROOT.joinpath(*module.split("."))
    return base.with_suffix(".py").is_file() or (base / "__init__.py").is_file()


def test_extraction_handles_markup():
    text = ("`hetpipe_tf/ps/server.py:10-20`, (tests/core/test_wsp.py), "
            "docs/memory.md. `tests/**/test_*.py` benchmarks/<name> "
            "pipeline/tied.py `python -m benchmarks.plan --help` "
            "python -m experiments.paper. tests/strategy/helpers.with_device_memory")
    assert extract_paths(text) == {
        "hetpipe_tf/ps/server.py", "tests/core/test_wsp.py", "docs/memory.md",
        "hetpipe_tf/pipeline/tied.py", "tests/strategy/helpers.py"}
    assert extract_modules(text) == {"benchmarks.plan", "experiments.paper"}


@pytest.mark.parametrize("doc", DOCS, ids=lambda p: p.name)
def test_named_paths_exist(doc):
    text = doc.read_text()
    missing = sorted(p for p in extract_paths(text) if not (ROOT / p).exists())
    assert not missing, (
        f"{doc.relative_to(ROOT)} names files that do not exist. Received: {missing}; "
        "fix the path or drop the claim.")


@pytest.mark.parametrize("doc", DOCS, ids=lambda p: p.name)
def test_run_modules_exist(doc):
    missing = sorted(m for m in extract_modules(doc.read_text()) if not _module_exists(m))
    assert not missing, (
        f"{doc.relative_to(ROOT)} runs modules that do not exist. Received: {missing}; "
        "fix the module name.")


@pytest.mark.parametrize("doc", DOCS, ids=lambda p: p.name)
def test_relative_links_resolve(doc):
    missing = []
    for m in _LINK.finditer(doc.read_text()):
        target = m.group(1)
        if re.match(r"[a-z]+:", target):          # http:, https:, mailto:
            continue
        if not (doc.parent / target).exists():
            missing.append(target)
    assert not missing, (
        f"{doc.relative_to(ROOT)} links to files that do not exist. Received: {missing}; "
        "fix the link.")
