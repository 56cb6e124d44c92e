"""A LibreTranslate-compatible API under /libretranslate/, for the tools that already speak it
(Mastodon, SearXNG, Discourse, `libretranslatepy`, `deep-translator`).

Parameters come as JSON, form-encoded or in the query string (`q` a string or a list, `source`,
`target`, `format` text | html, `alternatives`, `api_key`). Language pairs are those the served
translators declare in their manifests. Errors use LibreTranslate's shape and codes:
``{"error": ...}`` with 400 (bad or unsupported request, a key missing where one is needed), 403
(a wrong key), 429 (busy, with Retry-After), 503 (not ready, shutting down), 504 (deadline
passed), 500. As in LibreTranslate's `app.py`, only translate, translate_file and detect take a
key; the languages, settings, health and suggest routes are open.
There is no language detector here: `source: "auto"` means the one source language a translator
of the target language knows, and `/detect` answers LibreTranslate's "could not detect" (confidence
0) for that language. docs/protocols.md has the route table, LibreTranslate's behaviour beside ours.
"""

from __future__ import annotations

import copy
from collections.abc import Iterable, Mapping
from dataclasses import dataclass
from typing import Any
from urllib.parse import parse_qs

from starlette.types import ASGIApp

from service.documents import html_text, registry
from service.errors import InvalidInput
from service.http import schemas
from service.http.auth import KEY_ID, bearer, refused
from service.http.dispatch import json_answer
from service.http.errors import Forbidden, Unauthorized
from service.http.pipeline import Codec, Decoded, Run
from service.http.scope import Call
from service.http.state import scope_state
from service.http.table import Auth, Protocol, Route, Served, route_of
from service.serving import ModelSet
from service.settings import Settings
from service.tasks.base import Task, Work
from service.tasks.translation import Translated

LANGUAGE_NAMES = {"en": "English", "de": "German", "fr": "French", "es": "Spanish", "it": "Italian", "nl": "Dutch"}
MAX_ALTERNATIVES = 3
FORM = "application/x-www-form-urlencoded"
TRANSLATE_BODY: dict[str, Any] = {
    "type": "object",
    "required": ["q", "source", "target"],
    "properties": {
        "q": {
            "anyOf": [{"type": "string", "minLength": 1}, {"type": "array", "minItems": 1, "items": {"type": "string"}}]
        },
        "source": {"type": "string", "minLength": 1, "description": "a language code, or auto"},
        "target": {"type": "string", "minLength": 1, "description": "a language code"},
        "format": {"type": "string", "enum": ["text", "html"], "default": "text"},
        "alternatives": {
            "type": "integer",
            "maximum": MAX_ALTERNATIVES,
            "default": 0,
            "description": "alternative translations wanted (a negative number is 0, as LibreTranslate takes it)",
        },
        "api_key": {"type": "string"},
    },
}
"""The translate body as JSON or form fields; parsed by hand (`_params`), as LibreTranslate takes it.
The document gives it with the settings' limits and the served languages (`translate_doc`)."""
AUTO = "auto"  # "the one source language that translates into the target": there is no detector here
NO_KEY = "Please contact the server operator to get an API key"  # LibreTranslate's 400 for a key it needs


DETECT_BODY: dict[str, Any] = {
    "type": "object",
    "required": ["q"],
    "properties": {
        "q": {
            "anyOf": [{"type": "string", "minLength": 1}, {"type": "array", "minItems": 1, "items": {"type": "string"}}]
        },
        "api_key": {"type": "string"},
    },
}
DETECT_DOC: dict[str, Any] = {
    "requestBody": {
        "required": True,
        "content": {"application/json": {"schema": DETECT_BODY}, FORM: {"schema": None}},  # set below
    }
}


def _offered(sources: Iterable[object], targets: Iterable[object]) -> list[tuple[str, str]]:
    """A translator's pairs: each source language into every other of its target languages."""
    return [(str(s), str(t)) for s in sources for t in targets if s != t]


