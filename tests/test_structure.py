"""The layering the code promises, checked on the parsed imports (not on strings).

- The HTTP layer imports tasks, never the engine, the runtime, numpy or onnxruntime.
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
