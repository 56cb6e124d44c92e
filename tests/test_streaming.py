"""Streaming (`"stream": true`): a translation's texts as Server-Sent Events, each text's deltas
adding up, byte for byte, to the answer the same request gets whole; refusals before the first
byte as JSON, errors after it as events; a reader that leaves or lags frees its rows."""

from __future__ import annotations

import asyncio
import base64
import json
import shutil
import subprocess
import time
from collections.abc import AsyncIterator, Iterator, Mapping
from pathlib import Path
from typing import Any

import httpx
import pytest
from fastapi import FastAPI

from service.app import create_app
from service.contract import spans
from service.errors import DeadlineExceeded
from service.http.events import event_stream
from service.http.table import Protocol
from service.settings import Settings
from service.tasks.base import Work
from service.tasks.deltas import settled
from service.tasks.seq2seq import Done
from service.tasks.translation import DecodeOptions
from tests.conftest import CHECKED_TEXTS
from tests.helpers import Server, metric, run_server, until

pytestmark = pytest.mark.anyio

# Texts of several lines and sentences, and with protected spans: their layout and spans must
# come back whole and in place, whatever order the sentences end in.
LAYOUT_TEXTS = [
    "The red cat. A dog runs.\nOpen the window.",
    "  The cat 5 sees http://example.org a dog.\n\nOpen the file ⟨1⟩ save.  ",
    "A big red house. The small blue window. A blue dog runs. Open the blue window.",
    "Open the window.\r\nThe red cat sees a dog.\n",
    "",
    " \n ",
    "&Open the window",  # a control's label: its accelerator is put back on the whole text
    "The cat 5 sees http://example.org a dog. Open the file ⟨1⟩ save. A dog runs.",
]


@pytest.fixture(scope="module")
def anyio_backend() -> str:
    return "asyncio"


def parse_events(body: str) -> list[Any]:
    """The `data:` payloads of an event stream, in order ([DONE] as the string)."""
    out: list[Any] = []
    for block in body.split("\n\n"):
        if not block:
            continue
        assert block.startswith("data: ") and "\n" not in block, block
        payload = block[len("data: ") :]
        out.append(payload if payload == "[DONE]" else json.loads(payload))
    return out


def texts_of(events: list[Any], n: int) -> tuple[list[str], list[dict[str, Any]]]:
    """Each text's deltas joined, and each text's last event; checks the stream's shape."""
    assert events[-1] == "[DONE]", events[-3:]
    joined, ends = [""] * n, [dict[str, Any]() for _ in range(n)]
    for e in events[:-1]:
        assert isinstance(e, dict) and "error" not in e, e
        i = e["index"]
        assert not ends[i], f"text {i} has an event after its last: {e}"
        if "finish_reason" in e:
            assert e["text"] == "", e
            ends[i] = e
        else:
            assert e["text"], f"an empty delta: {e}"
            joined[i] += e["text"]
    assert all(ends), ends
    return joined, ends


# -- pure parts ---------------------------------------------------------------------------------


def test_unmask_prefix_is_always_the_start_of_the_answer() -> None:
    """Whatever point a sentence's translation is cut at, what is shown starts the restored text."""
    found = ["http://example.org", "v1.2", "\x85"]
    translations = [
        "Öffne ⟨1⟩ und ⟨2⟩ .",
        "⟨1⟩ ⟨2⟩ ⟨3⟩",
        "a ⟨1⟩ ⟨1⟩ b ⟨9⟩ c",
        "⟨2⟩x ⟨1⟩",
        "nur Text  ",
        "   ",
        "⟨12 ⟨1⟩⟩ ⟨",
    ]
    for t in translations:
        whole = spans.unmask(t, found)
        for cut in range(len(t) + 1):
            shown = spans.unmask_prefix(t[:cut], found)
            assert whole.startswith(shown), (t, cut, shown, whole)
    assert spans.unmask_prefix("Öffne ⟨1⟩ und", found) == "Öffne http://example.org und"
    assert spans.unmask_prefix("Öffne ⟨1", found) == "Öffne"  # never a placeholder, nor half of one


