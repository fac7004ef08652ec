"""The ``hoformer`` package has no import cycle (among its modules, nor among its subpackages), no module imports
another subpackage's private names, and the data packages' modules stay small (one job each).

Every module's imports inside the package are read with :mod:`ast` (module level and inside functions alike: a
deferred import is still a dependency; only ``if TYPE_CHECKING:`` blocks, which never run, are skipped) and the
module graph is searched for strongly connected components. ``from pkg import name`` is an edge to ``pkg.name``
when that is a module, else to ``pkg`` itself.
"""
from __future__ import annotations

import ast
from pathlib import Path

import hoformer

PKG = "hoformer"
ROOT = Path(hoformer.__file__).resolve().parent


def _modules() -> dict[str, tuple[Path, bool]]:
    """``dotted name -> (file, is_package)`` for every module of the package."""
    out = {}
    for path in sorted(ROOT.rglob("*.py")):
        parts = [PKG, *path.relative_to(ROOT).with_suffix("").parts]
        is_pkg = parts[-1] == "__init__"
        out[".".join(parts[:-1] if is_pkg else parts)] = (path, is_pkg)
    return out


def _is_type_checking(node: ast.If) -> bool:
    t = node.test
    return (isinstance(t, ast.Name) and t.id == "TYPE_CHECKING") or (
        isinstance(t, ast.Attribute) and t.attr == "TYPE_CHECKING")


def _import_nodes(tree: ast.AST):
    stack = [tree]
    while stack:
        node = stack.pop()
        if isinstance(node, (ast.Import, ast.ImportFrom)):
            yield node
        for child in ast.iter_child_nodes(node):
            if isinstance(child, ast.If) and _is_type_checking(child):
                stack.extend(child.orelse)  # the `else:` of `if TYPE_CHECKING:` does run
                continue
            stack.append(child)


def import_graph() -> dict[str, set[str]]:
    """Intra-package import edges ``module -> {imported modules}``."""
    mods = _modules()
    graph: dict[str, set[str]] = {m: set() for m in mods}
    for name, (path, is_pkg) in mods.items():
        package = name if is_pkg else name.rpartition(".")[0]
        for node in _import_nodes(ast.parse(path.read_text(encoding="utf-8"), filename=str(path))):
            if isinstance(node, ast.Import):
                targets = [a.name for a in node.names]
            else:
                if node.level:
                    base_parts = package.split(".")
                    base_parts = base_parts[: len(base_parts) - (node.level - 1)]
                    base = ".".join(base_parts + ([node.module] if node.module else []))
                else:
                    base = node.module or ""
                targets = [f"{base}.{a.name}" if f"{base}.{a.name}" in mods else base for a in node.names]
            for t in targets:
                while t and t not in mods and "." in t:  # `import hoformer.x.y` of an attribute path
                    t = t.rpartition(".")[0]
                if t in mods and t != name:
                    graph[name].add(t)
    return graph


def cycles(graph: dict[str, set[str]]) -> list[list[str]]:
    """Strongly connected components with more than one module (Tarjan), each sorted."""
    index: dict[str, int] = {}
    low: dict[str, int] = {}
    on_stack: set[str] = set()
    stack: list[str] = []
    out: list[list[str]] = []
    counter = [0]

    def visit(v: str) -> None:
        index[v] = low[v] = counter[0]
        counter[0] += 1
        stack.append(v)
        on_stack.add(v)
        for w in sorted(graph[v]):
            if w not in index:
                visit(w)
                low[v] = min(low[v], low[w])
            elif w in on_stack:
                low[v] = min(low[v], index[w])
        if low[v] == index[v]:
            comp = []
            while True:
                w = stack.pop()
                on_stack.discard(w)
                comp.append(w)
                if w == v:
                    break
            if len(comp) > 1:
                out.append(sorted(comp))

    for v in sorted(graph):
        if v not in index:
            visit(v)
    return out


def test_graph_sees_the_package():
    graph = import_graph()
    assert "hoformer.models.registry" in graph and "hoformer.layers.attention" in graph
    # a few edges every version of the package has: the walker resolves relative and absolute imports
    assert "hoformer.layers.attention" in graph["hoformer.layers.blocks"]
    assert "hoformer.layers" in graph["hoformer.models.hot"]
    assert "hoformer.functional.unchecked" in graph["hoformer.layers.kronecker"]


def test_cycle_finder_reports_a_cycle():
    graph = {"a": {"b"}, "b": {"c"}, "c": {"a"}, "d": {"a"}, "e": set()}
    assert cycles(graph) == [["a", "b", "c"]]


def test_no_import_cycle():
    found = cycles(import_graph())
    graph = import_graph()
    detail = "\n".join(
        " <-> ".join(comp) + "\n    " + "; ".join(f"{m} imports {sorted(graph[m] & set(comp))}" for m in comp)
        for comp in found
    )
    assert not found, f"import cycles in {PKG}:\n{detail}"