def _sources(pairs: Iterable[tuple[str, str]]) -> dict[str, frozenset[str]]:
    """What `source` may be, with the targets each takes: the served languages, and `auto` for
    the targets that one source language alone translates into (`translator` resolves it)."""
    out: dict[str, set[str]] = {}
    into: dict[str, set[str]] = {}
    for source, target in pairs:
        out.setdefault(source, set()).add(target)
        into.setdefault(target, set()).add(source)
    auto = {t for t, sources in into.items() if len(sources) == 1}
    if auto:
        out[AUTO] = auto
    return {s: frozenset(t) for s, t in out.items()}


def translate_body(pairs: Iterable[tuple[str, str]], max_texts: int, max_chars: int) -> dict[str, Any]:
    """The translate body's schema: `q` within the text limits, `source` and `target` among the
    served languages, and (when not every source takes every target) which targets each source
    takes (`language_choices`)."""
    body = copy.deepcopy(TRANSLATE_BODY)
    props = body["properties"]
    one, many = props["q"]["anyOf"]
    one["maxLength"] = max_chars
    schemas.text_limits(many, max_texts, max_chars, invalid=400, big=400)
    props["q"]["description"] = many.pop("description")  # it says the string's limit too
    return language_choices(body, pairs)


def language_choices(body: dict[str, Any], pairs: Iterable[tuple[str, str]]) -> dict[str, Any]:
    """`body` (a schema with `source` and `target` properties) with both among the served
    languages and, when not every source takes every target, which targets each source takes.
    Without it a client reading the document could send `"source": "xx"` and get a 400."""
    props = body["properties"]
    choices = _sources(pairs)
    if not choices:  # no translator serves: any code is answered 400
        return body
    props["source"]["enum"] = sorted(choices)
    props["target"]["enum"] = sorted(set().union(*choices.values()))
    groups: dict[frozenset[str], list[str]] = {}
    for source, targets in sorted(choices.items()):
        groups.setdefault(targets, []).append(source)
    if len(groups) > 1:
        body["anyOf"] = [
            {"properties": {"source": {"enum": sources}, "target": {"enum": sorted(targets)}}}
            for targets, sources in groups.items()
        ]
    return body


def served_pairs(served: Served) -> list[tuple[str, str]]:
    """The language pairs of the served translators, as the document knows them."""
    pairs = []
    for _, _, _, lists in served:
        choices = dict(lists)
        pairs += _offered(choices.get("source_languages", ()), choices.get("target_languages", ()))
    return pairs


def form_body(body: dict[str, Any]) -> dict[str, Any]:
    """The form's translate body: an empty form field is a missing one, as LibreTranslate reads it
    (`q=` is "missing q"), so a form's texts are never empty, a JSON list's may be."""
    form = copy.deepcopy(body)
    form["properties"]["q"]["anyOf"][1]["items"]["minLength"] = 1
    return form


DETECT_DOC["requestBody"]["content"][FORM]["schema"] = form_body(DETECT_BODY)


def translate_doc(settings: Settings, served: Served) -> dict[str, Any]:
    """The translate operation's body for these settings and served models (`Route.doc_served`)."""
    body = translate_body(served_pairs(served), settings.max_texts, settings.max_text_chars)
    content = {"application/json": {"schema": body}, FORM: {"schema": form_body(body)}}
    return {"requestBody": {"required": True, "content": content}}


def _params(call: Call) -> dict[str, Any]:
    """Query string, then the body (JSON object or form), later ones winning; repeated form keys are lists."""
    out = call.query()
    if not call.body:
        return out
    kind = (call.header(b"content-type") or "").split(";")[0].strip().lower()
    if kind == FORM:
        form = parse_qs(call.body.decode("utf-8", "replace"), keep_blank_values=True)
        out |= {k: v[0] if len(v) == 1 else v for k, v in form.items()}
        if len(form.get("q", ())) > 1 and "" in form["q"]:  # an empty field is a missing one
            raise InvalidInput("Invalid request: missing q parameter (an empty q field)")
        return out
    try:
        data = schemas.load_json(call.body)
    except ValueError:
        raise InvalidInput("Invalid request: the body is neither JSON nor form-encoded") from None
    if not isinstance(data, dict):
        raise InvalidInput("Invalid request: the JSON body must be an object")
    n = data.get("alternatives", 0)
    integral = isinstance(n, int) or (isinstance(n, float) and n.is_integer())  # 2.0 is 2; NaN, inf are not
    if isinstance(n, bool) or not integral:  # a form's "2" is text; JSON's must be a number
        raise InvalidInput("Invalid request: alternatives parameter is not a number")
    return out | data


