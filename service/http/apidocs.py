"""The API pages, /docs (Swagger UI) and /redoc (ReDoc), without a network: their scripts and styles
are the builds the `fastapi-offline` package ships (kept current with Swagger UI's and ReDoc's
releases), read from the installed package and served here under /docs/assets/, instead of
FastAPI's default links to a CDN (a blank page on a host that cannot reach it).

Only the files named in ASSETS are served, under a Content-Security-Policy that allows this origin
alone (ReDoc adds its styles as <style> elements and searches in a blob: worker: those two are
allowed, nothing else). SERVE_API_PAGES=false leaves the pages out (404); /openapi.json stays.
"""

from __future__ import annotations

import hashlib
import html
from functools import cache
from importlib import resources

from fastapi.openapi.docs import get_swagger_ui_oauth2_redirect_html
from starlette.responses import Response
from starlette.types import ASGIApp

from service.http.errors import NotFound
from service.http.page import STATIC
from service.http.scope import Call, Handler
from service.http.table import Route

PACKAGE = "fastapi_offline"  # its static/ folder: swagger-ui-bundle.js, swagger-ui.css, redoc.standalone.js
ASSETS: dict[str, str] = {
    "swagger-ui-bundle.js": "text/javascript; charset=utf-8",
    "swagger-ui.css": "text/css; charset=utf-8",
    "redoc.standalone.js": "text/javascript; charset=utf-8",
    "favicon.png": "image/png",
}
OWN = {"swagger-init.js": "text/javascript; charset=utf-8"}  # this project's, beside the try-it page's files
CSP = (
    "default-src 'self'; script-src 'self'; style-src 'self' 'unsafe-inline'; img-src 'self' data:; "
    "connect-src 'self'; worker-src 'self' blob:; font-src 'self'; object-src 'none'; base-uri 'none'; "
    "form-action 'none'; frame-ancestors 'none'"
)
HEADERS = {
    "Content-Security-Policy": CSP,
    "X-Content-Type-Options": "nosniff",
    "Referrer-Policy": "no-referrer",
    "Cache-Control": "no-cache",  # revalidated by ETag: a new package's build is used at once
}


def _page(title: str, head: str, body: str) -> str:
    return (
        '<!doctype html>\n<html lang="en">\n<head>\n<meta charset="utf-8">\n'
        '<meta name="viewport" content="width=device-width, initial-scale=1">\n'
        f'<title>{html.escape(title)}</title>\n<link rel="icon" href="docs/assets/favicon.png">\n{head}</head>\n'
        f"<body>\n{body}</body>\n</html>\n"
    )


def swagger_page(title: str) -> str:
    """Swagger UI: the bundle, then this project's init script (no inline script: the CSP forbids it)."""
    return _page(
        f"{title} - Swagger UI",
        '<link rel="stylesheet" href="docs/assets/swagger-ui.css">\n',
        '<div id="swagger-ui"></div>\n<script src="docs/assets/swagger-ui-bundle.js"></script>\n'
        '<script src="docs/assets/swagger-init.js"></script>\n',
    )


def redoc_page(title: str) -> str:
    """ReDoc reads its options from its element: no script of this project's."""
    return _page(
        f"{title} - ReDoc",
        "",
        '<redoc spec-url="openapi.json" hide-download-button></redoc>\n'
        '<script src="docs/assets/redoc.standalone.js"></script>\n',
    )


@cache
def asset(name: str) -> tuple[bytes, str]:
    """An asset's bytes and ETag, read once."""
    if name in OWN:
        data = (STATIC / name).read_bytes()
    else:
        data = resources.files(PACKAGE).joinpath("static", name).read_bytes()
    return data, '"' + hashlib.sha256(data).hexdigest()[:32] + '"'


def _answer(content: bytes, media_type: str, etag: str | None, call: Call) -> Response:
    headers = dict(HEADERS) | ({"ETag": etag} if etag else {})
    if etag and etag in _header(call, b"if-none-match"):
        return Response(status_code=304, headers=headers)
    return Response(content, media_type=media_type, headers=headers)


def _header(call: Call, name: bytes) -> str:
    return next((v.decode("latin-1") for k, v in call.scope["headers"] if k == name), "")


def check_assets() -> None:
    """RuntimeError at start-up, not a 500 at the first page, when the package or a file is missing."""
    try:
        folder = resources.files(PACKAGE).joinpath("static")
    except ImportError as exc:
        raise RuntimeError(f"the API pages need the {PACKAGE} package (or SERVE_API_PAGES=false): {exc}") from exc
    if missing := [n for n in ASSETS if not folder.joinpath(n).is_file()]:
        raise RuntimeError(f"the API pages' assets are missing from {PACKAGE}: {', '.join(missing)}")


def routes(title: str, enabled: bool = True) -> list[Route]:
    """/docs, /redoc and their assets; none when the pages are turned off."""
    if not enabled:
        return []
    check_assets()
    pages = {"/docs": swagger_page(title).encode(), "/redoc": redoc_page(title).encode()}
    media = ASSETS | OWN

    def page(path: str) -> Handler:
        content = pages[path]

        async def answer(call: Call) -> ASGIApp:
            return _answer(content, "text/html; charset=utf-8", None, call)

        return answer

    async def assets(call: Call) -> ASGIApp:
        name = call.params["name"]
        if name not in media:
            raise NotFound("no such file")
        data, etag = asset(name)
        return _answer(data, media[name], etag, call)

    async def swagger_redirect(call: Call) -> ASGIApp:
        return get_swagger_ui_oauth2_redirect_html()  # Swagger UI's OAuth2 return page, as FastAPI serves it

    return [
        Route("/docs", ("GET",), page("/docs"), "swagger_ui", documented=False),
        Route("/docs/oauth2-redirect", ("GET",), swagger_redirect, "swagger_ui_redirect", documented=False),
        Route("/docs/assets/{name}", ("GET",), assets, "docs_asset", documented=False),
        Route("/redoc", ("GET",), page("/redoc"), "redoc", documented=False),
    ]
