"""Document routes: `POST /translate_file` and LibreTranslate's `translate_file` and `download_file`.

HTTP in, HTTP out: the multipart upload is read, its format found by extension
(`service.documents.registry`), its segments translated by the translation task
(`service.documents.runner`: chunked so other requests interleave) and the file rendered again.
The native route answers the file itself, with the counts in headers; LibreTranslate's answers a
download URL. docs/documents.md has the rules and limits.
"""

from __future__ import annotations

import asyncio
import base64
import copy
import re
from collections.abc import AsyncGenerator, Mapping
from dataclasses import dataclass, replace
from datetime import UTC, datetime
from typing import Any, Generic, TypeVar
from urllib.parse import quote

from opentelemetry.util.types import AttributeValue
from pydantic import ValidationError
from starlette.datastructures import Headers, UploadFile
from starlette.formparsers import MultiPartException, MultiPartParser
from starlette.responses import Response
from starlette.types import ASGIApp

from service.documents import registry, runner
from service.documents.base import DocumentError, Format, Parsed, Rendered, RenderInfo
from service.errors import InvalidDocument, InvalidInput
from service.http.dispatch import json_answer
from service.http.downloads import Downloads, safe_filename
from service.http.errors import NotFound
from service.http.events import event_stream
from service.http.libretranslate import check_key, language_choices, served_pairs, source_of, translator
from service.http.pipeline import Codec, Decoded, Run
from service.http.scope import Call
from service.http.state import scope_state
from service.http.table import Auth, Protocol, Route, Served
from service.serving import ModelSet
from service.settings import Settings
from service.tasks.base import Task, Work
from service.tasks.translation import Translated, TranslationTask
from service.validation import describe_validation

MAX_FIELDS = 16
_PROTO, _HOST = re.compile(r"^https?$"), re.compile(r"^[A-Za-z0-9.-]+(:\d{1,5})?$|^\[[0-9A-Fa-f:.]+\](:\d{1,5})?$")
_PREFIX = re.compile(r"^(/[A-Za-z0-9._~-]+)*/?$")


@dataclass(frozen=True)
class Upload:
    filename: str  # as the client named it, reduced to a safe last part
    data: bytes
    fields: dict[str, str]


async def read_upload(call: Call) -> Upload:
    """The multipart body's `file` and its other fields (strings)."""

    async def stream() -> Any:
        yield call.body

    try:
        form = await MultiPartParser(Headers(scope=call.scope), stream(), max_files=1, max_fields=MAX_FIELDS).parse()
    except MultiPartException as exc:
        raise InvalidDocument(f"unreadable multipart body: {exc.message}") from None
    upload = form.get("file")
    if not isinstance(upload, UploadFile):
        raise InvalidDocument("the multipart body needs a `file` part with a file name")
    data = await upload.read()
    fields = {k: v for k, v in form.multi_items() if isinstance(v, str)}
    return Upload(safe_filename(upload.filename or ""), data, fields)


def _format(upload: Upload, retranslate_fuzzy: bool = False) -> Format:
    try:
        return registry.find(upload.filename, retranslate_fuzzy)
    except DocumentError as exc:
        raise InvalidDocument(str(exc)) from None


@dataclass(frozen=True, slots=True)
class FileRequest:
    """An upload as decoded: the file, its format and segments, the model and languages it names."""

    upload: Upload
    fmt: Format
    parsed: Parsed
    unique: list[str]  # its distinct segments, in first-seen order: the work
    parallel: int  # segments in flight at a time (the settings')
    model: str | None  # a model's name: the native route's `model` field
    source: str | None  # a language code: the native route's optional ones, LibreTranslate's
    target: str | None


@dataclass(frozen=True, slots=True)
class ProgressFileRequest(FileRequest):
    """The native route's with `stream=true`: its progress as events, then the file in the last one."""


@dataclass(frozen=True, slots=True)
class FileRun:
    """A file's run that becomes its answer's stream: the run and the work, not yet started."""

    run: Run[Translated]
    work: Work


@dataclass(frozen=True, slots=True)
class KeptFileRequest(FileRequest):
    """LibreTranslate's: the translated file is kept (`downloads`) and its URL answered."""

    downloads: Downloads
    base_url: str  # where clients reach this server


async def _parsed(upload: Upload, fmt: Format, settings: Settings) -> tuple[Parsed, list[str]]:
    """The upload parsed (400 naming the line) and its distinct segments, within the file limits
    (413): what the client is charged for."""
    try:  # on a worker thread, as the rendering: a large file never stalls the event loop
        parsed = await asyncio.to_thread(fmt.parse, upload.data)
    except DocumentError as exc:
        raise InvalidDocument(f"{upload.filename}: {exc}") from None
    return parsed, runner.check_limits(parsed.segments, settings.max_file_segments, settings.max_file_chars)


