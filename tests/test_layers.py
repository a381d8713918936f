"""The package layering of docs/concepts/layering.md: no import cycle between modules
(function-local imports counted), no module over 400 lines, and no new place outside `tasks/` (`data/`) that
asks which task (input kind) a run has. The package-level layers themselves are import-linter
contracts (`pyproject.toml`, run by `.ci/run` and by the test below when import-linter is
installed)."""
from __future__ import annotations

import ast
import re
import shutil
import subprocess
import sys
from collections import Counter
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[1]
SOURCES = sorted([*ROOT.glob("ensemble/**/*.py"), *ROOT.glob("pipelines/**/*.py")])

# Places outside `ensemble/tasks/` that still branch on the task, per file: a ratchet. A count
# may only go down; a new file that asks which task it has fails (call the Task methods).
TASK_BRANCHES = {
    "ensemble/core/labels.py": 1,  # core cannot ask a task: an empty class list = numbers
    "ensemble/data/npz.py": 1, "ensemble/data/sources.py": 1,  # labels read: numbers or not
    "ensemble/runs/estimator_regressor.py": 2,  # the regression estimator's own score names
    # benchmarks of one named task: they set it in their configs
    "pipelines/defaults_bench.py": 1, "pipelines/regression_bench.py": 3,
    "pipelines/tabular_bench.py": 2,  # HGB's classifier or regressor, accuracy or RMSE
}
TASK_PATTERN = re.compile(
    r'"regression"|"classification"|is_regression\(|len\(classes\) == 0|classes\.size == 0'
    r'|not len\([\w.]*classes\)|len\([\w.]*classes\) or \d|y\.dtype\.kind == "f"'
    r'|\.gaussian\b|\.point\b|"std-scaling"|"val_rmse"|loss_name')
# The same for the input kind outside `ensemble/data/`.
INPUT_BRANCHES = {
    "pipelines/memory_bench.py": 4,  # a benchmark of the array kind's preprocessing
    "pipelines/parity_repro.py": 1,  # the issue #33 reproduction builds its own images
}
INPUT_PATTERN = re.compile(r'is_array_source|ArrayPreprocessing|ArrayData|\.npz"|"digits_images"'
                           r'|hasattr\(pre, "scale"\)|\.suffix in \(|\.ndim > 2')


def _module(path: Path) -> str:
    parts = path.relative_to(ROOT).with_suffix("").parts
    return ".".join(parts[:-1] if parts[-1] == "__init__" else parts)


def _imports(path: Path, known: set[str]) -> set[str]:
    """Project modules `path` imports anywhere (function bodies too), except under
    `if TYPE_CHECKING:`."""
    tree = ast.parse(path.read_text())
    skip = {id(n) for node in ast.walk(tree) if isinstance(node, ast.If)
            and getattr(node.test, "id", "") == "TYPE_CHECKING"
            for b in node.body for n in ast.walk(b)}
    name = _module(path)
    package = name if path.name == "__init__.py" else name.rpartition(".")[0]
    out = set()
    for node in ast.walk(tree):
        if id(node) in skip:
            continue
        if isinstance(node, ast.Import):
            out |= {a.name for a in node.names if a.name in known}
        elif isinstance(node, ast.ImportFrom):
            base = node.module or ""
            if node.level:
                base = ".".join(package.split(".")[:len(package.split(".")) - node.level + 1]
                                + ([node.module] if node.module else []))
            for a in node.names:
                sub = f"{base}.{a.name}"
                out.add(sub if sub in known else base)
    return (out & known) - {name}


def _cycles() -> list[list[str]]:
    """Strongly connected components of more than one module (Tarjan)."""
    known = {_module(p) for p in SOURCES}
    graph = {_module(p): _imports(p, known) for p in SOURCES}
    index, low, stack, on, found = {}, {}, [], set(), []
    sys.setrecursionlimit(10_000)

    def visit(v):
        index[v] = low[v] = len(index)
        stack.append(v), on.add(v)
        for w in graph[v]:
            if w not in index:
                visit(w)
                low[v] = min(low[v], low[w])
            elif w in on:
                low[v] = min(low[v], index[w])
        if low[v] == index[v]:
            comp = []
            while True:
                w = stack.pop()
                on.discard(w)
                comp.append(w)
                if w == v:
                    break
            if len(comp) > 1:
                found.append(sorted(comp))

    for v in graph:
        if v not in index:
            visit(v)
    return found


def test_no_import_cycle_between_modules():
    assert _cycles() == []


def test_the_cycle_finder_finds_a_cycle(tmp_path, monkeypatch):
    pkg = tmp_path / "ensemble"
    pkg.mkdir()
    (pkg / "__init__.py").write_text("")
    (pkg / "a.py").write_text("def f():\n    from ensemble import b\n")
    (pkg / "b.py").write_text("from ensemble.a import f\n")
    monkeypatch.setattr(sys.modules[__name__], "ROOT", tmp_path)
    monkeypatch.setattr(sys.modules[__name__], "SOURCES", sorted(pkg.glob("*.py")))
    assert _cycles() == [["ensemble.a", "ensemble.b"]]


def test_no_module_over_400_lines():
    long = {str(p.relative_to(ROOT)): n for p in SOURCES
            if (n := len(p.read_text().splitlines())) > 400}
    assert long == {}


@pytest.mark.parametrize("pattern, allowed, owner", [
    (TASK_PATTERN, TASK_BRANCHES, "ensemble/tasks/"),
    (INPUT_PATTERN, INPUT_BRANCHES, "ensemble/data/"),
])
def test_no_new_branch_on_the_task_or_input_kind(pattern, allowed, owner):
    found = Counter()
    for p in SOURCES:
        rel = str(p.relative_to(ROOT))
        if not rel.startswith(owner):
            found[rel] += len(pattern.findall(p.read_text()))
    grown = {f: n for f, n in found.items() if n > allowed.get(f, 0)}
    assert grown == {}, f"ask the protocol in {owner} instead of branching: {grown}"


# the venv's own script when its bin/ is not on PATH (`/work/venv/bin/python -m pytest`)
LINT_IMPORTS = shutil.which("lint-imports") or shutil.which(
    "lint-imports", path=str(Path(sys.executable).parent))


@pytest.mark.skipif(LINT_IMPORTS is None, reason="import-linter not installed")
def test_import_contracts_hold():
    res = subprocess.run([LINT_IMPORTS], cwd=ROOT, capture_output=True, text=True)
    assert res.returncode == 0, res.stdout[-2000:]
