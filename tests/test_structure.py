"""The layering the code promises, checked on the parsed imports (not on strings).

- The HTTP layer imports tasks, never the engine, the runtime, numpy or onnxruntime.
- The engine, the schedulers and the domain errors know nothing about HTTP.
- Only the runtime layer (`service/engine/runtime.py` and its device buffers, `device.py`) imports
  onnxruntime; `service/` never imports torch.
- `export/` imports nothing from `service/` but the contract package.
- Outside `service/tasks/` nothing in `service/` names a task ("classification", "translation").
"""

from __future__ import annotations

import ast
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[1]
TASK_NAMES = {"classification", "translation"}


def modules(folder: str) -> list[Path]:
    return sorted((ROOT / folder).rglob("*.py"))


def imports(path: Path) -> set[str]:
    out: set[str] = set()
    for node in ast.walk(ast.parse(path.read_text(), str(path))):
        if isinstance(node, ast.Import):
            out |= {a.name for a in node.names}
        elif isinstance(node, ast.ImportFrom) and node.module and node.level == 0:
            out.add(node.module)
            out |= {f"{node.module}.{a.name}" for a in node.names}
    return out


def offending(path: Path, forbidden: tuple[str, ...]) -> list[str]:
    return sorted(i for i in imports(path) if any(i == f or i.startswith(f + ".") for f in forbidden))


def rel(path: Path) -> str:
    return str(path.relative_to(ROOT))


@pytest.mark.parametrize("path", modules("service/http"), ids=rel)
def test_http_layer_never_reaches_into_the_engine(path: Path) -> None:
    assert offending(path, ("service.engine", "numpy", "onnxruntime")) == []


@pytest.mark.parametrize(
    "path",
    [*modules("service/engine"), *modules("service/scheduling"), ROOT / "service/errors.py"],
    ids=rel,
)
def test_engine_and_schedulers_know_nothing_of_http(path: Path) -> None:
    assert offending(path, ("fastapi", "starlette", "uvicorn", "service.http")) == []


@pytest.mark.parametrize("path", modules("service"), ids=rel)
def test_one_module_imports_onnxruntime_and_none_torch(path: Path) -> None:
    assert offending(path, ("torch",)) == []
    if path not in (ROOT / "service/engine/runtime.py", ROOT / "service/engine/device.py"):
        assert offending(path, ("onnxruntime",)) == []


@pytest.mark.parametrize("path", modules("export"), ids=rel)
def test_export_imports_only_the_contract(path: Path) -> None:
    from_service = [i for i in imports(path) if i == "service" or i.startswith("service.")]
    assert [i for i in from_service if not i.startswith("service.contract")] == []


@pytest.mark.parametrize("path", [p for p in modules("service") if "tasks" not in p.parts], ids=rel)
def test_no_task_branch_outside_the_task_modules(path: Path) -> None:
    tree = ast.parse(path.read_text())
    named = [
        node.lineno
        for node in ast.walk(tree)
        if isinstance(node, ast.Constant) and isinstance(node.value, str) and node.value in TASK_NAMES
    ]
    engines = [
        node.lineno
        for node in ast.walk(tree)
        if isinstance(node, ast.Call)
        and getattr(node.func, "id", None) == "isinstance"
        and any("Engine" in ast.unparse(arg) or "Task)" in ast.unparse(arg) for arg in node.args[1:])
    ]
    assert named == [] and engines == []


def _module_name(path: Path) -> str:
    parts = list(path.relative_to(ROOT).with_suffix("").parts)
    return ".".join(parts[:-1] if parts[-1] == "__init__" else parts)


def test_every_service_module_serves() -> None:
    """Each module of `service/` is reachable from the server's entry point: none is kept only
    for the benchmarks or the tests."""
    known = {_module_name(p): p for p in modules("service")}
    seen, todo = set(), ["service.__main__"]
    while todo:
        name = todo.pop()
        if name in seen or name not in known:
            continue
        seen.add(name)
        for imported in imports(known[name]):
            todo += [m for m in (imported, imported.rsplit(".", 1)[0]) if m in known]
    packages = {n for n, p in known.items() if p.name == "__init__.py"}
    assert sorted(set(known) - seen - packages) == []


def _import_edges(path: Path, package: str) -> set[str]:
    """The modules of `package` that `path` imports, wherever the import stands (a function body,
    `if TYPE_CHECKING:`): `from a.b import c` names `a.b` and, when `c` is a module, `a.b.c`."""
    known = {_module_name(p) for p in modules(package)}
    out: set[str] = set()
    for name in imports(path):
        out |= {m for m in (name, name.rsplit(".", 1)[0]) if m in known}
    return out - {_module_name(path)}


def _cycle(graph: dict[str, set[str]]) -> list[str]:
    """One import cycle of `graph` (module -> the modules it imports), or [] if it has none."""
    state: dict[str, int] = {}  # 1: on the current path, 2: done
    path: list[str] = []

    def visit(node: str) -> list[str]:
        state[node] = 1
        path.append(node)
        for nxt in sorted(graph.get(node, ())):
            if state.get(nxt) == 1:
                return [*path[path.index(nxt) :], nxt]
            if nxt not in state and (found := visit(nxt)):
                return found
        state[node] = 2
        path.pop()
        return []

    for node in sorted(graph):
        if node not in state and (found := visit(node)):
            return found
    return []


def test_the_cycle_finder_finds_a_cycle() -> None:
    assert _cycle({"a": {"b"}, "b": {"c"}, "c": {"a"}, "d": {"a"}}) == ["a", "b", "c", "a"]
    assert _cycle({"a": {"b"}, "b": set(), "c": {"a", "b"}}) == []


@pytest.mark.parametrize("package", ["export"])
def test_no_import_cycle(package: str) -> None:
    """Type-only and function-level imports count: the layer order must hold for them too."""
    graph = {_module_name(p): _import_edges(p, package) for p in modules(package)}
    assert _cycle(graph) == []


@pytest.mark.parametrize("path", modules("export"), ids=rel)
def test_export_imports_no_private_name(path: Path) -> None:
    """A module's `_name` is its own: another module that needs it needs a public function. Counted:
    `from export.m import _name` and `m._name` where `m` is an `export` module imported by name."""
    known = {_module_name(p) for p in modules("export")}
    tree = ast.parse(path.read_text(), str(path))
    private, aliases = [], set()
    for node in ast.walk(tree):
        if isinstance(node, ast.ImportFrom) and node.module and node.module.split(".")[0] == "export":
            private += [f"{node.module}.{a.name}" for a in node.names if a.name.startswith("_")]
            aliases |= {a.asname or a.name for a in node.names if f"{node.module}.{a.name}" in known}
        elif isinstance(node, ast.Import):
            aliases |= {a.asname for a in node.names if a.asname and a.name in known}
    private += [
        ast.unparse(node)
        for node in ast.walk(tree)
        if isinstance(node, ast.Attribute)
        and isinstance(node.value, ast.Name)
        and node.value.id in aliases
        and node.attr.startswith("_")
        and not node.attr.startswith("__")
    ]
    assert private == []