F = TypeVar("F", bound=FileRequest)
Out = TypeVar("Out")  # what the codec's run gives its encoder: the translations, or a run to stream


class FileCodec(Codec[F, Translated, Out], Generic[F, Out]):
    """A document's codec: its distinct segments are the work, translated a few at a time
    (`service.documents.runner`) before the file's deadline (the settings' file timeout), and the
    file rendered again with them; the two protocols differ in their fields and their answer."""

    def budget_s(self, settings: Settings) -> float:
        return settings.file_timeout_s

    def work(self, request: F, task: Task[Any, Translated], deadline: float) -> Work:
        source, target = self.languages(request, task)
        languages = {k: v for k, v in (("source_language", source), ("target_language", target)) if v}
        try:
            options = task.Options.model_validate(languages)
        except ValidationError as exc:
            raise InvalidInput(describe_validation(exc.errors(), {})) from None
        return Work(request.unique, options, deadline)

    async def translate(
        self, request: F, run: Run[Translated], work: Work, progress: runner.Progress | None = None
    ) -> list[str]:
        """The translation of each segment, in the file's order."""

        async def best(texts: list[str]) -> list[str]:
            return [row[0].text for row in (await run(replace(work, texts=texts))).rows]

        segments = request.parsed.segments
        return await runner.translate_segments(
            segments, best, work.deadline, parallel=request.parallel, progress=progress
        )

    def document_attributes(self, request: F) -> Mapping[str, AttributeValue]:
        """The document's span: its segments, distinct segments and characters."""
        return {
            "transformer_serve.document.segments": len(request.parsed.segments),
            "transformer_serve.document.distinct_segments": len(request.unique),
            "transformer_serve.document.chars": sum(len(t) for t in request.unique),
        }

    def languages(self, request: F, task: Task[Any, Translated]) -> tuple[str | None, str | None]:
        """The source and target languages the request names (None: the model's own)."""
        return request.source, request.target

    async def render(self, request: F, task: Task[Any, Translated], done: list[str]) -> Rendered:
        d = task.describe()
        source, target = self.languages(request, task)
        info = RenderInfo(
            model=task.entry.name,
            version=task.entry.version,
            source_lang=str(source or d.get("source_language") or ""),
            target_lang=str(target or d.get("target_language") or ""),
            generator=f"transformer-serve ({task.entry.name} {task.entry.version})",
            now=datetime.now(UTC).strftime("%Y-%m-%d %H:%M+0000"),
        )
        return await asyncio.to_thread(request.parsed.render, done, info)


class NativeFileCodec(FileCodec[FileRequest, "list[str] | FileRun"]):
    """`POST /translate_file`: the file and `model`, `fuzzy`, `source_language`, `target_language`
    fields in; the translated file out, with the counts in headers. With `stream=true`, events
    (`service.http.events`): `{"done", "total"}` as its distinct texts are translated, then the
    file in one event (`data` in base64, `filename`, `media_type` and the counts)."""

    async def decode(self, call: Call, settings: Settings) -> Decoded[FileRequest]:
        upload = await read_upload(call)
        fuzzy = upload.fields.get("fuzzy", "false").lower()
        if fuzzy not in ("true", "false", "1", "0"):
            raise InvalidInput("fuzzy must be true or false")
        fmt = _format(upload, fuzzy in ("true", "1"))
        parsed, unique = await _parsed(upload, fmt, settings)
        fields = upload.fields
        model, source, target = fields.get("model"), fields.get("source_language"), fields.get("target_language")
        stream = fields.get("stream", "false").lower()
        if stream not in ("true", "false", "1", "0"):
            raise InvalidInput("stream must be true or false")
        kind = ProgressFileRequest if stream in ("true", "1") else FileRequest
        request = kind(upload, fmt, parsed, unique, settings.file_segments_in_flight, model, source, target)
        return Decoded(request, unique)

    def resolve(self, request: FileRequest, models: ModelSet) -> Task[Any, Translated]:
        return models.resolve(request.model or None, TranslationTask.name, None)

    async def execute(self, request: FileRequest, run: Run[Translated], work: Work) -> list[str] | FileRun:
        if isinstance(request, ProgressFileRequest):
            return FileRun(run, work)
        return await self.translate(request, run, work)

    async def encode(self, request: FileRequest, task: Task[Any, Translated], done: list[str] | FileRun) -> ASGIApp:
        if isinstance(done, FileRun):
            return event_stream(self._progress(request, task, done), Protocol.REST)
        rendered = await self.render(request, task, done)
        headers = {
            "content-type": request.fmt.media_type,
            "content-disposition": _disposition(self.filename(request, task)),
            "x-translated-entries": str(rendered.translated),
            "x-kept-entries": str(rendered.kept),
            "x-failed-entries": str(rendered.failed),
        }
        return Response(rendered.data, headers=headers)

    def filename(self, request: FileRequest, task: Task[Any, Translated]) -> str:
        return output_name(
            request.upload.filename, str(request.target or task.describe().get("target_language") or "translated")
        )

    async def _progress(
        self, request: FileRequest, task: Task[Any, Translated], file: FileRun
    ) -> AsyncGenerator[Mapping[str, object], None]:
        """The file's progress as events while it is translated (a task of its own), then the file."""
        counts: asyncio.Queue[tuple[int, int]] = asyncio.Queue()
        total = len(request.unique)
        yield {"done": 0, "total": total}
        running = asyncio.ensure_future(
            self.translate(request, file.run, file.work, lambda n, of: counts.put_nowait((n, of)))
        )
        try:
            while not running.done() or not counts.empty():
                waiting = asyncio.ensure_future(counts.get())
                await asyncio.wait({waiting, running}, return_when=asyncio.FIRST_COMPLETED)
                if waiting.done():
                    done, of = waiting.result()
                    yield {"done": done, "total": of}
                else:
                    waiting.cancel()
            rendered = await self.render(request, task, running.result())
        finally:
            running.cancel()  # a reader that left: the file's requests leave the scheduler
        yield {
            "filename": self.filename(request, task),
            "media_type": request.fmt.media_type,
            "data": base64.b64encode(rendered.data).decode("ascii"),
            "translated": rendered.translated,
            "kept": rendered.kept,
            "failed": rendered.failed,
        }