def check_key(call: Call, params: Mapping[str, Any]) -> None:
    """LibreTranslate's key: its `api_key` parameter, else the bearer header. As LibreTranslate
    answers: a wrong key 403 "Invalid API key", none where one is needed 400 (`NO_KEY`)."""
    route = route_of(call.scope)
    if route is None or route.auth is not Auth.PARAM:
        return
    state = scope_state(call.scope)
    given = params.get("api_key")
    given = given if isinstance(given, str) and given else bearer(call.header(b"authorization"))
    key, verdict = state.keys.check(Auth.PARAM, given)
    if verdict is not None:
        refused(call.scope, state.metrics, verdict, key)
        if verdict.reason == "missing_key":
            raise InvalidInput(NO_KEY)
        raise Forbidden("Invalid API key" if verdict.error is Unauthorized else verdict.message)
    if key is not None:
        call.scope[KEY_ID] = key.id


def _offered_by(task: Task) -> list[tuple[str, str]]:
    """The pairs a model declares (a multilingual model: every source language into every other
    of its target languages); none for a model that declares no languages."""
    d = task.describe()
    return _offered(d.get("source_languages") or [], d.get("target_languages") or [])  # type: ignore[arg-type]


def _translators(models: ModelSet) -> list[tuple[Task, list[tuple[str, str]]]]:
    """Every serving model that declares the languages it translates between, with its pairs."""
    out = []
    for v in models.snapshot().serving():
        if v.task is not None:
            pairs = _offered_by(v.task)
            if pairs:
                out.append((v.task, pairs))
    return out


def _pairs(call: Call) -> dict[str, set[str]]:
    pairs: dict[str, set[str]] = {}
    for _, offered in _translators(scope_state(call.scope).models):
        for source, target in offered:
            pairs.setdefault(source, set()).add(target)
            pairs.setdefault(target, set())
    return pairs


async def languages(call: Call) -> ASGIApp:
    """The languages the served translators read, each with the languages it translates into
    (open, as LibreTranslate's: a client lists them before it has a key)."""
    body = [
        {"code": code, "name": LANGUAGE_NAMES.get(code, code), "targets": sorted(targets)}
        for code, targets in sorted(_pairs(call).items())
    ]
    return json_answer(body)


async def frontend_settings(call: Call) -> ASGIApp:
    state = scope_state(call.scope)
    settings = state.settings
    pairs = _pairs(call)
    source = next((c for c, t in sorted(pairs.items()) if t), "en")
    target = sorted(pairs.get(source, {"de"}))[0] if pairs.get(source) else "de"
    return json_answer(
        {
            # LibreTranslate's page refuses longer input before sending it
            "charLimit": min(settings.max_text_chars, settings.max_request_chars or settings.max_text_chars),
            "frontendTimeout": 500,
            "apiKeys": state.keys.access.inference,
            "keyRequired": state.keys.access.inference,
            "suggestions": False,
            "filesTranslation": True,
            "supportedFilesFormat": registry.extensions(),
            "language": {
                "source": {"code": source, "name": LANGUAGE_NAMES.get(source, source)},
                "target": {"code": target, "name": LANGUAGE_NAMES.get(target, target)},
            },
        }
    )


async def detect(call: Call) -> ASGIApp:
    """LibreTranslate's answer when it cannot detect (confidence 0), naming the language
    `source: "auto"` would read: there is no language detector here."""
    params = _params(call)
    check_key(call, params)
    q = params.get("q")
    if not q:
        raise InvalidInput("Invalid request: missing q parameter")
    if not isinstance(q, str | list) or not all(isinstance(t, str) for t in q):
        raise InvalidInput("Invalid request: q must be a string or a list of strings")
    if not isinstance(params.get("api_key", ""), str):
        raise InvalidInput("Invalid request: api_key must be a string")
    return json_answer([undetected(_pairs(call))])