def test_settled_text_holds_back_what_may_change() -> None:
    assert settled("Hallo", "Hallo Welt") == "Hallo"
    assert settled("Hallo We", "Hallo Welt") == "Hallo We"
    assert settled("a n", "an't") == "a"  # a clean-up rule changed the end: only the agreed part
    assert settled("Gr\ufffd", "Gr\ufffd\ufffd") == "Gr"  # never half a character


async def collect(app: Any, scope_extra: Mapping[str, Any] | None = None) -> list[dict[str, Any]]:
    """What an ASGI app sends for a GET (its messages), reading as fast as it sends."""
    sent: list[dict[str, Any]] = []
    done = asyncio.Event()

    async def receive() -> dict[str, Any]:
        await done.wait()
        return {"type": "http.disconnect"}

    async def send(message: dict[str, Any]) -> None:
        sent.append(message)

    await app(scope_extra, receive, send)
    done.set()
    return sent


def scope_of(app: FastAPI) -> dict[str, Any]:
    return {"type": "http", "app": app, "method": "POST", "path": "/translate"}


async def events_then(items: list[dict[str, object]], error: Exception | None = None) -> AsyncIterator[Any]:
    for item in items:
        yield item
        await asyncio.sleep(0)
    if error is not None:
        raise error


# -- in process ---------------------------------------------------------------------------------


@pytest.fixture(scope="module")
async def app(tiny_store: Path) -> AsyncIterator[FastAPI]:
    settings = Settings(model_store=tiny_store, threads=1, max_wait_ms=2, model_thread_priority="nice")
    application = create_app(settings)
    async with application.router.lifespan_context(application):
        async with httpx.AsyncClient(transport=httpx.ASGITransport(app=application), base_url="http://t") as c:
            for _ in range(1200):
                if (await c.get("/readyz")).status_code == 200:
                    break
                await asyncio.sleep(0.05)
        yield application


@pytest.fixture
async def client(app: FastAPI) -> AsyncIterator[httpx.AsyncClient]:
    transport = httpx.ASGITransport(app=app)
    async with httpx.AsyncClient(transport=transport, base_url="http://test", timeout=60) as c:
        yield c


OPTIONS = [
    {"decode": "greedy"},
    {"decode": "beam", "beam_size": 4},
    {"decode": "sample", "seed": 7, "temperature": 1.5},
]


@pytest.mark.parametrize("options", OPTIONS, ids=["greedy", "beam4", "sample"])
async def test_streamed_deltas_add_up_to_the_whole_answer(client: httpx.AsyncClient, options: dict[str, Any]) -> None:
    texts = [*CHECKED_TEXTS, *LAYOUT_TEXTS]
    for start in range(0, len(texts), 16):
        chunk = texts[start : start + 16]
        body = {"texts": chunk, "return_scores": True, **options}
        whole = await client.post("/translate", json=body)
        assert whole.status_code == 200, whole.text
        streamed = await client.post("/translate", json=body | {"stream": True})
        assert streamed.status_code == 200, streamed.text
        assert streamed.headers["content-type"].startswith("text/event-stream")
        joined, ends = texts_of(parse_events(streamed.text), len(chunk))
        answer = whole.json()["translations"]
        assert joined == [t["text"] for t in answer]
        assert [e["finish_reason"] for e in ends] == [t["finish_reason"] for t in answer]
        assert [e["score"] for e in ends] == [t["score"] for t in answer]


