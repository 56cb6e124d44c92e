"""The HTTP service in-process (httpx.ASGITransport + the app's lifespan) over the tiny models."""

from __future__ import annotations

import asyncio
import contextlib
import gc
import json
import shutil
import threading
import weakref
from collections.abc import AsyncIterator, Callable
from pathlib import Path
from typing import Any

import httpx
import numpy as np
import pytest
from fastapi import FastAPI

from bench.engines import newest
from service import store
from service.app import create_app
from service.engine.classifier import ClassifierEngine, load_classifier
from service.engine.decoding import DecodeParams
from service.engine.runtime import LoadOptions
from service.engine.translator import TranslatorEngine, load_translator
from service.http.state import AppState
from service.settings import Settings
from tests.conftest import corrupt_copy, sentences
from tests.tiny import expected_label, expected_translation

pytestmark = pytest.mark.anyio


@pytest.fixture(scope="module")
def anyio_backend() -> str:
    return "asyncio"


def settings(store: Path, **kw: Any) -> Settings:
    base: dict[str, Any] = {"model_store": store, "threads": 1, "max_wait_ms": 2, "model_thread_priority": "nice"}
    return Settings(**(base | kw))


@contextlib.asynccontextmanager
async def serving(app: FastAPI, ready: bool = True) -> AsyncIterator[httpx.AsyncClient]:
    async with app.router.lifespan_context(app):
        transport = httpx.ASGITransport(app=app)
        async with httpx.AsyncClient(transport=transport, base_url="http://test", timeout=30) as client:
            if ready:
                await wait_ready(client)
            yield client


async def wait_ready(client: httpx.AsyncClient, timeout: float = 120) -> None:
    loop = asyncio.get_running_loop()
    end = loop.time() + timeout
    while (r := await client.get("/readyz")).status_code != 200:
        assert loop.time() < end, r.text
        await asyncio.sleep(0.02)


def state_of(app: FastAPI) -> AppState:
    return app.state.serve  # type: ignore[no-any-return]


@pytest.fixture(scope="module")
async def app(tiny_store: Path) -> AsyncIterator[FastAPI]:
    application = create_app(settings(tiny_store, max_wait_ms=20))
    async with serving(application):
        yield application


@pytest.fixture
async def client(app: FastAPI) -> AsyncIterator[httpx.AsyncClient]:
    transport = httpx.ASGITransport(app=app)
    async with httpx.AsyncClient(transport=transport, base_url="http://test", timeout=30) as c:
        yield c


@pytest.fixture(scope="module")
def engines(tiny_store: Path) -> tuple[ClassifierEngine, TranslatorEngine]:
    entries = newest(store.scan(tiny_store))
    clf = load_classifier(entries["tiny-clf"], LoadOptions(threads=1))
    mt = load_translator(entries["tiny-mt"], LoadOptions(threads=1))
    assert isinstance(clf, ClassifierEngine) and isinstance(mt, TranslatorEngine)
    return clf, mt


def error_of(r: httpx.Response, status: int, kind: str, *fragments: str) -> str:
    assert r.status_code == status, r.text
    body = r.json()
    assert set(body) == {"error", "type"} and body["type"] == kind, body
    for f in fragments:
        assert f in body["error"], body
    return str(body["error"])


# -- the contract -----------------------------------------------------------------------------


async def test_predict_equals_the_engine_in_input_order(client: httpx.AsyncClient, engines: Any) -> None:
    clf, _ = engines
    texts = sentences(7, seed=3) + ["", "🙂 مرحبا \u202e\x07 tab\there"]
    r = await client.post("/predict", json={"texts": texts})
    assert r.status_code == 200, r.text
    body = r.json()
    assert body["model"] == "tiny-clf" and body["version"] == 1
    ref = clf.predict(texts)
    assert [p["label"] for p in body["predictions"]] == [p.label for p in ref]
    assert [p["label"] for p in body["predictions"][:7]] == [expected_label(t) for t in texts[:7]]
    assert len({p["label"] for p in body["predictions"][:7]}) > 1  # an order mix-up shows
    for got, want in zip(body["predictions"], ref, strict=True):
        assert got["score"] == pytest.approx(want.score, abs=1e-5)
        assert got["scores"] == pytest.approx(want.scores, abs=1e-5)
        assert set(got["scores"]) == {"negative", "neutral", "positive"}


