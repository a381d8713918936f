"""The package layering of docs/concepts/layering.md: no import cycle between modules
(function-local imports counted). The package-level layers themselves are import-linter
contracts (`pyproject.toml`, run by `.ci/run` and by the test below when import-linter is
installed)."""
from __future__ import annotations

import ast
import shutil
import subprocess
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[1]
SOURCES = sorted([*ROOT.glob("ensemble/**/*.py"), *ROOT.glob("pipelines/**/*.py"),
                  *ROOT.glob("benchmarks/**/*.py")])

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


# the venv's own script when its bin/ is not on PATH (`/work/venv/bin/python -m pytest`)
LINT_IMPORTS = shutil.which("lint-imports") or shutil.which(
    "lint-imports", path=str(Path(sys.executable).parent))


@pytest.mark.skipif(LINT_IMPORTS is None, reason="import-linter not installed")
def test_import_contracts_hold():
    res = subprocess.run([LINT_IMPORTS], cwd=ROOT, capture_output=True, text=True)
    assert res.returncode == 0, res.stdout[-2000:]
