"""The one pipeline (`service.http.pipeline`), driven with a scripted codec and task: the order of
its steps, and a deadline anchored once, at the request's arrival, that a protocol's timeout
option only ever shortens."""

from __future__ import annotations

from collections.abc import Sequence
from types import SimpleNamespace
from typing import Any

import pytest
from starlette.types import ASGIApp

from service.app import create_app
from service.errors import ShuttingDown
from service.http.pipeline import Codec, Decoded, Run, serve
from service.http.rest import RestCodec
from service.http.scope import SCOPE_KEY, Call, RequestInfo
from service.serving import ModelSet
from service.settings import Settings
from service.tasks.base import Task, Work
from service.tasks.translation import TranslationTask

ARRIVAL = 1000.0
pytestmark = pytest.mark.anyio


@pytest.fixture
def anyio_backend() -> str:
    return "asyncio"


class ScriptedTask:
    entry = SimpleNamespace(name="scripted", version=1)

    def __init__(self, steps: list[str]) -> None:
        self.steps = steps

    async def run(self, work: Work) -> str:
        self.steps.append(f"run {list(work.texts)}")
        return "result"


class ScriptedCodec(Codec[str, str, str]):
    """Records each step and the deadline the pipeline gives its work."""

    def __init__(self, timeout_s: float | None = None, texts: Sequence[str] = ("a",)) -> None:
        self.timeout_s, self.texts = timeout_s, texts
        self.steps: list[str] = []
        self.deadline: float | None = None

    async def decode(self, call: Call, settings: Settings) -> Decoded[str]:
        self.steps.append("decode")
        return Decoded("request", self.texts, self.timeout_s)

    def resolve(self, request: str, models: ModelSet) -> Task[Any, str]:
        self.steps.append("resolve")
        return ScriptedTask(self.steps)  # type: ignore[return-value]

    def work(self, request: str, task: Task[Any, str], deadline: float) -> Work:
        self.steps.append("work")
        self.deadline = deadline
        return Work(self.texts, None, deadline)  # type: ignore[arg-type]

    async def execute(self, request: str, run: Run[str], work: Work) -> str:
        self.steps.append("execute")
        return await run(work)

    async def encode(self, request: str, task: Task[Any, str], done: str) -> ASGIApp:
        self.steps.append(f"encode {done}")
        return None  # type: ignore[return-value]


@pytest.fixture(scope="module")
def app(tmp_path_factory: pytest.TempPathFactory) -> Any:
    return create_app(Settings(model_store=tmp_path_factory.mktemp("empty-store"), request_timeout_s=30))


def call(app: Any, body: bytes = b"", params: dict[str, str] | None = None) -> Call:
    scope = {"type": "http", "app": app, "headers": [], SCOPE_KEY: RequestInfo("id", ARRIVAL)}
    return Call(scope, params or {}, body)


async def test_the_steps_run_in_one_order_and_the_model_is_named(app: Any) -> None:
    codec = ScriptedCodec()
    c = call(app)
    await serve(codec, c)
    assert codec.steps == ["decode", "resolve", "work", "execute", "run ['a']", "encode result"]
    assert c.info.model == "scripted"
    assert codec.__call__ == serve.__get__(codec)  # a codec, called as a handler, is the pipeline


@pytest.mark.parametrize(
    ("timeout_s", "deadline"),
    [(None, ARRIVAL + 30), (0.25, ARRIVAL + 0.25), (3600.0, ARRIVAL + 30)],  # shortened, never lengthened
)
async def test_the_deadline_counts_from_arrival(app: Any, timeout_s: float | None, deadline: float) -> None:
    codec = ScriptedCodec(timeout_s)
    await serve(codec, call(app))
    assert codec.deadline == deadline


async def test_a_closing_service_refuses_before_decoding(app: Any) -> None:
    codec = ScriptedCodec()
    app.state.serve.closing = True
    try:
        with pytest.raises(ShuttingDown):
            await serve(codec, call(app))
    finally:
        app.state.serve.closing = False
    assert codec.steps == []


async def test_protocol_timeouts_are_read_as_the_deadline_option(app: Any) -> None:
    """REST `timeout_ms` and OIP `parameters.timeout` (microseconds) come out of decoding as
    seconds, for the pipeline to anchor at arrival."""
    from service.http.oip import INFER

    settings = app.state.serve.settings
    rest = RestCodec(TranslationTask, {})
    decoded = await rest.decode(call(app, b'{"texts": ["a"], "timeout_ms": 250}'), settings)
    assert decoded.timeout_s == 0.25 and list(decoded.texts) == ["a"]
    assert (await rest.decode(call(app, b'{"texts": ["a"]}'), settings)).timeout_s is None
    tensor = b'{"inputs": [{"name": "text", "datatype": "BYTES", "shape": [1], "data": ["a"]}]'
    infer = await INFER.decode(call(app, tensor + b', "parameters": {"timeout": 1500}}', {"name": "m"}), settings)
    assert infer.timeout_s == pytest.approx(0.0015)