async def test_a_service_with_its_batches_in_device_memory_answers_the_same(
    app: FastAPI, client: httpx.AsyncClient, tiny_store: Path
) -> None:
    """SERVE_DEVICE_BUFFERS=on on the CPU provider: the scheduler's batches live in ONNX Runtime
    values, kept by graphs (the CUDA layout), and a concurrent mix of decodings answers as the
    default host buffers do."""
    texts = sentences(6, seed=41)
    bodies = [
        {"texts": texts[:3], "beam_size": 4, "num_hypotheses": 2, "return_scores": True},
        {"texts": texts[3:], "decode": "greedy", "max_new_tokens": 12, "return_scores": True},
        {"texts": texts, "beam_size": 2, "length_penalty": 0.5, "return_scores": True},
    ]
    on_device = create_app(settings(tiny_store, device_buffers="on"))
    async with serving(on_device) as device:
        engine = state_of(on_device).models.models["tiny-mt"].task.engine  # type: ignore[union-attr]
        assert engine.rt.device_ops is not None
        replies = await asyncio.gather(*(device.post("/translate", json=b) for b in bodies))
    host = state_of(app).models.models["tiny-mt"].task.engine  # type: ignore[union-attr]
    assert host.rt.device_ops is None  # the default on CPU
    want = [await client.post("/translate", json=b) for b in bodies]
    for got, ref in zip(replies, want, strict=True):
        assert got.status_code == ref.status_code == 200, got.text
        assert got.json()["translations"] == ref.json()["translations"]


async def test_translate_equals_the_engine(client: httpx.AsyncClient, engines: Any) -> None:
    _, mt = engines
    texts = sentences(5, seed=3)
    for decode in (
        {"decode": "greedy", "max_new_tokens": 12},
        {"beam_size": 3, "num_hypotheses": 2, "length_penalty": 0.5, "return_scores": True},
    ):
        r = await client.post("/translate", json={"texts": texts, **decode})
        assert r.status_code == 200, r.text
        body = r.json()
        assert body["model"] == "tiny-mt" and body["version"] == 1
        params = DecodeParams(
            beam_size=int(decode.get("beam_size", 1)),
            max_new_tokens=int(decode.get("max_new_tokens", 24)),
            length_penalty=float(decode.get("length_penalty", 1.0)),
            num_hypotheses=int(decode.get("num_hypotheses", 1)),
        )
        ref = mt.translate(texts, params)
        assert [t["text"] for t in body["translations"]] == [expected_translation(t) for t in texts]
        for got, want in zip(body["translations"], ref, strict=True):
            assert got["text"] == want[0].text
            if decode.get("return_scores"):
                assert got["score"] == pytest.approx(want[0].score, abs=1e-5)
                assert [h["text"] for h in got["hypotheses"]] == [w.text for w in want]
            else:
                assert set(got) == {"text", "finish_reason"}
            assert got["finish_reason"] == want[0].finish_reason


async def test_a_translation_cut_short_says_how_many_spans_it_appended(client: httpx.AsyncClient) -> None:
    """Spans are never lost: cut at its limit, the translation gets its missing spans at the end and
    `spans_appended` counts them (in the API document too); whole, the field is absent."""
    text = "The cat 5 sees http://example.org a dog."
    r = await client.post("/translate", json={"texts": [text, text], "decode": "greedy", "max_new_tokens": 1})
    assert r.status_code == 200, r.text
    cut = r.json()["translations"][0]
    assert cut["finish_reason"] == "length" and cut["spans_appended"] >= 1
    assert cut["text"].count("http://example.org") == 1 and "5" in cut["text"]
    whole = (await client.post("/translate", json={"texts": [text]})).json()["translations"][0]
    assert whole["text"] == expected_translation(text) and "spans_appended" not in whole
    doc = (await client.get("/openapi.json")).json()
    assert "spans_appended" in doc["components"]["schemas"]["Translation"]["properties"]


async def test_beam_size_one_is_exactly_greedy(client: httpx.AsyncClient) -> None:
    texts = sentences(6, seed=33)
    a = await client.post("/translate", json={"texts": texts, "beam_size": 1, "return_scores": True})
    b = await client.post("/translate", json={"texts": texts, "decode": "greedy", "return_scores": True})
    assert a.status_code == b.status_code == 200
    assert a.json()["translations"] == b.json()["translations"]


async def test_mixed_decode_requests_batch_correctly(client: httpx.AsyncClient, engines: Any) -> None:
    _, mt = engines
    texts = sentences(12, seed=3)
    variants = [{"decode": "greedy"}, {"beam_size": 2}, {"beam_size": 4, "max_new_tokens": 5}]
    calls = [client.post("/translate", json={"texts": [t], **variants[i % 3]}) for i, t in enumerate(texts)]
    responses = await asyncio.gather(*calls)
    for i, (t, r) in enumerate(zip(texts, responses, strict=True)):
        v = variants[i % 3]
        params = DecodeParams(v.get("beam_size", 1), v.get("max_new_tokens", 24))
        assert r.status_code == 200 and r.json()["translations"][0]["text"] == mt.translate([t], params)[0][0].text
        if "max_new_tokens" not in v:  # cut at 5 tokens, the others are whole
            assert r.json()["translations"][0]["text"] == expected_translation(t)