class LtFileCodec(FileCodec[KeptFileRequest, list[str]]):
    """LibreTranslate's `translate_file`: the file with `source`, `target` (and `api_key`) in; the
    translated file kept for a while and its URL out, as `translatedFileUrl`."""

    async def decode(self, call: Call, settings: Settings) -> Decoded[KeptFileRequest]:
        upload = await read_upload(call)
        check_key(call, upload.fields)
        source, target = upload.fields.get("source"), upload.fields.get("target")
        if not source:
            raise InvalidInput("Invalid request: missing source parameter")
        if not target:
            raise InvalidInput("Invalid request: missing target parameter")
        fmt = _format(upload)
        parsed, unique = await _parsed(upload, fmt, settings)
        downloads = scope_state(call.scope).downloads
        parallel = settings.file_segments_in_flight
        request = KeptFileRequest(
            upload, fmt, parsed, unique, parallel, None, source, target, downloads, base_url(call)
        )
        return Decoded(request, unique)

    def resolve(self, request: KeptFileRequest, models: ModelSet) -> Task[Any, Translated]:
        return translator(models, request.source or "", request.target or "")[0]

    def languages(self, request: KeptFileRequest, task: Task[Any, Translated]) -> tuple[str | None, str | None]:
        return source_of(task, request.source or "", request.target or ""), request.target

    async def execute(self, request: KeptFileRequest, run: Run[Translated], work: Work) -> list[str]:
        return await self.translate(request, run, work)

    async def encode(self, request: KeptFileRequest, task: Task[Any, Translated], done: list[str]) -> ASGIApp:
        rendered = await self.render(request, task, done)
        name = request.downloads.put(output_name(request.upload.filename, request.target or ""), rendered.data)
        url = f"{request.base_url}/libretranslate/download_file/{quote(name, safe='')}"  # "#", "?", "%" escaped
        return json_answer({"translatedFileUrl": url})


def output_name(filename: str, target: str) -> str:
    """`<stem>_<target><ext>`: "messages.po" -> "messages_de.po"."""
    stem, dot, ext = filename.rpartition(".")
    return f"{stem}_{target}.{ext}" if dot and stem else f"{filename}_{target}"


def _disposition(name: str) -> str:
    ascii_name = name.encode("ascii", "replace").decode().replace("?", "_")
    return f"attachment; filename=\"{ascii_name}\"; filename*=UTF-8''{quote(name)}"


def base_url(call: Call) -> str:
    """Where clients reach this server: the configured public URL, else the proxy's forwarded
    headers (each ignored when malformed), else the request's own scheme and Host."""
    public = scope_state(call.scope).settings.public_url
    if public:
        return public.rstrip("/")

    def forwarded(name: bytes, valid: re.Pattern[str]) -> str | None:
        value = (call.header(name) or "").split(",")[0].strip()
        return value if value and valid.match(value) else None

    scheme = forwarded(b"x-forwarded-proto", _PROTO) or call.scope.get("scheme", "http")
    host = forwarded(b"x-forwarded-host", _HOST) or forwarded(b"host", _HOST)
    if host is None:
        server = call.scope.get("server") or ("localhost", None)
        host = f"{server[0]}:{server[1]}" if server[1] else str(server[0])
    prefix = (forwarded(b"x-forwarded-prefix", _PREFIX) or "").rstrip("/")
    return f"{scheme}://{host}{prefix}"