def private_imports() -> list[str]:
    """``file:line: name`` of every ``from X import _name`` whose module ``X`` lies in another subpackage of
    ``hoformer`` than the importing module (``hoformer.functional.unchecked`` is the contract for what layers call
    unchecked; a subpackage's own modules may share private names)."""
    mods = _modules()

    def subpackage(name: str) -> str:
        parts = name.split(".")
        return parts[1] if len(parts) > 2 or (len(parts) == 2 and mods.get(name, (None, False))[1]) else ""

    found = []
    for name, (path, is_pkg) in mods.items():
        package = name if is_pkg else name.rpartition(".")[0]
        for node in _import_nodes(ast.parse(path.read_text(encoding="utf-8"), filename=str(path))):
            if not isinstance(node, ast.ImportFrom):
                continue
            if node.level:
                parts = package.split(".")
                target = ".".join(parts[: len(parts) - (node.level - 1)] + ([node.module] if node.module else []))
            else:
                target = node.module or ""
            if not target.startswith(PKG + ".") or subpackage(target) == subpackage(name):
                continue
            for alias in node.names:
                if alias.name.startswith("_") and not alias.name.startswith("__"):
                    found.append(f"{path.relative_to(ROOT.parent)}:{node.lineno}: {alias.name} from {target}")
    return found


def test_no_private_name_is_imported_across_subpackages():
    found = private_imports()
    assert not found, "private names imported from another subpackage:\n" + "\n".join(found)


def test_private_import_finder_sees_a_private_import(tmp_path, monkeypatch):
    import sys

    (tmp_path / PKG / "layers").mkdir(parents=True)
    (tmp_path / PKG / "functional").mkdir()
    for d in ("", "layers", "functional"):
        (tmp_path / PKG / d / "__init__.py").write_text("")
    (tmp_path / PKG / "functional" / "k.py").write_text("def _x(): pass\n")
    (tmp_path / PKG / "layers" / "a.py").write_text("from hoformer.functional.k import _x\nfrom ..functional import k\n")
    monkeypatch.setattr(sys.modules[__name__], "ROOT", tmp_path / PKG)
    assert private_imports() == ["hoformer/layers/a.py:1: _x from hoformer.functional.k"]


# ------------------------------------------------------------------------------------------------- subpackages
def subpackage_graph(graph: dict[str, set[str]] | None = None) -> dict[str, set[str]]:
    """The import graph with one node per top-level subpackage or module of ``hoformer`` (``hoformer.train``,
    ``hoformer.config``, ...): an edge ``A -> B`` when a module of ``A`` imports a module of ``B``. The package root
    (``hoformer/__init__.py``) is no node: it re-exports its subpackages."""
    graph = import_graph() if graph is None else graph

    def top(name: str) -> str:
        return ".".join(name.split(".")[:2])

    out: dict[str, set[str]] = {}
    for name, deps in graph.items():
        if name == PKG:
            continue
        out.setdefault(top(name), set()).update(top(d) for d in deps if d != PKG and top(d) != top(name))
    for deps in list(out.values()):
        for d in deps:
            out.setdefault(d, set())
    return out


def test_subpackage_graph_reports_a_cycle_through_modules():
    """A cycle made of different modules of the subpackages (the ``train -> config -> lightning_cli -> train`` kind)
    is a cycle of the subpackage graph even though the module graph has none."""
    modules = {"hoformer.train.forecast": {"hoformer.config"}, "hoformer.config": {"hoformer.lightning_cli"},
               "hoformer.lightning_cli": {"hoformer.train.tasks"}, "hoformer.train.tasks": set(),
               "hoformer.data.series": {"hoformer.checkpoint"}, "hoformer.checkpoint": set(), "hoformer.data": set(),
               PKG: {"hoformer.data"}}
    assert cycles(modules) == []
    assert cycles(subpackage_graph(modules)) == [["hoformer.config", "hoformer.lightning_cli", "hoformer.train"]]


def test_no_cycle_among_subpackages():
    graph = subpackage_graph()
    assert {"hoformer.train", "hoformer.data", "hoformer.config", "hoformer.inference"} <= set(graph)
    found = cycles(graph)
    detail = "\n".join(" <-> ".join(c) + ": " + "; ".join(f"{m} -> {sorted(graph[m] & set(c))}" for m in c)
                       for c in found)
    assert not found, f"import cycles among the subpackages of {PKG}:\n{detail}"


#: the packages whose modules each do one job, and the most lines a module of theirs may have
SMALL_MODULE_PACKAGES = ("data/series", "data/text")
MAX_MODULE_LINES = 400


def test_data_packages_have_small_modules():
    sizes = {f"{p}/{f.name}": len(f.read_text(encoding="utf-8").splitlines())
             for p in SMALL_MODULE_PACKAGES for f in sorted((ROOT / p).glob("*.py"))}
    assert len(sizes) >= 8, sizes  # the packages exist (series: 7 modules, text: 5)
    big = {k: v for k, v in sizes.items() if v > MAX_MODULE_LINES}
    assert not big, f"modules over {MAX_MODULE_LINES} lines (split them by job): {big}"
