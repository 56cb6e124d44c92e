"""A LibreTranslate-compatible API under /libretranslate/, for the tools that already speak it
(Mastodon, SearXNG, Discourse, `libretranslatepy`, `deep-translator`).

Parameters come as JSON, form-encoded or in the query string (`q` a string or a list, `source`,
`target`, `format` text | html, `alternatives`, `api_key`). Language pairs are those the served
translators declare in their manifests. Errors use LibreTranslate's shape and codes:
``{"error": ...}`` with 400 (bad or unsupported request), 403 (API key), 429 (busy, with
Retry-After), 503 (not ready, shutting down), 504 (deadline passed), 500.
There is no language detector here, so `/detect` answers that detection is disabled and
`source: "auto"` means the one source language a translator of the target language knows.
"""

from __future__ import annotations

from collections.abc import Callable, Mapping
from typing import Any
from urllib.parse import parse_qs

from fastapi import APIRouter, Request
from starlette.responses import JSONResponse, Response

from service.errors import NotReady, QueueFull, ServiceError
from service.http import html_text, schemas
from service.http.auth import key_allowed
from service.http.errors import RETRY_AFTER_S, http_status
from service.http.state import admit, get_state, set_model
from service.tasks.base import Task
from service.tasks.translation import TranslateRequest, TranslateResponse, TranslationTask

router = APIRouter(prefix="/libretranslate")

LANGUAGE_NAMES = {"en": "English", "de": "German", "fr": "French", "es": "Spanish", "it": "Italian", "nl": "Dutch"}
MAX_ALTERNATIVES = 3
FORM = "application/x-www-form-urlencoded"


class LtError(Exception):
    def __init__(self, status: int, message: str, retry_after: int | None = None) -> None:
        super().__init__(message)
        self.status, self.retry_after = status, retry_after


def _answer(error: LtError) -> Response:
    retry = error.retry_after or (RETRY_AFTER_S.get(QueueFull.kind) if error.status == 429 else None)
    headers = {"Retry-After": str(retry)} if retry else None
    return JSONResponse({"error": str(error)}, status_code=error.status, headers=headers)


async def _params(request: Request) -> dict[str, Any]:
    """Query string, then the body (JSON object or form), later ones winning; repeated form keys are lists."""
    out: dict[str, Any] = {k: v[0] if len(v) == 1 else v for k, v in parse_qs(request.url.query).items()}
    body = await request.body()
    if not body:
        return out
    kind = request.headers.get("content-type", "").split(";")[0].strip().lower()
    if kind == FORM:
        form = parse_qs(body.decode("utf-8", "replace"), keep_blank_values=True)
        out |= {k: v[0] if len(v) == 1 else v for k, v in form.items()}
        return out
    try:
        data = schemas.load_json(body)
    except ValueError:
        raise LtError(400, "Invalid request: the body is neither JSON nor form-encoded") from None
    if not isinstance(data, dict):
        raise LtError(400, "Invalid request: the JSON body must be an object")
    return out | data


def _check_key(request: Request, params: Mapping[str, Any]) -> None:
    keys = get_state(request).settings.api_key_list
    given = params.get("api_key")
    if not keys:
        return
    if not (isinstance(given, str) and key_allowed(given, keys)) and not key_allowed(
        _bearer(request.headers.get("authorization")), keys
    ):
        raise LtError(403, "Invalid API key")


def _bearer(header: str | None) -> str:
    if header and header[:7].lower() == "bearer ":
        return header[7:].strip()
    return ""


def _translators(request: Request) -> list[Task]:
    """Every serving translator that declares its languages."""
    out = []
    for v in get_state(request).models.snapshot().serving():
        task = v.task
        if task is not None and v.task_name == TranslationTask.name:
            d = task.describe()
            if d.get("source_language") and d.get("target_language"):
                out.append(task)
    return out


def _pairs(request: Request) -> dict[str, set[str]]:
    pairs: dict[str, set[str]] = {}
    for task in _translators(request):
        d = task.describe()
        pairs.setdefault(str(d["source_language"]), set()).add(str(d["target_language"]))
        pairs.setdefault(str(d["target_language"]), set())
    return pairs


def _guarded(handler: Callable[[Request], Any]) -> Callable[[Request], Any]:
    async def run(request: Request) -> Response:
        try:
            return await handler(request)
        except LtError as exc:
            return _answer(exc)
        except ServiceError as exc:
            status = http_status(exc.kind)
            status = 429 if isinstance(exc, QueueFull) else 503 if isinstance(exc, NotReady) else status
            retry = exc.retry_after or RETRY_AFTER_S.get(exc.kind)  # the busy server's own estimate
            return _answer(LtError(400 if status in (404, 413, 422) else status, str(exc), retry))

    run.__name__ = handler.__name__
    run.__doc__ = handler.__doc__
    return run


