"""The shape of python/dcnkit: no import cycles, imports that only point down the layers, no file past 500 lines.

The import graph is read statically (``ast``): every ``import`` / ``from ... import`` anywhere in a module
(module level, inside functions, under ``if``), relative imports resolved, an edge to the module that is named
(``from dcnkit.runtime import ort`` -> ``dcnkit.runtime.ort``; ``from dcnkit.runtime import ort_session`` ->
``dcnkit.runtime``). A module that imports its own package's ``__init__`` counts too.
"""
from __future__ import annotations

import ast
from pathlib import Path

import pytest

PACKAGE_DIR = Path(__file__).resolve().parent.parent / "python" / "dcnkit"
MAX_LINES = 500
# Generated tables may be longer than MAX_LINES (path relative to python/dcnkit). None today.
GENERATED = frozenset()


def module_files(package_dir: Path) -> dict[str, Path]:
    """Dotted module name -> file, for every .py under ``package_dir`` (a package's name for its __init__)."""
    root = package_dir.name
    out = {}
    for path in sorted(package_dir.rglob("*.py")):
        parts = [root, *path.relative_to(package_dir).with_suffix("").parts]
        if parts[-1] == "__init__":
            parts.pop()
        out[".".join(parts)] = path
    return out


def _resolve(module: str, is_package: bool, level: int, name: str | None) -> str:
    """Absolute name of ``from <level dots><name> import ...`` written in ``module``."""
    if level == 0:
        return name or ""
    base = module.split(".")
    if not is_package:
        base = base[:-1]
    base = base[: len(base) - (level - 1)]
    return ".".join(base + ([name] if name else []))


def import_graph(package_dir: Path) -> dict[str, set[str]]:
    """Module -> the package's modules it imports (anywhere in its body)."""
    files = module_files(package_dir)
    graph: dict[str, set[str]] = {}
    for module, path in files.items():
        is_package = path.name == "__init__.py"
        targets = set()
        for node in ast.walk(ast.parse(path.read_text(), str(path))):
            if isinstance(node, ast.Import):
                for alias in node.names:
                    name = alias.name
                    while name and name not in files:  # `import a.b.c` of a non-module attribute path
                        name = name.rpartition(".")[0]
                    if name:
                        targets.add(name)
            elif isinstance(node, ast.ImportFrom):
                base = _resolve(module, is_package, node.level, node.module)
                for alias in node.names:
                    if f"{base}.{alias.name}" in files:
                        targets.add(f"{base}.{alias.name}")
                    elif base in files:
                        targets.add(base)
        targets.discard(module)
        graph[module] = targets
    return graph


def cycles(graph: dict[str, set[str]]) -> list[list[str]]:
    """Strongly connected components with more than one module (Tarjan), each sorted."""
    index: dict[str, int] = {}
    low: dict[str, int] = {}
    stack: list[str] = []
    on_stack: set[str] = set()
    found = []

    def visit(v: str) -> None:
        index[v] = low[v] = len(index)
        stack.append(v)
        on_stack.add(v)
        for w in sorted(graph.get(v, ())):
            if w not in index:
                visit(w)
                low[v] = min(low[v], low[w])
            elif w in on_stack:
                low[v] = min(low[v], index[w])
        if low[v] == index[v]:
            component = []
            while True:
                w = stack.pop()
                on_stack.discard(w)
                component.append(w)
                if w == v:
                    break
            if len(component) > 1:
                found.append(sorted(component))

    for v in sorted(graph):
        if v not in index:
            visit(v)
    return found


def _write(root: Path, files: dict[str, str]) -> Path:
    for rel, text in files.items():
        p = root / rel
        p.parent.mkdir(parents=True, exist_ok=True)
        p.write_text(text)
    return root / "pkg"