def undetected(pairs: Mapping[str, set[str]]) -> dict[str, Any]:
    """`{"confidence": 0.0, "language": ...}`: the only language the translators read, else English
    (LibreTranslate's own fallback), else the first they read."""
    sources = sorted(c for c, targets in pairs.items() if targets)
    language = sources[0] if len(sources) == 1 or (sources and "en" not in sources) else "en"
    return {"confidence": 0.0, "language": language}


def detected(asked: object, source: str, texts: int, batch: bool) -> dict[str, Any]:
    """`detectedLanguage`, which LibreTranslate adds for `source: "auto"` (one per text for a list):
    the language `auto` resolved to, with confidence 0, for it was chosen, not detected."""
    if asked != AUTO:
        return {}
    one = {"confidence": 0.0, "language": source}
    return {"detectedLanguage": [dict(one) for _ in range(texts)] if batch else one}


async def health(call: Call) -> ASGIApp:
    """LibreTranslate's health check: the server answers (readiness is `/readyz`)."""
    return json_answer({"status": "ok"})


async def suggest(call: Call) -> ASGIApp:
    """As a LibreTranslate server with suggestions off (`"suggestions": false` in its settings)."""
    raise Forbidden("Suggestions are disabled on this server.")


def unique(options: list[str]) -> list[str]:
    """The alternatives as LibreTranslate gives them: each once, never the translation itself."""
    return [t for i, t in enumerate(options) if i and t != options[0] and t not in options[1:i]]


@dataclass(frozen=True, slots=True)
class TranslateParams:
    """A translate request as decoded: the texts (`q`), the languages and what to answer."""

    one: bool  # `q` was one string: so is the answer
    units: list[list[str]]  # per text: the text itself (format text) or its HTML pieces, markup first
    html: bool
    alternatives: int
    source: str  # a language code, or `auto`
    target: str

    @property
    def pieces(self) -> list[str]:
        """What is translated: each text, or each text node of each HTML text."""
        return [p for parts in self.units for p in (parts[1::2] if self.html else parts)]


class TranslateCodec(Codec[TranslateParams, Translated, Translated | None]):
    """LibreTranslate's `translate`: `q`, `source`, `target`, `format`, `alternatives` in (query,
    JSON or form), `translatedText` (and `alternatives`) out."""

    async def decode(self, call: Call, settings: Settings) -> Decoded[TranslateParams]:
        params = _params(call)
        check_key(call, params)
        q = params.get("q")
        if q is None or q == "" or q == []:
            raise InvalidInput("Invalid request: missing q parameter")
        texts = [q] if isinstance(q, str) else q
        if not isinstance(texts, list) or not all(isinstance(t, str) for t in texts):
            raise InvalidInput("Invalid request: q must be a string or a list of strings")
        schemas.check_texts(texts, settings.max_texts, settings.max_text_chars, "q")
        source, target = params.get("source"), params.get("target")
        if not isinstance(source, str) or not source:
            raise InvalidInput("Invalid request: missing source parameter")
        if not isinstance(target, str) or not target:
            raise InvalidInput("Invalid request: missing target parameter")
        if not isinstance(params.get("api_key", ""), str):  # ignored, when no key is needed, only if it is one
            raise InvalidInput("Invalid request: api_key must be a string")
        fmt = params.get("format", "text")
        if fmt not in ("text", "html"):
            raise InvalidInput("Invalid request: format must be text or html")
        alternatives = _alternatives(params.get("alternatives", 0))
        units = [html_text.split(t) if fmt == "html" else [t] for t in texts]
        return Decoded(TranslateParams(isinstance(q, str), units, fmt == "html", alternatives, source, target), texts)

    def resolve(self, request: TranslateParams, models: ModelSet) -> Task[Any, Translated]:
        return translator(models, request.source, request.target)[0]

    def work(self, request: TranslateParams, task: Task[Any, Translated], deadline: float) -> Work:
        n = request.alternatives + 1
        wanted = {"decode": "beam", "beam_size": max(4, n), "num_hypotheses": n}
        source = source_of(task, request.source, request.target)
        wanted |= {"source_language": source, "target_language": request.target}
        return Work(request.pieces, task.Options.model_validate(wanted), deadline)

    async def execute(self, request: TranslateParams, run: Run[Translated], work: Work) -> Translated | None:
        return await run(work) if work.texts else None  # only markup: nothing to translate

    async def encode(self, request: TranslateParams, task: Task[Any, Translated], done: Translated | None) -> ASGIApp:
        translated = [[h.text for h in row] for row in done.rows] if done is not None else []
        n = request.alternatives + 1
        results, k = [], 0
        for parts in request.units:
            if not request.html:
                options = translated[k][:n]
                k += 1
            else:
                texts_in = parts[1::2]
                picked = [row[:n] for row in translated[k : k + len(texts_in)]]
                k += len(texts_in)
                options = [html_text.join(parts, [p[min(i, len(p) - 1)] for p in picked]) for i in range(n)]
            results.append(options)
        if request.one:
            out: dict[str, Any] = {"translatedText": results[0][0]}
            if request.alternatives:
                out["alternatives"] = unique(results[0])
        else:
            out = {"translatedText": [r[0] for r in results]}
            if request.alternatives:
                out["alternatives"] = [unique(r) for r in results]
        source = source_of(task, request.source, request.target)
        return json_answer(out | detected(request.source, source, len(request.units), not request.one))