async def test_each_sampled_sentence_draws_from_its_own_seed(
    client: httpx.AsyncClient, monkeypatch: pytest.MonkeyPatch
) -> None:
    """A request's sentences share one set of decoding parameters, except that sampling gives each
    sentence its own seed (the request's seed and the sentence's place)."""
    from service.tasks.options import sentence_seed

    seen: list[DecodeParams] = []
    search = TranslatorEngine.search

    def spy(self: TranslatorEngine, params: DecodeParams, *args: Any, **kw: Any) -> Any:
        seen.append(params)
        return search(self, params, *args, **kw)

    monkeypatch.setattr(TranslatorEngine, "search", spy)
    texts = ["The red cat. The blue dog. A dog runs."]
    r = await client.post("/translate", json={"texts": texts, "decode": "sample", "seed": 7})
    assert r.status_code == 200, r.text
    assert [p.seed for p in seen] == [sentence_seed(7, k) for k in range(3)] and len(set(seen)) == 3
    seen.clear()
    assert (await client.post("/translate", json={"texts": texts, "beam_size": 2})).status_code == 200
    assert len(seen) == 3 and len(set(seen)) == 1 and seen[0].seed == 0


async def test_concurrent_requests_share_batches(app: FastAPI, client: httpx.AsyncClient) -> None:
    batcher = state_of(app).models.models["tiny-clf"].task.batcher  # type: ignore[union-attr]
    assert batcher is not None
    before = batcher.batches
    texts = sentences(16, seed=35)
    responses = await asyncio.gather(*(client.post("/predict", json={"texts": [t]}) for t in texts))
    assert all(r.status_code == 200 for r in responses)
    assert batcher.batches - before < 16
    metrics = (await client.get("/metrics")).text
    count = _sample(metrics, 'inference_batch_size_count{model="tiny-clf"}')
    total = _sample(metrics, 'inference_batch_size_sum{model="tiny-clf"}')
    assert total / count > 1


def _sample(text: str, name: str) -> float:
    for line in text.splitlines():
        if line.startswith(name + " "):
            return float(line.split()[-1])
    raise AssertionError(f"{name} not in metrics")


async def test_models_health_and_metrics(client: httpx.AsyncClient) -> None:
    assert (await client.get("/healthz")).json() == {"status": "ok"}
    ready = await client.get("/readyz")
    assert ready.status_code == 200 and ready.json()["models"] == ["tiny-clf", "tiny-mt"]
    models = {m["name"]: m for m in (await client.get("/v1/models")).json()["data"]}
    assert models["tiny-clf"]["labels"] == ["negative", "neutral", "positive"]
    assert models["tiny-clf"]["task"] == "classification" and models["tiny-clf"]["status"] == "ready"
    assert models["tiny-mt"]["max_source_tokens"] == 23 and models["tiny-mt"]["max_new_tokens"] == 24
    await client.post("/translate", json={"texts": ["The cat."]})
    r = await client.get("/metrics")
    assert r.status_code == 200 and r.headers["content-type"].startswith("text/plain")
    for name in (
        'inference_requests_total{endpoint="/translate",model="tiny-mt",status="200"}',
        'inference_request_duration_seconds_bucket{endpoint="/predict",le="0.001",model="tiny-clf"}',
        'inference_queue_wait_seconds_count{model="tiny-mt"}',
        'inference_batch_size_count{model="tiny-mt"}',
        'inference_compute_seconds_count{model="tiny-mt",stage="encode"}',
        'inference_compute_seconds_count{model="tiny-mt",stage="decode"}',
        'inference_compute_seconds_count{model="tiny-clf",stage="classify"}',
        'inference_queue_depth{model="tiny-mt"}',
        'inference_generated_tokens_total{model="tiny-mt"}',
    ):
        assert name in r.text, name


async def test_request_id_is_honoured_or_generated(client: httpx.AsyncClient) -> None:
    r = await client.get("/healthz", headers={"X-Request-ID": "abc-123"})
    assert r.headers["x-request-id"] == "abc-123"
    r = await client.post("/predict", json={"texts": []}, headers={"X-Request-ID": "bad id\twith space"})
    assert r.status_code == 422 and len(r.headers["x-request-id"]) == 32


# -- errors -----------------------------------------------------------------------------------


