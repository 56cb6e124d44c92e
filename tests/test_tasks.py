"""A third task, defined and registered here, is served through /v1/models, its REST route and the
Open Inference Protocol without a change to any route module."""

from __future__ import annotations

import shutil
import time
from collections.abc import Iterator, Mapping
from pathlib import Path

import pytest
from fastapi.testclient import TestClient
from tokenizers import Tokenizer

from service.app import create_app
from service.contract.graphs import SPECIAL_IDS
from service.contract.manifest import MANIFEST, Manifest, file_entry
from service.engine.runtime import LoadOptions
from service.engine.tokenizer import TextCodec
from service.settings import Settings
from service.store import StoreEntry, read_pinned
from service.tasks import registry
from service.tasks.base import (
    OutputTensor,
    ResponseModel,
    StrictModel,
    Task,
    TaskContext,
    TensorSpec,
    TextsRequest,
    Work,
)


class CountOptions(StrictModel):
    pass


class CountRequest(TextsRequest, CountOptions):
    pass


class CountResponse(ResponseModel):
    model: str
    version: int
    counts: list[int]


class TokenCountTask(Task):
    """Answers the number of tokens of each text: no ONNX graph, just the version's tokenizer."""

    name = "token_count"
    rest_path = "/count"
    summary = "Count tokens"
    default_setting = "default_token_counter"  # no such setting: the only model of the task is the default
    Options = CountOptions
    Request = CountRequest
    Response = CountResponse

    def __init__(self, entry: StoreEntry, codec: TextCodec) -> None:
        super().__init__(entry, "fp32")
        self.codec = codec

    @classmethod
    def load(cls, entry: StoreEntry, options: LoadOptions, context: TaskContext) -> TokenCountTask:
        m = entry.require_manifest()
        return cls(entry, TextCodec(read_pinned(entry, m.tokenizer), m.max_source_tokens))

    def start(self) -> None:
        pass

    async def close(self, timeout: float) -> None:
        pass

    @property
    def in_flight(self) -> int:
        return 0

    def describe(self) -> Mapping[str, object]:
        return {"max_source_tokens": self.manifest.max_source_tokens}

    def outputs(self) -> list[TensorSpec]:
        return [TensorSpec("count", "INT64", [-1])]

    async def run(self, work: Work) -> list[int]:
        return [self.codec.count(t) for t in work.texts]

    def tensors(self, result: list[int]) -> list[OutputTensor]:
        return [OutputTensor("count", "INT64", [len(result)], result)]

    def rest_answer(self, body: TextsRequest, result: list[int]) -> CountResponse:
        return CountResponse(model=self.entry.name, version=self.entry.version, counts=result)


def counter_version(folder: Path, tokenizer: Tokenizer) -> None:
    folder.mkdir(parents=True)
    tokenizer.save(str(folder / "tokenizer.json"))
    manifest = Manifest(
        name=folder.parent.name,
        version=int(folder.name),
        task=TokenCountTask.name,
        created="2026-11-30T00:00:00+00:00",
        architecture={},
        opset=0,
        graphs={},
        variants={"fp32": {}},
        default_variant="fp32",
        output="none",
        tokenizer="tokenizer.json",
        special_tokens=SPECIAL_IDS,
        max_source_tokens=50,
        max_new_tokens=0,
        files={"tokenizer.json": file_entry(folder / "tokenizer.json")},
    )
    (folder / MANIFEST).write_text(manifest.model_dump_json())


@pytest.fixture
def client(tiny_store: Path, tiny_tokenizer: Tokenizer, tmp_path: Path) -> Iterator[TestClient]:
    store = tmp_path / "store"
    shutil.copytree(tiny_store / "tiny-clf", store / "tiny-clf")
    counter_version(store / "counter" / "1", tiny_tokenizer)
    registry.register(TokenCountTask)
    try:
        with TestClient(create_app(Settings(model_store=store, threads=1, model_thread_priority="nice"))) as c:
            end = time.monotonic() + 120  # generous: a busy machine is slow, not wrong
            while c.get("/readyz").status_code != 200:
                assert time.monotonic() < end
                time.sleep(0.02)
            yield c
    finally:
        registry.unregister(TokenCountTask.name)


def test_a_registered_task_is_served_everywhere(client: TestClient, tiny_tokenizer: Tokenizer) -> None:
    assert client.get("/readyz").status_code == 200
    models = {m["name"]: m for m in client.get("/v1/models").json()["data"]}
    assert models["counter"] == {
        "id": "counter",
        "object": "model",
        "created": models["counter"]["created"],
        "owned_by": "transformer-serve",
        "name": "counter",
        "version": 1,
        "task": "token_count",
        "status": "ready",
        "current": True,
        "variant": "fp32",
        "max_source_tokens": 50,
    }
    texts = ["The cat sees a dog.", "Open the window."]
    want = [len(tiny_tokenizer.encode(t).ids) for t in texts]
    r = client.post("/count", json={"texts": texts})
    assert r.status_code == 200 and r.json() == {"model": "counter", "version": 1, "counts": want}
    r = client.post("/count", json={"texts": texts, "model": "tiny-clf"})
    assert r.status_code == 422 and "classification" in r.json()["error"]
    meta = client.get("/v2/models/counter").json()
    assert meta["outputs"] == [{"name": "count", "datatype": "INT64", "shape": [-1]}]
    body = {"inputs": [{"name": "text", "datatype": "BYTES", "shape": [2], "data": texts}]}
    r = client.post("/v2/models/counter/infer", json=body)
    assert r.status_code == 200 and r.json()["outputs"] == [
        {"name": "count", "datatype": "INT64", "shape": [2], "data": want}
    ]
    assert "/count" in client.get("/openapi.json").json()["paths"]
    # the built-in tasks still answer beside it
    assert client.post("/predict", json={"texts": ["fine"]}).status_code == 200


def test_an_unknown_task_fails_its_version_only(tiny_store: Path, tiny_tokenizer: Tokenizer, tmp_path: Path) -> None:
    store = tmp_path / "store"
    shutil.copytree(tiny_store / "tiny-clf", store / "tiny-clf")
    counter_version(store / "counter" / "1", tiny_tokenizer)  # token_count is not registered here
    with TestClient(create_app(Settings(model_store=store, threads=1, model_thread_priority="nice"))) as c:
        for _ in range(6000):
            models = {m["name"]: m for m in c.get("/v1/models").json()["data"]}
            if models.get("tiny-clf", {}).get("status") == "ready":
                break
            time.sleep(0.02)
        assert models["counter"]["status"] == "failed" and "unknown task" in models["counter"]["error"]
        assert c.get("/readyz").status_code == 503
        assert c.post("/predict", json={"texts": ["fine"]}).status_code == 200


def test_a_request_takes_the_models_decoding_defaults_for_what_it_leaves_out() -> None:
    from service.contract.manifest import Generation
    from service.tasks.translation import DecodeOptions

    model = Generation(beam_size=1, length_penalty=2.0, early_stopping="never", no_repeat_ngram_size=3)
    p = DecodeOptions().params(50, 0, model)
    assert (p.beam_size, p.length_penalty, p.early_stopping, p.no_repeat_ngram_size) == (1, 2.0, "never", 3)
    # asking for more hypotheses than the model's default beams widens them (the API document allows it)
    assert DecodeOptions(num_hypotheses=3).params(50, 0, model).beam_size == 3
    given = DecodeOptions(beam_size=2, length_penalty=0.5, no_repeat_ngram_size=0).params(50, 0, model)
    assert (given.beam_size, given.length_penalty, given.no_repeat_ngram_size) == (2, 0.5, 0)
