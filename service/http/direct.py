"""The inference hot path: a POST to a task's REST route (`/predict`, `/translate`) or to the Open
Inference Protocol's infer route is answered here, straight from ASGI, before FastAPI's routing.

Why: with one text per request, FastAPI's per-request layers (matching every route, a request
object, dependency solving, exit stacks, re-validating the answer) cost the event loop more CPU
than the request's own work (py-spy on the server under `wrk`). What a request gets here is what
the FastAPI route gives: the same JSON reading and error answers, validation with the task's own
request model, `routes.answer_task`, and the answer serialized by pydantic without its None
fields. FastAPI keeps the routes for the API document (same request and response models). OIP
infer requests go to `oip.answer_infer`, which the FastAPI route calls too.
"""

from __future__ import annotations

import json
from collections.abc import Iterable, Mapping
from typing import Any

from pydantic import BaseModel, ValidationError
from starlette.types import ASGIApp, Receive, Scope, Send

from service.errors import InvalidInput, InvalidJson, ServiceError, UnreadableBody
from service.http import oip
from service.http.errors import error_response
from service.http.routes import answer_task
from service.http.schemas import load_json
from service.tasks.base import Task
from service.validation import describe_validation

JSON_HEADERS = [(b"content-type", b"application/json")]
UNREADABLE = "There was an error parsing the body"  # FastAPI's words for a body json cannot decode
MISSING = {"type": "missing", "loc": (), "msg": "Field required"}  # an empty body, as FastAPI reports it


def parse_request(model: type[BaseModel], body: bytes, rules: Mapping[str, str]) -> Any:
    """The body as `model`; InvalidJson (400), UnreadableBody (400) or InvalidInput (422)."""
    if not body:
        raise InvalidInput(describe_validation([MISSING], rules))
    try:
        data = load_json(body)
    except json.JSONDecodeError as exc:
        raise InvalidJson(f"invalid JSON at position {exc.pos}: {exc.msg}") from None
    except ValueError:
        raise UnreadableBody(UNREADABLE) from None
    try:
        return model.model_validate(data)
    except ValidationError as exc:
        raise InvalidInput(describe_validation(exc.errors(), rules)) from None


async def read_body(receive: Receive) -> bytes:
    chunks = []
    while True:
        message = await receive()
        chunks.append(message.get("body", b""))
        if message["type"] != "http.request" or not message.get("more_body", False):
            return b"".join(chunks)


class DirectTaskRoutes:
    """ASGI middleware, innermost of the service's own (inside the body limit and the request
    context): a POST to a task route or to OIP infer is answered here, everything else goes on to
    FastAPI."""

    def __init__(self, app: ASGIApp, tasks: Iterable[type[Task]], rules: Mapping[str, str]) -> None:
        self.app, self.rules = app, rules
        self.routes = {cls.rest_path: cls for cls in tasks}

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        if scope["type"] != "http" or scope.get("method") != "POST":
            await self.app(scope, receive, send)
            return
        path = scope["path"]
        cls = self.routes.get(path)
        infer = oip.INFER_PATH.fullmatch(path) if cls is None else None
        if cls is None and infer is None:
            await self.app(scope, receive, send)
            return
        try:
            raw = await read_body(receive)
            if infer is not None:
                version = infer["version"]
                answer: ASGIApp = await oip.answer_infer(scope, raw, infer["name"], int(version) if version else None)
            else:
                assert cls is not None
                answer = json_answer(await answer_task(cls, scope, parse_request(cls.Request, raw, self.rules)))
        except ServiceError as exc:
            answer = error_response(path, str(exc) or exc.kind, exc.kind, retry_after=exc.retry_after)
        await answer(scope, receive, send)


def json_answer(answer: BaseModel) -> ASGIApp:
    """A 200 with the answer's JSON (None fields left out), sent without a Response object."""
    content = answer.model_dump_json(exclude_none=True).encode()
    headers = [(b"content-length", str(len(content)).encode()), *JSON_HEADERS]

    async def send_answer(scope: Scope, receive: Receive, send: Send) -> None:
        await send({"type": "http.response.start", "status": 200, "headers": headers})
        await send({"type": "http.response.body", "body": content})

    return send_answer
