"""The route table: one declaration per route, from which the dispatcher, the middleware rules and
the API document are all derived; no other module matches paths."""

from __future__ import annotations

import ast
import re
from pathlib import Path
from typing import Any

import pytest

from service.app import create_app
from service.http.table import Access, Auth, Protocol, Route, RouteTable
from service.settings import Settings

ROOT = Path(__file__).resolve().parents[1]


async def _handler(call: Any) -> Any:
    raise AssertionError("not called")


def concrete(template: str) -> str:
    return re.sub(r"{([a-z_]+)}", lambda m: "7" if m[1] == "version" else f"a-{m[1]}", template)


@pytest.fixture(scope="module")
def app(tmp_path_factory: pytest.TempPathFactory) -> Any:
    return create_app(Settings(model_store=tmp_path_factory.mktemp("empty-store"), api_keys="k1"))


def test_the_document_and_the_dispatcher_read_the_same_declarations(app: Any) -> None:
    table: RouteTable = app.table
    doc = app.openapi()
    documented = {(path, method.upper()) for path, ops in doc["paths"].items() for method in ops}
    declared = {(r.path, m) for r in table.routes if r.documented for m in r.methods}
    assert documented == declared
    for r in table.routes:
        for method in r.methods:
            found = table.match(method, concrete(r.path))
            assert found is not None and found.route is r, (method, r.path)
            if r.documented:
                op = doc["paths"][r.path][method.lower()]
                codes = {int(c) for c in op["responses"] if c != "200"}
                assert codes == set(r.statuses(method, app.state.serve.keys.access)), r.path
                assert op["operationId"].startswith(r.name)
    # the inference routes every protocol serves are there, each once
    names = [r.name for r in table.routes]
    assert {"classification", "translation", "infer", "version_infer", "libretranslate_translate"} <= set(names)


def test_a_route_s_rules_come_from_its_declaration() -> None:
    none, keys = Access(), Access(inference=True)
    r = Route("/x", ("POST",), _handler, "x", auth=Auth.BEARER, errors=(404,))
    assert r.statuses("POST", none) == (400, 404, 408, 413, 415, 422, 503)
    assert r.statuses("POST", keys) == (400, 401, 403, 404, 408, 413, 415, 422, 503)
    probe = Route("/p", ("GET",), _handler, "p", probe=True)
    assert probe.statuses("GET", keys) == ()
    lt = Route("/lt", ("GET", "POST"), _handler, "lt", Protocol.LIBRETRANSLATE, auth=Auth.PARAM, errors=(404, 429))
    assert lt.statuses("POST", keys) == (400, 403, 408, 429, 503)  # LibreTranslate's: client errors are 400
    assert lt.statuses("GET", none) == (400, 429, 503)  # no body: no body checks
    admin = Route("/a", ("POST",), _handler, "a", auth=Auth.ADMIN)
    assert 403 in admin.statuses("POST", none) and 401 not in admin.statuses("POST", none)  # closed by default
    assert {401, 403} <= set(admin.statuses("POST", Access(admin=True, model_control=True)))
    metrics = Route("/m", ("GET",), _handler, "m", probe=True, auth=Auth.METRICS)
    assert metrics.statuses("GET", keys) == () and metrics.statuses("GET", Access(metrics=True)) == (401, 403)


def test_the_table_matches_paths_methods_and_parameters() -> None:
    infer = Route("/v2/models/{name}/versions/{version}/infer", ("POST",), _handler, "infer")
    meta = Route("/v2/models/{name}", ("GET",), _handler, "meta", Protocol.OIP)
    table = RouteTable([infer, meta, Route("/healthz", ("GET",), _handler, "healthz")])
    found = table.match("POST", "/v2/models/en-de/versions/3/infer")
    assert found is not None and found.route is infer and found.params == {"name": "en-de", "version": "3"}
    assert table.match("GET", "/v2/models/en-de/versions/3/infer/extra") is None
    assert table.match("GET", "/v2/models/a/b") is None  # a parameter never spans a slash
    wrong = table.match("DELETE", "/v2/models/en-de")
    assert wrong is not None and wrong.route is None and wrong.allowed == ("GET",) and wrong.protocol is Protocol.OIP
    head = table.match("HEAD", "/healthz")
    assert head is not None and head.route is not None and head.route.name == "healthz"
    with pytest.raises(ValueError, match="unique"):
        RouteTable([meta, meta])


def _path_rules(path: Path) -> list[str]:
    """Path matching written outside the table: regexes over paths, prefix tests on paths, reads
    of the request's path."""
    found = []
    for node in ast.walk(ast.parse(path.read_text())):
        if isinstance(node, ast.Call) and getattr(node.func, "attr", "") in ("startswith", "endswith", "fullmatch"):
            args = [a.value for a in node.args if isinstance(a, ast.Constant) and isinstance(a.value, str)]
            if any(a.startswith("/") for a in args):
                found.append(f"{node.lineno}: {ast.unparse(node)}")
        if isinstance(node, ast.Call) and ast.unparse(node.func) in ("re.compile", "re.match", "re.fullmatch"):
            pattern = node.args[0] if node.args else None
            if isinstance(pattern, ast.Constant) and str(pattern.value).lstrip("^").startswith("/"):
                found.append(f"{node.lineno}: a regex over paths {pattern.value!r}")
    return found


@pytest.mark.parametrize(
    "path",
    [p for p in sorted((ROOT / "service").rglob("*.py")) if p.name != "table.py"],
    ids=lambda p: str(p.relative_to(ROOT)),
)
def test_no_module_outside_the_table_matches_paths(path: Path) -> None:
    assert _path_rules(path) == []
    if path.name not in ("dispatch.py", "middleware.py", "tracing.py"):  # matching, the access log, the trace
        assert _path_reads(path) == []


def _path_reads(path: Path) -> list[int]:
    """Lines reading the request's path from an ASGI scope: `scope["path"]`, `scope.get("path")`."""
    out = []
    for node in ast.walk(ast.parse(path.read_text())):
        code = ast.unparse(node)
        if code.startswith("scope[") and code.endswith("['path']"):
            out.append(node.lineno)
        if isinstance(node, ast.Call) and code.startswith("scope.get('path'"):
            out.append(node.lineno)
    return out