async def test_invalid_fields_name_the_field_and_range(client: httpx.AsyncClient) -> None:
    t = ["The cat."]
    error_of(
        await client.post("/translate", json={"texts": t, "beam_size": 9}), 422, "invalid_input", "beam_size", "1 to 8"
    )
    error_of(
        await client.post("/translate", json={"texts": t, "beam_size": 2, "num_hypotheses": 3}),
        422,
        "invalid_input",
        "num_hypotheses",
    )
    error_of(
        await client.post("/translate", json={"texts": t, "max_new_tokens": 25}),
        422,
        "invalid_input",
        "max_new_tokens",
        "24",
    )
    error_of(await client.post("/translate", json={"texts": t, "max_new_tokens": 0}), 422, "invalid_input", "1 to 256")
    error_of(
        await client.post("/translate", json={"texts": t, "length_penalty": 2.5}),
        422,
        "invalid_input",
        "length_penalty",
    )
    error_of(await client.post("/translate", json={"texts": t, "decode": "nucleus"}), 422, "invalid_input", "decode")
    for field, bad in (
        ("temperature", 0),
        ("top_p", 0),
        ("top_p", 1.5),
        ("top_k", -1),
        ("no_repeat_ngram_size", -1),
        ("repetition_penalty", 0),
        ("seed", -1),
        ("timeout_ms", 0),
    ):
        r = await client.post("/translate", json={"texts": t, "decode": "sample", field: bad})
        error_of(r, 422, "invalid_input", field)
    error_of(
        await client.post("/translate", json={"texts": t, "decode": "sample", "beam_size": 2}), 422, "invalid_input"
    )
    error_of(
        await client.post("/translate", json={"texts": t, "decode": "greedy", "beam_size": 3}),
        422,
        "invalid_input",
        "greedy",
    )
    error_of(await client.post("/translate", json={"texts": t, "beam_size": "4"}), 422, "invalid_input", "beam_size")
    error_of(await client.post("/predict", json={"texts": []}), 422, "invalid_input", "texts")
    error_of(await client.post("/predict", json={"texts": [1]}), 422, "invalid_input", "texts[0]")
    error_of(await client.post("/predict", json={"texts": t, "beam": 1}), 422, "invalid_input", "beam")
    error_of(await client.post("/predict", json={"texts": t, "model": "tiny-mt"}), 422, "invalid_input", "translation")
    error_of(await client.post("/predict", json=[1, 2]), 422, "invalid_input", "JSON object")


async def test_limits_say_the_limit(client: httpx.AsyncClient) -> None:
    error_of(await client.post("/translate", json={"texts": ["cat " * 40]}), 413, "input_too_long", "at most 23")
    # what the document states (characters, texts) is a 422 as any field out of range; tokens 413
    error_of(await client.post("/predict", json={"texts": ["x" * 2001]}), 422, "invalid_input", "2000")
    error_of(await client.post("/predict", json={"texts": ["a"] * 65}), 422, "invalid_input", "64")
    big = json.dumps({"texts": ["a" * 1000] * 1100}).encode()
    error_of(
        await client.post("/predict", content=big, headers={"content-type": "application/json"}),
        413,
        "payload_too_large",
        "1048576",
    )
    # a Content-Length that lies, and no Content-Length at all (chunked): the stream is counted

    async def chunks() -> AsyncIterator[bytes]:
        for i in range(0, len(big), 65536):
            yield big[i : i + 65536]

    error_of(
        await client.post("/predict", content=chunks(), headers={"content-type": "application/json"}),
        413,
        "payload_too_large",
    )
    lying = {"content-type": "application/json", "content-length": "10"}
    error_of(await client.post("/predict", content=big, headers=lying), 413, "payload_too_large")


async def test_bad_requests_are_4xx_and_the_service_keeps_serving(client: httpx.AsyncClient) -> None:
    post = client.post
    error_of(
        await post("/predict", content=b'{"texts": ["a"', headers={"content-type": "application/json"}),
        400,
        "invalid_json",
    )
    error_of(
        await post("/predict", content=b'{"texts": ["\xff"]}', headers={"content-type": "application/json"}),
        400,
        "bad_request",
    )
    error_of(
        await post("/predict", content=b"texts=a", headers={"content-type": "text/plain"}),
        415,
        "unsupported_media_type",
    )
    error_of(await post("/predict", content=b""), 422, "invalid_input")  # no Content-Type: read as JSON
    error_of(await post("/predict", content=b"", headers={"content-type": "application/json"}), 422, "invalid_input")
    nan = b'{"texts": ["a"], "length_penalty": NaN}'
    error_of(
        await post("/translate", content=nan, headers={"content-type": "application/json"}),
        422,
        "invalid_input",
        "length_penalty",
    )
    inf = b'{"texts": ["a"], "beam_size": Infinity}'
    error_of(await post("/translate", content=inf, headers={"content-type": "application/json"}), 422, "invalid_input")
    surrogate = b'{"texts": ["ok", "bad \\ud800 text"]}'
    error_of(
        await post("/predict", content=surrogate, headers={"content-type": "application/json"}),
        422,
        "invalid_input",
        "texts[1]",
    )
    error_of(await post("/predict", json={"texts": ["a"], "model": "nope"}), 404, "model_not_found", "no model of")
    error_of(await client.get("/no/such/path"), 404, "not_found")
    error_of(await client.get("/predict"), 405, "method_not_allowed")
    assert (await post("/predict", json={"texts": ["still fine"]})).status_code == 200


