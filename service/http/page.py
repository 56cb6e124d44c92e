"""Static content: the try-it page (GET / and its assets under /static/) and each served model's
training pictures (GET /v1/models/{name}/figures/{figure}).

Only the files named in ASSETS are served (no path from a request ever reaches the file system),
under a Content-Security-Policy that allows nothing but this origin. A figure's bytes are read
with `store.read_pinned`, so the picture sent is the one the manifest pins.
"""

from __future__ import annotations

from functools import cache
from pathlib import Path

from fastapi import APIRouter, Request
from starlette.exceptions import HTTPException
from starlette.responses import Response

from service import store
from service.http import schemas
from service.http.state import get_state

STATIC = Path(__file__).with_name("static")
ASSETS: dict[str, str] = {
    "index.html": "text/html; charset=utf-8",
    "app.js": "text/javascript; charset=utf-8",
    "style.css": "text/css; charset=utf-8",
    "favicon.svg": "image/svg+xml",
}
CSP = (
    "default-src 'self'; script-src 'self'; style-src 'self'; img-src 'self'; connect-src 'self'; "
    "object-src 'none'; base-uri 'none'; form-action 'none'; frame-ancestors 'none'"
)
HEADERS = {
    "Content-Security-Policy": CSP,
    "X-Content-Type-Options": "nosniff",
    "Referrer-Policy": "no-referrer",
    "Cache-Control": "no-cache",  # revalidate: a new deployment's page is used at once
}
NOT_FOUND: dict[int | str, dict[str, object]] = {404: {"model": schemas.ErrorResponse}}

router = APIRouter()


@cache
def _asset(name: str) -> bytes:
    return (STATIC / name).read_bytes()


def _static(name: str) -> Response:
    if name not in ASSETS:
        raise HTTPException(404, "no such file")
    return Response(_asset(name), media_type=ASSETS[name], headers=HEADERS)


@router.get("/", response_class=Response, include_in_schema=False)
def index() -> Response:
    """The page: try the models and see what they attend to."""
    return _static("index.html")


@router.get("/static/{name}", response_class=Response, include_in_schema=False)
def asset(name: str) -> Response:
    return _static(name)


@router.get(
    "/v1/models/{name}/figures/{figure}",
    response_class=Response,
    responses={200: {"content": {"image/png": {}}}, **NOT_FOUND},
)
def figure(name: str, figure: str, request: Request) -> Response:
    """A PNG kept with the serving version (`figures` in /v1/models): training curves, positions.
    A plain `def`: reading and hashing the file runs in the thread pool, off the event loop."""
    task = get_state(request).models.get(name).ready_task()
    file_name = task.manifest.figures.get(figure)
    if file_name is None:
        kept = ", ".join(sorted(task.manifest.figures)) or "none"
        raise HTTPException(404, f"model {name} version {task.entry.version} has no such figure (it has: {kept})")
    data = store.read_pinned(task.entry, file_name)
    etag = f'"{task.manifest.files[file_name].sha256}"'
    return Response(data, media_type="image/png", headers={**HEADERS, "ETag": etag})
