"""/docs and /redoc offline: a real headless chromium with every host but this one unreachable renders
each operation of the API document from the assets the service ships (`service.http.apidocs`);
the pages' headers, assets and the setting that turns them off."""

from __future__ import annotations

import inspect
import io
import time
from collections.abc import Iterator
from pathlib import Path

import httpx
import pytest
from fastapi.openapi.docs import get_swagger_ui_html
from fastapi.testclient import TestClient
from PIL import Image
from selenium.webdriver.chrome.webdriver import WebDriver

from service.app import create_app
from service.http import apidocs
from service.settings import Settings
from tests.browser import screenshot, severe, start_chromium, wait_for
from tests.helpers import Server, run_server

pytestmark = pytest.mark.browser  # Chromium against a real server: left out of `make test-fast`

# Every name resolves to nothing but this machine's loopback address, and any request that would
# leave it goes to a proxy on a closed loopback port: no byte leaves the host.
OFFLINE = ("--host-resolver-rules=MAP * ~NOTFOUND , EXCLUDE 127.0.0.1", "--proxy-server=http://127.0.0.1:9")
METHODS = ("get", "put", "post", "delete", "patch", "head", "options")
GET_BLUE, POST_GREEN = (0x61, 0xAF, 0xFE), (0x49, 0xCC, 0x90)  # Swagger UI's method badges: its CSS applied


@pytest.fixture(scope="module")
def server(tiny_store: Path, tmp_path_factory: pytest.TempPathFactory) -> Iterator[Server]:
    with run_server(tiny_store, tmp_path_factory.mktemp("apidocs") / "server.log") as s:
        yield s


@pytest.fixture(scope="module")
def offline(tmp_path_factory: pytest.TempPathFactory) -> Iterator[WebDriver]:
    driver = start_chromium(tmp_path_factory.mktemp("chromium-offline"), *OFFLINE)
    try:
        yield driver
    finally:
        driver.quit()


def operations(server: Server) -> list[tuple[str, str, str]]:
    doc = httpx.get(server.url + "/openapi.json", timeout=30).json()
    ops = [(m.upper(), path, op["operationId"]) for path, item in doc["paths"].items() for m, op in item.items()]
    return sorted(op for op in ops if op[0].lower() in METHODS)


def test_the_browser_is_offline(offline: WebDriver) -> None:
    """FastAPI's default page loads Swagger UI from a CDN: here that script never arrives."""
    cdn = inspect.signature(get_swagger_ui_html).parameters["swagger_js_url"].default
    offline.get(f"data:text/html,<script src='{cdn}'></script>")
    time.sleep(0.5)
    assert offline.execute_script("return typeof SwaggerUIBundle") == "undefined"
    assert any(cdn in m and "Failed to load resource" in m for m in severe(offline))  # (and the log read)


def test_docs_lists_every_operation_offline(server: Server, offline: WebDriver, tmp_path: Path) -> None:
    ops = operations(server)
    assert len(ops) > 20
    offline.get(server.url + "/docs")
    listed = "return [...document.querySelectorAll('.opblock')].length"
    wait_for(offline, "every operation", lambda d: d.execute_script(listed) == len(ops), timeout=30)
    shown = offline.execute_script(
        "return [...document.querySelectorAll('.opblock')].map(e => "
        "[e.querySelector('.opblock-summary-method').textContent, "
        "e.querySelector('.opblock-summary-path').getAttribute('data-path')])"
    )
    assert sorted(map(tuple, shown)) == [(m, p) for m, p, _ in ops]
    assert severe(offline) == []
    shot = Image.open(io.BytesIO(screenshot(offline, tmp_path, "docs-offline.png", 1280).read_bytes())).convert("RGB")
    colours = {c for _, c in shot.getcolors(1 << 20) or []}
    assert shot.height > 2000 and len(colours) > 50  # a long page, drawn: not blank, not unstyled text
    assert GET_BLUE in colours and POST_GREEN in colours


def test_redoc_lists_every_operation_offline(server: Server, offline: WebDriver, tmp_path: Path) -> None:
    ops = operations(server)
    offline.get(server.url + "/redoc")
    items = "return [...document.querySelectorAll('li[data-item-id^=\"operation/\"]')].map(e => e.dataset.itemId)"
    wait_for(offline, "every operation in the menu", lambda d: len(d.execute_script(items)) == len(ops), timeout=30)
    assert sorted(offline.execute_script(items)) == sorted(f"operation/{op}" for _, _, op in ops)
    screenshot(offline, tmp_path, "redoc-offline.png", 1280)
    offline.set_window_size(1280, 900)
    # ReDoc's footer links its maker's logo from the web: the page's policy blocks it, nothing else fails
    assert [m for m in severe(offline) if "violates the following Content Security Policy" not in m] == []


def test_the_pages_and_their_assets_and_the_switch(tmp_path: Path) -> None:
    on = TestClient(create_app(Settings(model_store=tmp_path)))
    for path in ("/docs", "/redoc", *(f"/docs/assets/{n}" for n in (*apidocs.ASSETS, *apidocs.OWN))):
        r = on.get(path)
        assert r.status_code == 200 and len(r.content) > 300, path
        assert r.headers["content-security-policy"] == apidocs.CSP and r.headers["x-content-type-options"] == "nosniff"
    assert "cdn" not in on.get("/docs").text.lower() and "cdn" not in on.get("/redoc").text.lower()
    etag = on.get("/docs/assets/swagger-ui.css").headers["etag"]
    again = on.get("/docs/assets/swagger-ui.css", headers={"If-None-Match": etag})
    assert again.status_code == 304 and again.content == b""
    assert on.get("/docs/assets/..%2Fpage.py").status_code == 404
    assert on.get("/docs/assets/index.html").status_code == 404  # the try-it page's files stay under /static/
    off = TestClient(create_app(Settings(model_store=tmp_path, api_pages=False)))
    for path in ("/docs", "/redoc", "/docs/assets/swagger-ui.css", "/docs/oauth2-redirect"):
        assert off.get(path).status_code == 404, path
    assert off.get("/openapi.json").status_code == 200


def test_a_missing_asset_package_stops_the_start_not_the_first_page(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(apidocs, "PACKAGE", "no_such_package_here")
    with pytest.raises(RuntimeError, match="the API pages need the no_such_package_here package"):
        apidocs.routes("x")
    assert apidocs.routes("x", enabled=False) == []