async def lt_download_file(call: Call) -> ASGIApp:
    """A translated file, until it expires (then 404, as for a name never given)."""
    found = scope_state(call.scope).downloads.get(call.params["name"])
    if found is None:
        raise NotFound("no such file: it expired or never existed")
    filename, data = found
    fmt = _format(Upload(filename, b"", {}))
    return Response(data, headers={"content-type": fmt.media_type, "content-disposition": _disposition(filename)})


def _body(fields: dict[str, Any], required: list[str]) -> dict[str, Any]:
    """A multipart body; its `file` part's media types are the formats read (the file name's
    extension picks the format, its description lists them)."""
    schema = {"type": "object", "required": ["file", *required], "properties": copy.deepcopy(fields)}
    types = ", ".join(dict.fromkeys(f.media_type.split(";")[0] for f in registry.FORMATS))
    content = {"schema": schema, "encoding": {"file": {"contentType": types}}}
    return {"requestBody": {"required": True, "content": {"multipart/form-data": content}}}


TRANSLATE_FILE_DOC = """The uploaded file translated, in the answer's body (`X-Translated-Entries`,
    `X-Kept-Entries`, `X-Failed-Entries`: what became of its entries)."""
LT_TRANSLATE_FILE_DOC = """LibreTranslate's file translation: the translated file is kept for a while and its URL
    answered as `translatedFileUrl`."""
FILE = {
    "type": "string",
    "format": "binary",
    "description": "the document, in a format its file name's extension names: " + ", ".join(registry.extensions()),
}
FILE_ERRORS = (400, 404, 413, 422, 429, 503, 504)
LT_FIELDS: dict[str, Any] = {
    "file": FILE,
    "source": {"type": "string", "minLength": 1, "description": "a language code, or auto"},
    "target": {"type": "string", "minLength": 1, "description": "a language code"},
    "api_key": {"type": "string"},
}


def lt_file_doc(settings: Settings, served: Served) -> dict[str, Any]:
    """LibreTranslate's file body with `source` and `target` among the served languages."""
    doc = _body(LT_FIELDS, ["source", "target"])
    language_choices(doc["requestBody"]["content"]["multipart/form-data"]["schema"], served_pairs(served))
    return doc


FILE_EVENTS = """With stream=true, Server-Sent Events: `data: {"done": n, "total": m}` as the file's distinct
texts are translated, then `data: {"filename", "media_type", "data": <the file in base64>, "translated",
"kept", "failed"}`, then `data: [DONE]`. An error after the first event is `data: {"error": ..., "type":
...}`; before it, the JSON error and its status."""


def routes() -> list[Route]:
    types = tuple(dict.fromkeys(f.media_type for f in registry.FORMATS))
    lt = Protocol.LIBRETRANSLATE
    native_fields = {
        "file": FILE,
        "model": {"type": "string", "description": "a translator; default: the only (or default) one"},
        "fuzzy": {"type": "string", "enum": ["true", "false"], "description": "translate fuzzy entries again"},
        "stream": {
            "type": "string",
            "enum": ["true", "false"],
            "description": "the progress, then the file, as events",
        },
        "source_language": {"type": "string", "description": "a multilingual model's source language"},
        "target_language": {"type": "string", "description": "a multilingual model's target language"},
    }
    return [
        Route(
            "/translate_file",
            ("POST",),
            NativeFileCodec(),
            "translate_file",
            summary="Translate a document",
            description=TRANSLATE_FILE_DOC,
            media_type=types[0],
            media_types=types[1:],
            auth=Auth.BEARER,
            errors=FILE_ERRORS,
            metric="/translate_file",
            events=FILE_EVENTS,
            upload=True,
            doc_extra=_body(native_fields, []),
        ),
        Route(
            "/libretranslate/translate_file",
            ("POST",),
            LtFileCodec(),
            "libretranslate_translate_file",
            lt,
            summary="Translate file",
            description=LT_TRANSLATE_FILE_DOC,
            auth=Auth.PARAM,
            errors=(400, 429, 503, 504),
            metric="/libretranslate/translate_file",
            upload=True,
            doc_served=lt_file_doc,
        ),
        Route(
            "/libretranslate/download_file/{name}",
            ("GET",),
            lt_download_file,
            "libretranslate_download_file",
            Protocol.REST,  # LibreTranslate folds 404 into 400; an expired file is a 404 here
            summary="Download a translated file",
            description=lt_download_file.__doc__ or "",
            media_type=types[0],
            media_types=types[1:],
            errors=(404,),
        ),
    ]