# -- Open Inference Protocol v2 ------------------------------------------------------------------


async def test_oip_metadata_and_health(client: httpx.AsyncClient) -> None:
    assert (await client.get("/v2")).json()["name"] == "transformer-serve"
    assert (await client.get("/v2/health/live")).json() == {"live": True}
    assert (await client.get("/v2/health/ready")).json() == {"ready": True}
    assert (await client.get("/v2/models/tiny-mt/ready")).json() == {"name": "tiny-mt", "ready": True}
    meta = (await client.get("/v2/models/tiny-clf")).json()
    assert meta["versions"] == ["1"] and meta["inputs"] == [{"name": "text", "datatype": "BYTES", "shape": [-1]}]
    assert [o["name"] for o in meta["outputs"]] == ["label", "probabilities"] and meta["outputs"][1]["shape"] == [-1, 3]
    r = await client.get("/v2/models/nope")
    assert r.status_code == 404 and set(r.json()) == {"error"}


async def test_oip_infer_shapes_and_values(client: httpx.AsyncClient, engines: Any) -> None:
    clf, mt = engines
    texts = sentences(3, seed=36)
    req = {"id": "r1", "inputs": [{"name": "text", "datatype": "BYTES", "shape": [3], "data": texts}]}
    r = await client.post("/v2/models/tiny-clf/infer", json=req)
    assert r.status_code == 200, r.text
    body = r.json()
    assert body["model_name"] == "tiny-clf" and body["model_version"] == "1" and body["id"] == "r1"
    out = {o["name"]: o for o in body["outputs"]}
    assert out["label"]["datatype"] == "BYTES" and out["label"]["shape"] == [3]
    assert out["probabilities"]["datatype"] == "FP32" and out["probabilities"]["shape"] == [3, 3]
    probs = np.array(out["probabilities"]["data"]).reshape(3, 3)
    ref = clf.classify_ids(clf.encode(texts))
    assert np.abs(probs - ref).max() < 1e-5
    assert out["label"]["data"] == [clf.labels[i] for i in ref.argmax(1)]

    req = {
        "inputs": [{"name": "text", "datatype": "BYTES", "shape": [3, 1], "data": [[t] for t in texts]}],
        "parameters": {"beam_size": 2, "max_new_tokens": 8, "content_type": "str"},
    }
    r = await client.post("/v2/models/tiny-mt/infer", json=req)
    assert r.status_code == 200, r.text
    (tr,) = r.json()["outputs"]
    assert tr["name"] == "translation" and tr["datatype"] == "BYTES" and tr["shape"] == [3]
    assert tr["data"] == [h[0].text for h in mt.translate(texts, DecodeParams(beam_size=2, max_new_tokens=8))]


async def test_oip_errors_are_protocol_shaped(client: httpx.AsyncClient) -> None:
    def tensor(**kw: Any) -> dict[str, Any]:
        return {"inputs": [{"name": "text", "datatype": "BYTES", "shape": [1], "data": ["a"]} | kw]}

    cases = [
        ("/v2/models/tiny-clf/infer", tensor(name="input"), 422, "text"),
        ("/v2/models/tiny-clf/infer", tensor(datatype="FP32"), 422, "BYTES"),
        ("/v2/models/tiny-clf/infer", tensor(shape=[2]), 422, "shape"),
        ("/v2/models/tiny-clf/infer", tensor(data=[1]), 422, "strings"),
        ("/v2/models/tiny-clf/infer", {"inputs": []}, 422, "inputs"),
        ("/v2/models/tiny-mt/infer", tensor() | {"parameters": {"beam_size": 99}}, 422, "parameters.beam_size"),
        ("/v2/models/tiny-clf/infer", tensor() | {"outputs": [{"name": "nope"}]}, 422, "outputs: this model has only"),
        ("/v2/models/nope/infer", tensor(), 404, "no model of that name"),
    ]
    for path, body, status, fragment in cases:
        r = await client.post(path, json=body)
        assert r.status_code == status, (body, r.text)
        assert set(r.json()) == {"error"} and fragment in r.json()["error"], r.text
    r = await client.post("/v2/models/tiny-clf/infer", content=b"{", headers={"content-type": "application/json"})
    assert r.status_code == 400 and set(r.json()) == {"error"}