def _alternatives(value: object) -> int:
    """LibreTranslate's reading: a number, a negative one taken as 0, at most the limit."""
    try:
        n = int(value)  # type: ignore[call-overload]
    except (TypeError, ValueError):
        raise InvalidInput("Invalid request: alternatives parameter is not a number") from None
    if n > MAX_ALTERNATIVES:
        raise InvalidInput(f"Invalid request: alternatives parameter must be <= {MAX_ALTERNATIVES}")
    return max(0, n)


def translator(models: ModelSet, source: str, target: str) -> tuple[Task, str]:
    """The model translating `source` into `target`, and the source language (`auto` resolved)."""
    offered = _translators(models)
    if source == AUTO:
        sources = {s for _, pairs in offered for s, t in pairs if t == target}
        if len(sources) != 1:
            raise InvalidInput("Language detection is disabled on this server: name the source language")
        source = sources.pop()
    if not any(s == source for _, pairs in offered for s, _ in pairs):
        raise InvalidInput(f"{source} is not supported")
    for task, pairs in offered:
        if (source, target) in pairs:
            return task, source
    if not any(target in pair for _, pairs in offered for pair in pairs):
        raise InvalidInput(f"{target} is not supported")
    into, src = LANGUAGE_NAMES.get(target, target), LANGUAGE_NAMES.get(source, source)
    raise InvalidInput(f"{into} ({target}) is not available as a target language from {src} ({source})")


def source_of(task: Task, source: str, target: str) -> str:
    """`source`, or for `auto` the language `task` translates into `target` from (`translator`
    chose `task` as the only model with one)."""
    if source != AUTO:
        return source
    return next((s for s, t in _offered_by(task) if t == target), source)


def routes() -> list[Route]:
    lt, param = Protocol.LIBRETRANSLATE, Auth.PARAM
    return [
        Route(
            "/libretranslate/translate",
            ("POST",),
            TranslateCodec(),
            "libretranslate_translate",
            lt,
            summary="Translate",
            auth=param,
            errors=(400, 429, 503, 504),
            metric="/libretranslate/translate",
            forms=True,
            doc_served=translate_doc,
        ),
        Route(
            "/libretranslate/languages",
            ("GET",),
            languages,
            "libretranslate_languages",
            lt,
            summary="Languages",
            description=languages.__doc__ or "",
        ),
        Route("/libretranslate/frontend/settings", ("GET",), frontend_settings, "libretranslate_frontend_settings", lt),
        Route("/libretranslate/health", ("GET",), health, "libretranslate_health", lt, summary="Health", probe=True),
        Route(
            "/libretranslate/suggest",
            ("POST",),
            suggest,
            "libretranslate_suggest",
            lt,
            summary="Suggest",
            description=suggest.__doc__ or "",
            errors=(403,),
            forms=True,
        ),
        Route(
            "/libretranslate/detect",
            ("POST",),
            detect,
            "libretranslate_detect",
            lt,
            summary="Detect",
            description=detect.__doc__ or "",
            auth=param,
            errors=(400,),
            forms=True,
            doc_extra=DETECT_DOC,
        ),
    ]