async def test_a_streamed_text_decodes_its_first_sentence_alone(app: FastAPI) -> None:
    """A stream is read in order: its first sentence decodes alone, then the others together, so
    it comes out after its own steps, not after steps shared with every row of the text."""
    task = app.state.serve.models.resolve(None, "translation")
    text = "The red cat sees a dog. Open the file. Save it now. Close the window."
    work = Work([text], DecodeOptions(decode="greedy"), time.monotonic() + 60)
    order = [(type(e).__name__, e.source) async for e in task.stream(work, tokens=True) if not isinstance(e, Done)]
    first_done = order.index(("Finished", 0))
    assert {source for _, source in order[:first_done]} == {0} and len(order) > first_done + 3
    assert sorted(source for kind, source in order if kind == "Finished") == [0, 1, 2, 3]


@pytest.mark.parametrize(
    ("text", "decode"),
    [("The red cat sees a dog.", "greedy"), (LAYOUT_TEXTS[2], "beam")],
    ids=["greedy-tokens", "beam-sentences"],
)
async def test_a_text_streams_in_several_deltas(client: httpx.AsyncClient, text: str, decode: str) -> None:
    """Greedy: one sentence arrives token by token; beam: a text of four sentences, sentence by sentence."""
    r = await client.post("/translate", json={"texts": [text], "decode": decode, "stream": True})
    deltas = [e["text"] for e in parse_events(r.text)[:-1] if "finish_reason" not in e]
    assert len(deltas) > 1, deltas


@pytest.mark.parametrize(
    ("extra", "named"),
    [({"num_hypotheses": 2}, "num_hypotheses"), ({"return_attention": True}, "return_attention")],
)
async def test_stream_refuses_what_it_cannot_carry(
    client: httpx.AsyncClient, extra: dict[str, Any], named: str
) -> None:
    r = await client.post("/translate", json={"texts": ["The red cat."], "stream": True, **extra})
    assert r.status_code == 400, r.text
    assert r.json()["type"] == "bad_request" and named in r.json()["error"], r.json()


async def test_refusals_before_the_first_byte_are_json(client: httpx.AsyncClient) -> None:
    r = await client.post("/translate", json={"texts": ["The red cat."], "stream": True, "model": "nope"})
    assert r.status_code == 404 and r.headers["content-type"] == "application/json", r.text
    r = await client.post("/translate", json={"texts": ["The red cat."], "stream": True, "max_new_tokens": 256})
    assert r.status_code == 422 and "max_new_tokens" in r.json()["error"], r.text


async def test_an_error_after_the_first_byte_is_an_event(app: FastAPI) -> None:
    stream = event_stream(events_then([{"index": 0, "text": "a"}], DeadlineExceeded("too late")), Protocol.REST)
    sent = await collect(stream, scope_of(app))
    assert sent[0]["type"] == "http.response.start" and sent[0]["status"] == 200
    bodies = b"".join(m.get("body", b"") for m in sent[1:]).decode()
    assert parse_events(bodies) == [{"index": 0, "text": "a"}, {"error": "too late", "type": "deadline_exceeded"}]
    assert sent[-1]["more_body"] is False


async def test_an_error_before_the_first_event_is_the_json_error(app: FastAPI) -> None:
    sent = await collect(event_stream(events_then([], DeadlineExceeded("too late")), Protocol.REST), scope_of(app))
    assert sent[0]["status"] == 504
    assert json.loads(sent[1]["body"]) == {"error": "too late", "type": "deadline_exceeded"}


