"""The architecture contract: packages form layers, imports only go down (or within a package), and no
module imports itself through a cycle. Checked from the source (every import, also inside functions;
`if TYPE_CHECKING:` blocks excepted, they never run)."""

from __future__ import annotations

import ast
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[1] / "esopt"

# Lower rank = lower layer. A module may import its own package and packages of strictly lower rank only.
LAYERS: dict[str, int] = {
    "utils": 0,
    "es": 1, "sandbox": 1,
    "engines": 2, "envs": 2,
    "models": 3, "rollout": 3,
    "population": 4, "prompt": 4, "testtime": 4, "search": 4,
    "train": 5,
    "serve": 6,
    "experiments": 7, "demo": 7,
    "cli": 8,
}


def module_name(path: Path, root: Path) -> str:
    parts = path.relative_to(root.parent).with_suffix("").parts
    return ".".join(parts[:-1] if parts[-1] == "__init__" else parts)


def _type_checking_lines(tree: ast.AST) -> set[int]:
    lines = set()
    for node in ast.walk(tree):
        if isinstance(node, ast.If) and "TYPE_CHECKING" in ast.unparse(node.test):
            for child in node.body:
                lines.update(range(child.lineno, (child.end_lineno or child.lineno) + 1))
    return lines


def import_graph(root: Path) -> dict[str, set[str]]:
    """module -> the package modules it imports (`from a.b import c` counts a.b.c when that is a module)."""
    top = root.name
    files = {module_name(p, root): p for p in root.rglob("*.py")}
    graph: dict[str, set[str]] = {}
    for name, path in files.items():
        tree = ast.parse(path.read_text(), str(path))
        skip = _type_checking_lines(tree)
        deps: set[str] = set()
        for node in ast.walk(tree):
            if getattr(node, "lineno", None) in skip:
                continue
            targets = []
            if isinstance(node, ast.Import):
                targets = [a.name for a in node.names]
            elif isinstance(node, ast.ImportFrom) and node.module and node.level == 0:
                targets = [f"{node.module}.{a.name}" if f"{node.module}.{a.name}" in files else node.module
                           for a in node.names]
            deps.update(t for t in targets if t == top or t.startswith(top + "."))
        graph[name] = {d for d in deps if d != name}
    return graph


def package_of(module: str) -> str:
    parts = module.split(".")
    return parts[1] if len(parts) > 1 else parts[0]


def violations(root: Path, layers: dict[str, int]) -> list[str]:
    graph = import_graph(root)
    found = []
    for module, deps in sorted(graph.items()):
        here = package_of(module)
        if module != root.name and here not in layers:
            found.append(f"{module}: package {here!r} has no layer (add it to LAYERS)")
            continue
        for dep in sorted(deps):
            there = package_of(dep)
            if module == root.name or dep == root.name or there == here:
                continue
            if there not in layers:
                found.append(f"{module} imports {dep}: package {there!r} has no layer")
            elif layers[there] >= layers[here]:
                found.append(f"{module} imports {dep}: {here} (layer {layers[here]}) may not import {there} "
                             f"(layer {layers[there]})")
    found += [f"import cycle: {' -> '.join(c)}" for c in cycles(graph)]
    return found


def cycles(graph: dict[str, set[str]]) -> list[list[str]]:
    """One cycle per strongly connected component of more than one module (Tarjan)."""
    index, low, stack, on, out = {}, {}, [], set(), []

    def visit(v: str) -> None:
        index[v] = low[v] = len(index)
        stack.append(v)
        on.add(v)
        for w in sorted(graph.get(v, ())):
            if w not in graph:
                continue
            if w not in index:
                visit(w)
                low[v] = min(low[v], low[w])
            elif w in on:
                low[v] = min(low[v], index[w])
        if low[v] == index[v]:
            component = []
            while True:
                w = stack.pop()
                on.discard(w)
                component.append(w)
                if w == v:
                    break
            if len(component) > 1:
                out.append(sorted(component) + [sorted(component)[0]])

    for v in sorted(graph):
        if v not in index:
            visit(v)
    return out


def test_no_import_runs_upward_and_no_cycle_exists():
    assert violations(ROOT, LAYERS) == []


def test_every_package_has_a_layer():
    packages = {p.name for p in ROOT.iterdir() if p.is_dir() and (p / "__init__.py").exists()}
    packages |= {p.stem for p in ROOT.glob("*.py") if p.stem != "__init__"}
    assert packages <= set(LAYERS), sorted(packages - set(LAYERS))


def _fake_package(tmp_path: Path, files: dict[str, str]) -> Path:
    root = tmp_path / "esopt"
    for rel, text in {"__init__.py": "", **files}.items():
        path = root / rel
        path.parent.mkdir(parents=True, exist_ok=True)
        path.write_text(text)
    return root


@pytest.mark.parametrize("case, files, expected", [
    ("upward import", {"es/__init__.py": "", "es/core.py": "from esopt.train.loop import train\n",
                       "train/__init__.py": "", "train/loop.py": "def train(): pass\n"},
     "esopt.es.core imports esopt.train.loop: es (layer 1) may not import train (layer 5)"),
    ("import inside a function", {"es/__init__.py": "", "es/core.py": "def f():\n    import esopt.envs.x\n",
                                  "envs/__init__.py": "", "envs/x.py": ""},
     "esopt.es.core imports esopt.envs.x: es (layer 1) may not import envs (layer 2)"),
    ("sibling packages of one layer", {"engines/__init__.py": "from esopt.envs import x\n",
                                       "envs/__init__.py": "", "envs/x.py": ""},
     "esopt.engines imports esopt.envs.x: engines (layer 2) may not import envs (layer 2)"),
    ("cycle inside a package", {"es/__init__.py": "", "es/a.py": "from esopt.es.b import f\n",
                                "es/b.py": "def f():\n    from esopt.es import a\n"},
     "import cycle: esopt.es.a -> esopt.es.b -> esopt.es.a"),
])
def test_the_contract_trips_on_a_broken_import(tmp_path, case, files, expected):
    assert expected in violations(_fake_package(tmp_path, files), LAYERS), case


def test_type_checking_imports_do_not_count(tmp_path):
    root = _fake_package(tmp_path, {"es/__init__.py": "from typing import TYPE_CHECKING\nif TYPE_CHECKING:\n"
                                                       "    from esopt.train import x\n",
                                    "train/__init__.py": "", "train/x.py": ""})
    assert violations(root, LAYERS) == []