async def test_oip_zero_size_batch_is_answered_without_model_work(client: httpx.AsyncClient) -> None:
    """`shape: [0]` with no data is a valid tensor: each output with its batch axis 0 and no data
    (the classifier's own path would fail on no rows: a 200 shows nothing was run)."""
    empty = {"inputs": [{"name": "text", "datatype": "BYTES", "shape": [0], "data": []}]}
    r = await client.post("/v2/models/tiny-clf/infer", json=empty)
    assert r.status_code == 200, r.text
    got = [(o["name"], o["datatype"], o["shape"], o["data"]) for o in r.json()["outputs"]]
    assert got == [("label", "BYTES", [0], []), ("probabilities", "FP32", [0, 3], [])]
    r = await client.post("/v2/models/tiny-mt/versions/1/infer", json=empty | {"id": "none"})
    assert r.status_code == 200 and r.json()["outputs"] == [
        {"name": "translation", "datatype": "BYTES", "shape": [0], "data": []}
    ], r.text
    assert r.json()["id"] == "none"
    r = await client.post("/v2/models/tiny-mt/infer", json=empty | {"parameters": {"beam_size": 99}})
    assert r.status_code == 422 and "parameters.beam_size" in r.json()["error"]  # checked all the same
    r = await client.post("/v2/models/tiny-clf/infer", json={"inputs": [empty["inputs"][0] | {"shape": [1]}]})
    assert r.status_code == 422 and "shape" in r.json()["error"]


async def test_libretranslate_document_lists_what_translate_takes(client: httpx.AsyncClient) -> None:
    """The translate body's languages are the served ones (`auto`: the one source of a target) and
    `q` has the text limits: every pair the document allows is translated, a code it does not
    allow is refused, and a non-string api_key is refused rather than ignored."""
    op = (await client.get("/openapi.json")).json()["paths"]["/libretranslate/translate"]["post"]
    body = op["requestBody"]["content"]["application/json"]["schema"]
    form = op["requestBody"]["content"]["application/x-www-form-urlencoded"]["schema"]
    assert form["properties"]["q"]["anyOf"][1]["items"].pop("minLength") == 1  # an empty form field is missing
    assert body == form
    props = body["properties"]
    assert props["source"]["enum"] == ["auto", "en"] and props["target"]["enum"] == ["de"] and "anyOf" not in body
    one, many = props["q"]["anyOf"]
    assert one["maxLength"] == many["items"]["maxLength"] == 2000 and many["maxItems"] == 64
    assert "400" in props["q"]["description"]
    for source in props["source"]["enum"]:
        r = await client.post("/libretranslate/translate", json={"q": "The red cat.", "source": source, "target": "de"})
        assert r.status_code == 200, (source, r.text)
    for pair in (("en", "fr"), ("xx", "de"), ("de", "de")):
        r = await client.post("/libretranslate/translate", json={"q": "a", "source": pair[0], "target": pair[1]})
        assert r.status_code == 400 and "not supported" in r.json()["error"], r.text
    r = await client.post("/libretranslate/translate", json={"q": "a", "source": "en", "target": "de", "api_key": 7})
    assert r.status_code == 400 and "api_key" in r.json()["error"], r.text


# -- queue, deadline, readiness ------------------------------------------------------------------


def block_worker(app: FastAPI) -> threading.Event:
    """Occupies the classifier's worker thread until the returned event is set."""
    gate = threading.Event()
    state_of(app).models.models["tiny-clf"].task.executor.submit(gate.wait, 60)  # type: ignore[union-attr]
    return gate


async def until(condition: Callable[[], bool], timeout: float = 60) -> None:
    """Waits for a condition, generously: a loaded machine is slow, not wrong."""
    loop = asyncio.get_running_loop()
    end = loop.time() + timeout
    while not condition():
        assert loop.time() < end, f"condition not met within {timeout:.0f} s"
        await asyncio.sleep(0.01)


async def test_queue_full_answers_429_with_retry_after(tiny_store: Path) -> None:
    application = create_app(settings(tiny_store, max_queue=4, max_texts=4, max_wait_ms=0))
    async with serving(application) as client:
        batcher = state_of(application).models.models["tiny-clf"].task.batcher  # type: ignore[union-attr]
        assert batcher is not None
        gate = block_worker(application)
        try:
            first = asyncio.ensure_future(client.post("/predict", json={"texts": ["a"]}))  # runs: blocked
            await until(lambda: batcher.in_flight == 1 and batcher.depth == 0)
            queued = asyncio.ensure_future(client.post("/predict", json={"texts": ["b", "c", "d"]}))
            await until(lambda: batcher.in_flight == 4)
            r = await client.post("/predict", json={"texts": ["e", "f"]})
            error_of(r, 429, "queue_full", "4")
            assert r.headers["retry-after"] == "1"
        finally:
            gate.set()
        assert (await first).status_code == 200 and (await queued).status_code == 200
        assert (await client.post("/predict", json={"texts": ["e", "f"]})).status_code == 200