async def test_a_slow_reader_is_cut_not_waited_for(app: FastAPI) -> None:
    """The reader does not read: past the buffer the request is cancelled (its generator closed)
    and, once the reader reads again, the stream ends with an error event."""
    state = app.state.serve
    bound = state.settings.stream_buffer_events
    closed = asyncio.Event()

    async def endless() -> AsyncIterator[dict[str, object]]:
        try:
            k = 0
            while True:
                yield {"index": 0, "text": str(k)}
                k += 1
                await asyncio.sleep(0)
        finally:
            closed.set()

    reading = asyncio.Event()
    sent: list[dict[str, Any]] = []

    async def receive() -> dict[str, Any]:
        await asyncio.Event().wait()
        return {"type": "http.disconnect"}

    async def send(message: dict[str, Any]) -> None:
        sent.append(message)
        if message["type"] == "http.response.body":
            await reading.wait()  # a reader that stalls after the first event

    cut_before = metric(state.metrics.render().decode(), "inference_streams_cut_total")
    task = asyncio.create_task(event_stream(endless(), Protocol.REST)(scope_of(app), receive, send))
    await asyncio.wait_for(closed.wait(), 10)  # cut while the reader still stalls
    reading.set()
    await asyncio.wait_for(task, 10)
    bodies = [m["body"] for m in sent if m["type"] == "http.response.body"]
    assert len(bodies) == bound + 2  # the first, the buffer, the error event
    assert json.loads(bodies[-1][len(b"data: ") :])["type"] == "slow_reader"
    assert metric(state.metrics.render().decode(), "inference_streams_cut_total") == cut_before + 1


async def test_a_reader_that_leaves_closes_the_run(app: FastAPI) -> None:
    closed = asyncio.Event()
    gone = asyncio.Event()

    async def endless() -> AsyncIterator[dict[str, object]]:
        try:
            while True:
                yield {"index": 0, "text": "x"}
                await asyncio.sleep(0.01)
        finally:
            closed.set()

    async def receive() -> dict[str, Any]:
        await gone.wait()
        return {"type": "http.disconnect"}

    sent: list[dict[str, Any]] = []

    async def send(message: dict[str, Any]) -> None:
        sent.append(message)
        if len(sent) == 3:
            gone.set()

    await asyncio.wait_for(event_stream(endless(), Protocol.REST)(scope_of(app), receive, send), 10)
    assert closed.is_set()
    assert state_streams(app) == 0


def state_streams(app: FastAPI) -> float:
    return metric(app.state.serve.metrics.render().decode(), "inference_streams_in_flight")


# -- a real server --------------------------------------------------------------------------------


@pytest.fixture(scope="module")
def server(tiny_store: Path, tmp_path_factory: pytest.TempPathFactory) -> Iterator[Server]:
    # four rows a step: a request of many texts runs in waves, so a reader can leave mid-way
    log = tmp_path_factory.mktemp("stream") / "server.log"
    with run_server(tiny_store, log, step_max_rows="4", step_express_share="0") as s:
        yield s


def disconnects(server: Server) -> float:
    text = httpx.get(f"{server.url}/metrics", timeout=30).text
    return sum(
        float(line.split()[-1])
        for line in text.splitlines()
        if line.startswith("inference_cancelled_sentences_total") and 'reason="disconnect"' in line
    )


@pytest.mark.slow
def test_curl_streams_as_the_docs_show(server: Server) -> None:
    """docs/protocols.md's command, and the deltas add up to the whole answer over a real socket."""
    body = {"texts": LAYOUT_TEXTS, "decode": "greedy"}
    whole = httpx.post(f"{server.url}/translate", json=body, timeout=60).json()["translations"]
    assert shutil.which("curl"), "curl is needed for this test"
    cmd = ["curl", "-sS", "-N", f"{server.url}/translate", "-H", "Content-Type: application/json"]
    done = subprocess.run([*cmd, "-d", json.dumps(body | {"stream": True})], capture_output=True, timeout=60)
    assert done.returncode == 0, done.stderr
    joined, ends = texts_of(parse_events(done.stdout.decode()), len(LAYOUT_TEXTS))
    assert joined == [t["text"] for t in whole]
    assert [e["finish_reason"] for e in ends] == [t["finish_reason"] for t in whole]