async def languages(request: Request) -> Response:
    """The languages the served translators read, each with the languages it translates into."""
    _check_key(request, await _params(request))
    pairs = _pairs(request)
    body = [
        {"code": code, "name": LANGUAGE_NAMES.get(code, code), "targets": sorted(targets)}
        for code, targets in sorted(pairs.items())
    ]
    return JSONResponse(body)


async def frontend_settings(request: Request) -> Response:
    settings = get_state(request).settings
    pairs = _pairs(request)
    source = next((c for c, t in sorted(pairs.items()) if t), "en")
    target = sorted(pairs.get(source, {"de"}))[0] if pairs.get(source) else "de"
    return JSONResponse(
        {
            "charLimit": settings.max_text_chars,
            "frontendTimeout": 500,
            "apiKeys": bool(settings.api_key_list),
            "keyRequired": bool(settings.api_key_list),
            "suggestions": False,
            "filesTranslation": False,
            "supportedFilesFormat": [],
            "language": {
                "source": {"code": source, "name": LANGUAGE_NAMES.get(source, source)},
                "target": {"code": target, "name": LANGUAGE_NAMES.get(target, target)},
            },
        }
    )


async def detect(request: Request) -> Response:
    _check_key(request, await _params(request))
    raise LtError(403, "Language detection is disabled on this server: no language detector is installed")


async def translate(request: Request) -> Response:
    state, deadline = admit(request)
    params = await _params(request)
    _check_key(request, params)
    q = params.get("q")
    if q is None or q == "" or q == []:
        raise LtError(400, "Invalid request: missing q parameter")
    texts = [q] if isinstance(q, str) else q
    if not isinstance(texts, list) or not all(isinstance(t, str) for t in texts):
        raise LtError(400, "Invalid request: q must be a string or a list of strings")
    schemas.check_texts(texts, state.settings.max_texts, state.settings.max_text_chars, "q")
    source, target = params.get("source"), params.get("target")
    if not isinstance(source, str) or not source:
        raise LtError(400, "Invalid request: missing source parameter")
    if not isinstance(target, str) or not target:
        raise LtError(400, "Invalid request: missing target parameter")
    fmt = params.get("format", "text")
    if fmt not in ("text", "html"):
        raise LtError(400, f"Invalid request: format must be text or html, got {fmt!r}")
    alternatives = _alternatives(params.get("alternatives", 0))
    task = _translator(request, source, target)
    set_model(request, task.entry.name)
    units = [html_text.split(t) if fmt == "html" else [t] for t in texts]
    pieces = [p for parts in units for p in (parts if fmt == "text" else parts[1::2])]
    translated: list[list[str]] = []
    if pieces:
        body = TranslateRequest(
            texts=pieces, decode="beam", beam_size=max(4, alternatives + 1), num_hypotheses=alternatives + 1
        )
        response = await task.answer(body, deadline)
        assert isinstance(response, TranslateResponse)
        for tr in response.translations:
            translated.append([tr.text] + [h.text for h in (tr.hypotheses or [])[1:]])
    results, k = [], 0
    for parts in units:
        if fmt == "text":
            options = translated[k]
            k += 1
        else:
            texts_in = parts[1::2]
            picked = translated[k : k + len(texts_in)]
            k += len(texts_in)
            options = [html_text.join(parts, [p[min(i, len(p) - 1)] for p in picked]) for i in range(alternatives + 1)]
        results.append(options)
    if isinstance(q, str):
        out: dict[str, Any] = {"translatedText": results[0][0]}
        if alternatives:
            out["alternatives"] = results[0][1:]
    else:
        out = {"translatedText": [r[0] for r in results]}
        if alternatives:
            out["alternatives"] = [r[1:] for r in results]
    return JSONResponse(out)


def _alternatives(value: object) -> int:
    try:
        n = int(value)  # type: ignore[call-overload]
    except (TypeError, ValueError):
        raise LtError(400, "Invalid request: alternatives must be an integer") from None
    if not 0 <= n <= MAX_ALTERNATIVES:
        raise LtError(400, f"Invalid request: alternatives must be between 0 and {MAX_ALTERNATIVES}")
    return n


def _translator(request: Request, source: str, target: str) -> Task:
    pairs = [(t, t.describe()) for t in _translators(request)]
    if source == "auto":
        sources = {str(d["source_language"]) for _, d in pairs if d["target_language"] == target}
        if len(sources) != 1:
            raise LtError(400, "Language detection is disabled on this server: name the source language")
        source = sources.pop()
    if not any(d["source_language"] == source for _, d in pairs):
        raise LtError(400, f"{source} is not supported")
    for task, d in pairs:
        if d["source_language"] == source and d["target_language"] == target:
            return task
    raise LtError(400, f"{target} is not supported")


for path, handler, methods in (
    ("/translate", translate, ["POST"]),
    ("/languages", languages, ["GET", "POST"]),
    ("/frontend/settings", frontend_settings, ["GET"]),
    ("/detect", detect, ["POST"]),
):
    # one route per path, so a 405 names every method the path takes (Allow)
    router.add_api_route(path, _guarded(handler), methods=methods, operation_id=f"libretranslate_{handler.__name__}")
