"""The layering the code promises, checked on the parsed imports (not on strings).

- The HTTP layer imports tasks, never the engine, the schedulers, the runtime, numpy or onnxruntime.
- The engine, the schedulers and the domain errors know nothing about HTTP.
- Only the runtime layer (`service/engine/runtime.py` and its device buffers, `device.py`) imports
  onnxruntime; `service/` never imports torch.
- `export/` imports nothing from `service/` but the contract package.
- Outside `service/tasks/` nothing in `service/` names a task ("classification", "translation").
- No test module imports another: what tests share lives in `tests/helpers.py`, `tests/tiny.py`,
  `tests/fakes.py` and the fixtures of `tests/conftest.py`.
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
    assert offending(path, ("service.engine", "service.scheduling", "numpy", "onnxruntime")) == []


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


def module_imports(path: Path, name: str) -> set[str]:
    """Every module `path` (module `name`) imports, wherever the import stands: at the top, in a
    function, under `if TYPE_CHECKING:`; relative imports resolved. `from a import b` names `a.b`
    too (b may be a module); `cycles` keeps the names that are modules."""
    package = name if path.name == "__init__.py" else name.rpartition(".")[0]
    out: set[str] = set()
    for node in ast.walk(ast.parse(path.read_text(), str(path))):
        if isinstance(node, ast.Import):
            out |= {a.name for a in node.names}
        elif isinstance(node, ast.ImportFrom):
            base = package.split(".")[: len(package.split(".")) - node.level + 1] if node.level else []
            module = ".".join([*base, *([node.module] if node.module else [])])
            out.add(module)
            out |= {f"{module}.{a.name}" for a in node.names}
    return out


def import_graph(folders: list[str]) -> dict[str, set[str]]:
    """Module -> the modules of `folders` it imports (importing `a.b.c` also runs `a` and `a.b`)."""
    known = {_module_name(p): p for folder in folders for p in modules(folder)}
    graph: dict[str, set[str]] = {}
    for name, path in known.items():
        edges: set[str] = set()
        for imported in module_imports(path, name):
            parts = imported.split(".")
            edges |= {m for i in range(1, len(parts) + 1) if (m := ".".join(parts[:i])) in known}
        graph[name] = edges - {name}
    return graph


def cycles(graph: dict[str, set[str]]) -> list[list[str]]:
    """The graph's strongly connected components of more than one module (Tarjan), sorted."""
    index: dict[str, int] = {}
    low: dict[str, int] = {}
    stack: list[str] = []
    on_stack: set[str] = set()
    found: list[list[str]] = []

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
    return sorted(found)


def test_the_cycle_finder_sees_type_checking_and_relative_imports(tmp_path: Path) -> None:
    """The finder itself: a cycle closed only under TYPE_CHECKING, or by a relative import inside a
    function, is a cycle."""
    assert cycles({"a": {"b"}, "b": {"c"}, "c": {"a"}, "d": {"a"}}) == [["a", "b", "c"]]
    source = "from typing import TYPE_CHECKING\nif TYPE_CHECKING:\n    from service.x import Y\n"
    path = tmp_path / "m.py"
    path.write_text(source + "def f():\n    from . import z\n    from ..other import w\n")
    assert module_imports(path, "service.pkg.m") >= {"service.x.Y", "service.pkg.z", "service.other.w"}


@pytest.mark.parametrize("folders", [["service"], ["export"]], ids=lambda f: "+".join(f))
def test_no_import_cycles(folders: list[str]) -> None:
    """No module of these folders imports itself through others: the layers hold for every import,
    those a function makes and those only the type checker sees included."""
    assert cycles(import_graph(folders)) == []


@pytest.mark.parametrize("path", modules("service/documents"), ids=rel)
def test_documents_never_import_http(path: Path) -> None:
    """File formats know nothing of the protocols that carry them (TYPE_CHECKING imports included)."""
    name = _module_name(path)
    assert [i for i in module_imports(path, name) if i == "service.http" or i.startswith("service.http.")] == []


def test_every_route_that_runs_a_model_goes_through_the_one_pipeline(tiny_store: Path) -> None:
    """A route with a request metric runs a model: its handler is a codec, whose call is the
    pipeline itself (no codec overrides it), so admission, the deadline, limits and charging,
    model resolution and the run happen in one place for every protocol."""
    from service.app import create_app
    from service.http.pipeline import Codec, serve
    from service.settings import Settings

    routes = create_app(Settings(model_store=tiny_store)).table.routes
    inference = [r for r in routes if r.metric is not None]
    assert len(inference) >= 6  # REST per task, OIP infer (two paths), LibreTranslate's, both file routes
    for route in inference:
        assert isinstance(route.handler, Codec), route.name
        assert type(route.handler).__call__ is serve, route.name
    assert not [r.name for r in routes if isinstance(r.handler, Codec) and r.metric is None]


@pytest.mark.parametrize("path", [p for p in modules("service/http") if p.name != "pipeline.py"], ids=rel)
def test_no_handler_module_runs_a_task_or_charges_a_client_itself(path: Path) -> None:
    """Only the pipeline calls a task's `run`, admits a request or charges a client: a codec gets
    the run handed to it (`execute(request, run, work)`)."""
    tree = ast.parse(path.read_text())
    found = []
    for node in ast.walk(tree):
        if isinstance(node, ast.Call) and isinstance(node.func, ast.Attribute):
            owner = ast.unparse(node.func.value)
            if node.func.attr == "run" and "task" in owner.lower():
                found.append(ast.unparse(node))
            if node.func.attr in ("admit", "charge"):
                found.append(ast.unparse(node))
            if node.func.attr == "texts" and owner.endswith("limits"):  # the request count is middleware's too
                found.append(ast.unparse(node))
    assert found == []


def test_the_http_layer_has_a_bottom_and_the_table_is_data() -> None:
    """`service/http/scope.py` (request info, headers, scope keys, `Call`, `Handler`) imports no
    other HTTP module; the route table imports only it, so a declaration never depends on the
    dispatcher that reads it."""
    graph = import_graph(["service"])
    assert {m for m in graph["service.http.scope"] if m.startswith("service.http")} == set()
    assert {m for m in graph["service.http.table"] if m.startswith("service.http")} == {
        "service.http",
        "service.http.scope",
    }


def imported_test_modules(path: Path) -> set[str]:
    """The test modules (`test_*` of `tests/`) that `path` imports, at any depth of the file and
    in any spelling: `tests.test_x`, `from tests import test_x`, `from . import test_x`,
    `from .test_x import ...`, or `test_x` alone."""
    names: set[str] = set()
    for node in ast.walk(ast.parse(path.read_text(), str(path))):
        if isinstance(node, ast.Import):
            names |= {a.name for a in node.names}
        elif isinstance(node, ast.ImportFrom) and node.level <= 1:
            module = node.module or ""
            if node.level == 1:  # relative to the tests package
                module = f"tests.{module}" if module else "tests"
            names |= {module, *(f"{module}.{a.name}" for a in node.names)}
    tests = {f"tests.{p.stem}" for p in (ROOT / "tests").glob("test_*.py")}
    return {n for n in names if n in tests or f"tests.{n}" in tests}


@pytest.mark.parametrize("path", sorted((ROOT / "tests").glob("test_*.py")), ids=rel)
def test_no_test_module_imports_another(path: Path) -> None:
    assert imported_test_modules(path) == set()


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