@pytest.mark.slow
def test_a_client_that_leaves_frees_its_rows(server: Server) -> None:
    texts = [t for t in CHECKED_TEXTS for _ in range(2)][:64]
    before = disconnects(server)
    with httpx.Client(timeout=60) as c:
        body = {"texts": texts, "decode": "greedy", "stream": True}
        with c.stream("POST", f"{server.url}/translate", json=body) as r:
            assert r.status_code == 200
            first = next(r.iter_lines())
            assert first.startswith("data: {"), first
        # the connection is closed here, long before 64 texts at four rows a step are done
    until("the server to count the cancelled sentences", lambda: disconnects(server) > before)
    metrics = httpx.get(f"{server.url}/metrics", timeout=30).text
    until(
        "the stream to end", lambda: metric(httpx.get(f"{server.url}/metrics").text, "inference_streams_in_flight") == 0
    )
    assert metric(metrics, "inference_stream_first_event_seconds_count") >= 1
    r = httpx.post(f"{server.url}/translate", json={"texts": ["The red cat."], "decode": "greedy"}, timeout=30)
    assert r.status_code == 200 and r.json()["translations"][0]["text"], r.text


async def test_a_file_streams_its_progress_then_itself(client: httpx.AsyncClient) -> None:
    """`/translate_file` with `stream=true`: entries done of the total as they are translated, then
    the same file the route answers without it."""
    lines = [t for t in CHECKED_TEXTS if "⟨" not in t][:24]
    upload = {"file": ("notes.txt", "\n\n".join(lines).encode())}
    whole = await client.post("/translate_file", files=upload)
    assert whole.status_code == 200, whole.text
    r = await client.post("/translate_file", files=upload, data={"stream": "true"})
    assert r.status_code == 200 and r.headers["content-type"].startswith("text/event-stream"), r.text
    events = parse_events(r.text)
    assert events[-1] == "[DONE]"
    *progress, last = events[:-1]
    total = len(set(lines))
    assert progress[0] == {"done": 0, "total": total} and progress[-1] == {"done": total, "total": total}
    assert [p["done"] for p in progress] == sorted(p["done"] for p in progress) and len(progress) > 2
    assert base64.b64decode(last["data"]) == whole.content
    assert last["filename"] in whole.headers["content-disposition"]
    assert last["translated"] == int(whole.headers["x-translated-entries"])
    bad = await client.post("/translate_file", files=upload, data={"stream": "maybe"})
    assert bad.status_code == 422 and "stream" in bad.json()["error"]


async def test_a_burst_of_events_is_not_a_slow_reader(app: FastAPI) -> None:
    """More events at once than the buffer holds (one step of many texts), read at once: no cut."""
    bound = app.state.serve.settings.stream_buffer_events
    burst = [{"index": k, "text": "x"} for k in range(3 * bound)]

    async def at_once() -> AsyncIterator[dict[str, object]]:
        for item in burst:
            yield item  # no await between them: the sender gets no turn but at the bound

    sent = await collect(event_stream(at_once(), Protocol.REST), scope_of(app))
    events = parse_events(b"".join(m.get("body", b"") for m in sent[1:]).decode())
    assert events == [*burst, "[DONE]"]


async def test_a_streamed_translation_cut_short_keeps_its_spans_and_says_so(client: httpx.AsyncClient) -> None:
    """A stream cut at its limit gets the missing spans in its deltas, as the whole answer does, and
    its last event counts them (`spans_appended`); a whole one's last event has no such field."""
    text = "The cat 5 sees http://example.org a dog."
    for body in ({"texts": [text], "decode": "greedy", "max_new_tokens": 1}, {"texts": [text]}):
        whole = (await client.post("/translate", json=body)).json()["translations"][0]
        streamed = await client.post("/translate", json=body | {"stream": True})
        joined, ends = texts_of(parse_events(streamed.text), 1)
        assert joined == [whole["text"]]
        assert ends[0].get("spans_appended") == whole.get("spans_appended")
    assert ends[0].get("spans_appended") is None and whole.get("spans_appended") is None
    cut = (await client.post("/translate", json={"texts": [text], "max_new_tokens": 1, "decode": "greedy"})).json()
    assert cut["translations"][0]["spans_appended"] >= 1
