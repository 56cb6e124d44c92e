"""Static content: the try-it page (GET / and its assets under /static/) and each served model's
training pictures (GET /v1/models/{name}/figures/{figure}).

Only the files named in ASSETS are served (no path from a request ever reaches the file system),
under a Content-Security-Policy that allows nothing but this origin. A figure's bytes were read
and checked against the manifest when its version loaded (`store.read_figures`): the picture sent
is the one the serving version pins, even after its folder is republished on disk.
"""

from __future__ import annotations

from functools import cache
from pathlib import Path

from starlette.responses import Response
from starlette.types import ASGIApp

from service.http.errors import NotFound
from service.http.scope import Call
from service.http.state import scope_state
from service.http.table import Route

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


@cache
def _asset(name: str) -> bytes:
    return (STATIC / name).read_bytes()


def _static(name: str) -> Response:
    if name not in ASSETS:
        raise NotFound("no such file")
    return Response(_asset(name), media_type=ASSETS[name], headers=HEADERS)


async def index(call: Call) -> ASGIApp:
    """The page: try the models and see what they attend to."""
    return _static("index.html")


async def asset(call: Call) -> ASGIApp:
    return _static(call.params["name"])


async def figure(call: Call) -> ASGIApp:
    """A PNG kept with the serving version (`figures` in /v1/models): training curves, positions.
    The bytes are the ones checked when the version loaded, kept in memory."""
    name, wanted = call.params["name"], call.params["figure"]
    task = scope_state(call.scope).models.get(name).ready_task()
    file_name = task.manifest.figures.get(wanted)
    data = task.figures.get(wanted)
    if file_name is None or data is None:
        kept = ", ".join(sorted(task.figures)) or "none"
        raise NotFound(f"model {name} version {task.entry.version} has no such figure (it has: {kept})")
    etag = f'"{task.manifest.files[file_name].sha256}"'
    return Response(data, media_type="image/png", headers={**HEADERS, "ETag": etag})


def routes() -> list[Route]:
    return [
        Route("/", ("GET",), index, "index", documented=False),
        Route("/static/{name}", ("GET",), asset, "asset", documented=False),
        Route(
            "/v1/models/{name}/figures/{figure}",
            ("GET",),
            figure,
            "figure",
            summary="Figure",
            description=figure.__doc__ or "",
            media_type="image/png",
            errors=(404, 503),
        ),
    ]