async def test_deadline_answers_504_and_the_sentence_leaves(tiny_store: Path) -> None:
    application = create_app(settings(tiny_store, max_wait_ms=0))
    async with serving(application) as client:
        rt = state_of(application).models.models["tiny-mt"].task.engine.rt  # type: ignore[union-attr]
        gate, decode = threading.Event(), rt.decode

        def stuck(*args: Any, **kwargs: Any) -> Any:  # the scheduler thread hangs inside a step
            gate.wait(60)
            return decode(*args, **kwargs)

        rt.decode = stuck
        try:
            t0 = asyncio.get_running_loop().time()
            r = await client.post("/translate", json={"texts": ["The cat."], "timeout_ms": 300})
            error_of(r, 504, "deadline_exceeded", "deadline")
            assert asyncio.get_running_loop().time() - t0 < 30  # answered on time, not when the step ends (60 s)
        finally:
            gate.set()
            del rt.decode
        ok = await client.post("/translate", json={"texts": ["The dog."]})
        assert ok.status_code == 200
        metrics = (await client.get("/metrics")).text
        assert _sample(metrics, 'inference_cancelled_sentences_total{model="tiny-mt",reason="deadline"}') == 1


async def test_not_ready_until_warm_up_ends(tiny_store: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    gate = threading.Event()
    warmup = TranslatorEngine.warmup

    def slow_warmup(self: TranslatorEngine) -> None:
        gate.wait(60)
        warmup(self)

    monkeypatch.setattr(TranslatorEngine, "warmup", slow_warmup)
    application = create_app(settings(tiny_store))
    async with serving(application, ready=False) as client:
        try:
            assert (await client.get("/healthz")).status_code == 200
            error_of(await client.get("/readyz"), 503, "not_ready", "loading")
            assert (await client.get("/v2/health/ready")).status_code == 503
            error_of(await client.post("/translate", json={"texts": ["a"]}), 503, "not_ready")
        finally:
            gate.set()
        await wait_ready(client)
        assert (await client.post("/translate", json={"texts": ["a"]})).status_code == 200


async def test_corrupted_store_is_never_ready(tiny_store: Path, tmp_path: Path) -> None:
    store = corrupt_copy(tiny_store, tmp_path)
    application = create_app(settings(store))
    async with serving(application, ready=False) as client:
        await until(lambda: bool(state_of(application).models.loaded))
        error_of(await client.get("/readyz"), 503, "not_ready", "tiny-mt", "decoder.onnx", "sha256")
        models = {m["name"]: m for m in (await client.get("/v1/models")).json()["data"]}
        assert models["tiny-mt"]["status"] == "failed" and models["tiny-clf"]["status"] == "ready"
        error_of(await client.post("/translate", json={"texts": ["a"]}), 503, "not_ready", "failed")
        assert (await client.post("/predict", json={"texts": ["a"]})).status_code == 200


async def test_draining_fails_readiness_and_serves_until_closing(tiny_store: Path) -> None:
    application = create_app(settings(tiny_store))
    async with serving(application) as client:
        state_of(application).draining = True  # SIGTERM: load balancers stop routing here
        error_of(await client.get("/readyz"), 503, "shutting_down")
        assert (await client.get("/v2/health/ready")).status_code == 503
        assert (await client.post("/predict", json={"texts": ["a"]})).status_code == 200  # still served
        state_of(application).closing = True  # the grace is over: the listener closes
        error_of(await client.post("/predict", json={"texts": ["a"]}), 503, "shutting_down")
        assert (await client.get("/healthz")).status_code == 200


async def test_a_bug_is_a_logged_500_and_fails_only_its_batch(
    app: FastAPI, client: httpx.AsyncClient, monkeypatch: pytest.MonkeyPatch, caplog: pytest.LogCaptureFixture
) -> None:
    engine = state_of(app).models.models["tiny-clf"].task.engine  # type: ignore[union-attr]
    assert isinstance(engine, ClassifierEngine)

    def broken(seqs: Any, firsts: Any = None) -> Any:
        raise RuntimeError("simulated bug")

    monkeypatch.setattr(engine, "logits_ids", broken)
    r = await client.post("/predict", json={"texts": ["a"]}, headers={"X-Request-ID": "bug-1"})
    error_of(r, 500, "internal_error")
    assert "simulated" not in r.text and r.headers["x-request-id"] == "bug-1"
    assert any("simulated bug" in (rec.exc_text or "") or rec.exc_info for rec in caplog.records)
    assert (await client.post("/translate", json={"texts": ["a"]})).status_code == 200
    monkeypatch.undo()
    assert (await client.post("/predict", json={"texts": ["a"]})).status_code == 200


async def test_the_loaded_heap_is_frozen_and_a_retired_version_is_freed(tiny_store: Path, tmp_path: Path) -> None:
    """Loading ends with `gc.freeze` (full collections then skip the models); a version replaced
    by a newer one must still be freed, reference cycles included, once it has drained."""
    from tests.helpers import add_version

    store_dir = tmp_path / "store"
    shutil.copytree(tiny_store, store_dir)
    application = create_app(settings(store_dir))
    async with serving(application) as client:
        assert gc.get_freeze_count() > 0
        models = state_of(application).models
        task = models.models["tiny-mt"].task
        assert task is not None
        task.__dict__["cycle"] = [task]  # a reference cycle: only the collector frees it, never refcounts
        old = weakref.ref(task)
        del task
        add_version(store_dir / "tiny-mt", 1, 2)
        await models.refresh("tiny-mt")
        assert (await client.post("/translate", json={"texts": ["fine"]})).json()["version"] == 2
        while models._draining:
            await asyncio.sleep(0.01)
        await asyncio.sleep(0)  # the drain's done callbacks
        gc.collect()
        assert old() is None
    assert gc.get_freeze_count() == 0  # shut down: nothing stays hidden from the collector


async def test_versioned_oip_infer_is_counted_like_the_unversioned_route(client: httpx.AsyncClient) -> None:
    def served() -> float:
        return sum(
            float(line.rsplit(" ", 1)[1])
            for line in metrics_text.splitlines()
            if line.startswith('inference_requests_total{endpoint="/v2/models/{name}/infer",model="tiny-clf"')
        )

    body = {"inputs": [{"name": "text", "datatype": "BYTES", "shape": [1], "data": ["A cat."]}]}
    metrics_text = (await client.get("/metrics")).text
    before = served()
    assert (await client.post("/v2/models/tiny-clf/versions/1/infer", json=body)).status_code == 200
    assert (await client.post("/v2/models/tiny-clf/infer", json=body)).status_code == 200
    metrics_text = (await client.get("/metrics")).text
    assert served() == before + 2


async def test_decode_options_are_checked_against_the_model_even_without_sentences(client: httpx.AsyncClient) -> None:
    """An empty text has no sentence to decode; a max_new_tokens above the model's limit is
    still refused (schemathesis found it answered 200)."""
    limit = next(m for m in (await client.get("/v1/models")).json()["data"] if m["name"] == "tiny-mt")
    r = await client.post("/translate", json={"texts": [""], "max_new_tokens": limit["max_new_tokens"] + 1})
    assert r.status_code == 422 and "max_new_tokens" in r.json()["error"]


async def test_json_nested_deeper_than_the_parser_goes_is_a_400_everywhere(client: httpx.AsyncClient) -> None:
    """json.loads raises RecursionError on deep nesting; every JSON endpoint answers 400 for it."""
    deep = b"[" * 100_000 + b"]" * 100_000
    json_type = {"content-type": "application/json"}
    for path in ("/predict", "/translate"):
        error_of(await client.post(path, content=deep, headers=json_type), 400, "bad_request")
    r = await client.post("/v2/models/tiny-clf/infer", content=deep, headers=json_type)
    assert r.status_code == 400 and "invalid JSON" in r.json()["error"], r.text
    r = await client.post("/libretranslate/translate", content=deep, headers=json_type)
    assert r.status_code == 400 and "neither JSON nor form" in r.json()["error"], r.text
    assert (await client.post("/predict", json={"texts": ["still serving"]})).status_code == 200


async def test_document_states_what_each_model_and_route_refuses(client: httpx.AsyncClient) -> None:
    """OIP infer is listed per served model with that model's output names, a tensor's shape is
    [N] or [N, 1], LibreTranslate's file languages are the served ones and never empty, and the
    file routes name their formats: each refusal the schema states is answered."""
    doc = (await client.get("/openapi.json")).json()
    paths = doc["paths"]
    assert "/v2/models/{name}/infer" not in paths
    for model, outputs in (("tiny-mt", ["translation"]), ("tiny-clf", ["label", "probabilities"])):
        for path in (f"/v2/models/{model}/infer", f"/v2/models/{model}/versions/{{version}}/infer"):
            body = paths[path]["post"]["requestBody"]["content"]["application/json"]["schema"]
            assert body["properties"]["outputs"]["anyOf"][0]["items"]["properties"]["name"]["enum"] == outputs
    other = {"inputs": [{"name": "text", "datatype": "BYTES", "shape": [1], "data": ["a"]}], "outputs": [{"name": ""}]}
    assert (await client.post("/v2/models/tiny-mt/infer", json=other)).status_code == 422
    shape = doc["components"]["schemas"]["OipTensor"]["properties"]["shape"]
    assert shape["prefixItems"][1] == {"const": 1}
    lt = paths["/libretranslate/translate_file"]["post"]["requestBody"]["content"]["multipart/form-data"]
    props = lt["schema"]["properties"]
    assert props["source"]["enum"] == ["auto", "en"] and props["target"]["enum"] == ["de"]
    assert props["source"]["minLength"] == props["target"]["minLength"] == 1
    assert "text/x-gettext-translation" in lt["encoding"]["file"]["contentType"]
    assert ".po" in props["file"]["description"]
    files = {"file": ("a.po", b'msgid "a"\nmsgstr ""\n')}
    r = await client.post("/libretranslate/translate_file", files=files, data={"source": "", "target": "de"})
    assert r.status_code == 400 and r.json() == {"error": "Invalid request: missing source parameter"}
