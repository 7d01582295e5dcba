"""mgbench's modules import one way: no two modules reach each other through imports,
function-local ones included (a circle held together by a late import is still a
circle), and the planner's model and the torch-free schema do not import click."""

import ast
from pathlib import Path

import mgbench

ROOT = Path(mgbench.__file__).parent


def _module_name(path: Path, root: Path) -> str:
    parts = list(path.relative_to(root.parent).with_suffix("").parts)
    return ".".join(parts[:-1] if parts[-1] == "__init__" else parts)


def import_graph(root: Path = ROOT) -> dict[str, set[str]]:
    """module -> the mgbench modules it imports, anywhere in its source."""
    files = {_module_name(p, root): p for p in root.rglob("*.py")}
    graph: dict[str, set[str]] = {m: set() for m in files}
    for mod, path in files.items():
        package = mod.split(".") if path.name == "__init__.py" else mod.split(".")[:-1]
        for node in ast.walk(ast.parse(path.read_text())):
            targets: list[str] = []
            if isinstance(node, ast.Import):
                targets = [a.name for a in node.names]
            elif isinstance(node, ast.ImportFrom):
                base = package[:len(package) - node.level + 1] if node.level else []
                target = ".".join(base + ([node.module] if node.module else []))
                # `from . import x` names a submodule x when there is one, else a name in the package
                targets = [f"{target}.{a.name}" if f"{target}.{a.name}" in files else target for a in node.names]
            found = {t for t in targets if t in files}
            # Importing a.b.c runs the packages a and a.b first: those are imports too.
            found |= {p for t in found for p in _ancestors(t) if p in files}
            graph[mod] |= found - {mod} - set(_ancestors(mod))
    return graph


def _ancestors(mod: str) -> list[str]:
    """The packages above a module (a, a.b for a.b.c): running it runs them first, so an
    edge to one of them is no circle of its own making."""
    parts = mod.split(".")
    return [".".join(parts[:i]) for i in range(1, len(parts))]


def circles(graph: dict[str, set[str]]) -> list[list[str]]:
    """The strongly connected components of more than one module (Tarjan's algorithm)."""
    index: dict[str, int] = {}
    low: dict[str, int] = {}
    stack: list[str] = []
    on_stack: set[str] = set()
    found: list[list[str]] = []

    def visit(v: str) -> None:
        index[v] = low[v] = len(index)
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
                found.append(sorted(comp))

    for v in sorted(graph):
        if v not in index:
            visit(v)
    return found


def test_no_two_mgbench_modules_import_each_other():
    found = circles(import_graph())
    assert not found, "import circles: " + "; ".join(" <-> ".join(c) for c in found)


def test_the_circle_finder_fires_on_a_circle(tmp_path):
    pkg = tmp_path / "mgbench"
    (pkg / "sub").mkdir(parents=True)
    (pkg / "__init__.py").write_text("")
    (pkg / "sub" / "__init__.py").write_text("")
    (pkg / "a.py").write_text("from .sub import b\n")
    (pkg / "sub" / "b.py").write_text("def f():\n    from .. import a  # late, still a circle\n")
    (pkg / "c.py").write_text("from . import a\n")
    assert circles(import_graph(pkg)) == [["mgbench.a", "mgbench.sub.b"]]
    # Through a package's __init__: d imports sub.e, which runs sub/__init__, which imports d.
    (pkg / "sub" / "b.py").write_text("")
    (pkg / "sub" / "__init__.py").write_text("from .. import d\n")
    (pkg / "sub" / "e.py").write_text("")
    (pkg / "d.py").write_text("from .sub.e import x\n")
    assert circles(import_graph(pkg)) == [["mgbench.d", "mgbench.sub"]]


def test_the_model_and_schema_modules_do_not_import_click():
    graph = import_graph()
    no_click = [m for m in graph if m.startswith(("mgbench.planner.", "mgbench.model_shape", "mgbench.hf_config",
                                                  "mgbench.config", "mgbench.record", "mgbench.strategies"))]
    for mod in no_click:
        path = ROOT.parent / (mod.replace(".", "/") + ".py")
        if not path.exists():
            path = ROOT.parent / mod.replace(".", "/") / "__init__.py"
        tree = ast.parse(path.read_text())
        names = {a.name.split(".")[0] for n in ast.walk(tree) if isinstance(n, ast.Import) for a in n.names}
        names |= {(n.module or "").split(".")[0] for n in ast.walk(tree) if isinstance(n, ast.ImportFrom) and not n.level}
        assert "click" not in names, f"{mod} imports click: commands belong in mgbench/commands/"
