"""experiments/ stands on the installed package alone: no module of it imports benchmarks/
(DESIGN.md "The pieces"; what both use is in hetpipe_tf, e.g. hetpipe_tf.models)."""

import ast
import pathlib

EXPERIMENTS = pathlib.Path(__file__).resolve().parents[2] / "experiments"


def _imported(path: pathlib.Path) -> set[str]:
    out = set()
    for node in ast.walk(ast.parse(path.read_text(), str(path))):
        if isinstance(node, ast.Import):
            out.update(a.name for a in node.names)
        elif isinstance(node, ast.ImportFrom) and node.module and node.level == 0:
            out.add(node.module)
    return out


def test_no_experiment_imports_benchmarks():
    bad = {f.name: sorted(m for m in _imported(f) if m.split(".")[0] == "benchmarks")
           for f in EXPERIMENTS.glob("*.py")}
    assert not {k: v for k, v in bad.items() if v}, bad