def test_the_walker_finds_cycles_through_function_level_and_relative_imports(tmp_path):
    pkg = _write(tmp_path, {
        "pkg/__init__.py": "",
        "pkg/a.py": "from pkg.sub import b\n",
        "pkg/sub/__init__.py": "",
        "pkg/sub/b.py": "def f():\n    from ..c import x\n",
        "pkg/c.py": "import pkg.a\nx = 1\n",
        "pkg/d.py": "from . import c\nfrom .sub.b import f\n",
    })
    graph = import_graph(pkg)
    assert graph["pkg.sub.b"] == {"pkg.c"}
    assert graph["pkg.c"] == {"pkg.a"}
    assert graph["pkg.d"] == {"pkg.c", "pkg.sub.b"}
    assert cycles(graph) == [["pkg.a", "pkg.c", "pkg.sub.b"]]
    (pkg / "c.py").write_text("x = 1\n")
    assert cycles(import_graph(pkg)) == []


def test_the_walker_resolves_names_of_a_package_to_its_init(tmp_path):
    pkg = _write(tmp_path, {
        "pkg/__init__.py": "from pkg.impl import thing\n",
        "pkg/impl.py": "def thing():\n    from pkg import thing as again\n",
    })
    assert cycles(import_graph(pkg)) == [["pkg", "pkg.impl"]]


def test_dcnkit_has_no_import_cycles():
    graph = import_graph(PACKAGE_DIR)
    assert {"dcnkit.cli.parser", "dcnkit.runtime.registry", "dcnkit.runtime.base"} <= set(graph)
    assert cycles(graph) == []


def _reach(graph: dict[str, set[str]], start: str) -> set[str]:
    seen, todo = set(), [start]
    while todo:
        for w in graph.get(todo.pop(), ()):
            if w not in seen:
                seen.add(w)
                todo.append(w)
    return seen


@pytest.mark.parametrize("lower, upper", [
    ("dcnkit.runtime", "dcnkit.cli"),
    ("dcnkit.runtime", "dcnkit.server"),
    ("dcnkit.server", "dcnkit.cli"),
    ("dcnkit.demo", "dcnkit.cli"),
    ("dcnkit.runtime.base", "dcnkit.runtime.registry"),
    ("dcnkit.runtime.ort_runner", "dcnkit.runtime.registry"),
    ("dcnkit.runtime.tensorrt", "dcnkit.runtime.registry"),
    ("dcnkit.runtime.reference_runner", "dcnkit.runtime.registry"),
    ("dcnkit.runtime.triton_config", "dcnkit.runtime.triton"),
    ("dcnkit.runtime.triton_tensorrt", "dcnkit.runtime.triton"),
    ("dcnkit.runtime.triton_python", "dcnkit.runtime.triton"),
    ("dcnkit.runtime.triton_python_model", "dcnkit.runtime.triton_config"),  # runs in Triton's stub: the runner only
    ("dcnkit.runtime.triton_server", "dcnkit.runtime.triton"),
    ("dcnkit.cli.shared", "dcnkit.cli.export"),
])
def test_imports_point_down_the_layers(lower, upper):
    """Nothing in ``lower`` reaches ``upper`` (a module or a package and everything in it)."""
    graph = import_graph(PACKAGE_DIR)
    for module in [m for m in graph if m == lower or m.startswith(lower + ".")]:
        bad = sorted(m for m in _reach(graph, module) if m == upper or m.startswith(upper + "."))
        assert not bad, f"{module} imports {bad} (directly or through other modules)"


def test_nothing_in_dcnkit_imports_the_compatibility_modules():
    """``dcnkit.runtime.runners`` and ``dcnkit.cli_build`` keep old import paths working for users only."""
    graph = import_graph(PACKAGE_DIR)
    for old in ("dcnkit.runtime.runners", "dcnkit.cli_build"):
        assert old in graph
        users = sorted(m for m, targets in graph.items() if old in targets)
        assert users == [], f"{old} is imported by {users}"


def test_no_source_file_is_longer_than_500_lines():
    long = {}
    for path in sorted(PACKAGE_DIR.rglob("*.py")):
        rel = path.relative_to(PACKAGE_DIR).as_posix()
        n = len(path.read_text().splitlines())
        if n > MAX_LINES and rel not in GENERATED:
            long[rel] = n
    assert long == {}, f"split these by role (or list a generated table in GENERATED): {long}"
