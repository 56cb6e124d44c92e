"""Pairs of texts over HTTP (issue 67): `/predict` pairs, `/rerank` (TEI's shape) and
`/zero-shot-classification` (transformers' pipeline's numbers) on tiny random checkpoints imported
in the test (BERT and DeBERTa-v3 cross-encoders of one label, RoBERTa, BART and DeBERTa-v3 NLI
models), against transformers; bad input answered 4xx while other requests go on."""

from __future__ import annotations

import asyncio
import contextlib
import shutil
from collections.abc import AsyncIterator
from pathlib import Path

import httpx
import numpy as np
import pytest
import torch
import transformers

from export.import_hf import ImportOptions, import_checkpoint
from service.app import create_app
from service.settings import Settings
from tests.hf_checkpoints import build_classifier

pytestmark = [pytest.mark.families, pytest.mark.anyio]  # HF checkpoints against transformers: not `make test-fast`

NLI = {0: "contradiction", 1: "neutral", 2: "entailment"}
QUERY = "who jumps over the dog?"
DOCS = ["the quick brown fox jumps", "a cat sat on the mat", "", "dogs sleep near the river bank", "x y z"]
TEXTS = ["the fox jumps over the lazy dog", "numbers 12345 and 3.14"]
LABELS = ["animals", "maths", "the weather"]


@pytest.fixture
def anyio_backend() -> str:
    return "asyncio"


@pytest.fixture(scope="module")
def pair_store(
    tmp_path_factory: pytest.TempPathFactory, tiny_store: Path, bert, roberta, bart, deberta
) -> tuple[Path, dict[str, Path]]:
    """A store with cross-encoders (BERT `xenc`, DeBERTa-v3 `deberta-xenc`, cross-encoder/ms-marco-*'s
    and cross-encoder/nli-deberta-v3-*'s families), NLI models (RoBERTa `nli`, BART `bart-nli`, the
    class of bart-large-mnli, DeBERTa-v3 `deberta-nli`) and the bundled single-text `tiny-clf`."""
    root = tmp_path_factory.mktemp("pairs")
    store = root / "store"
    shutil.copytree(tiny_store / "tiny-clf", store / "tiny-clf")
    folders = {
        "xenc": build_classifier(bert, root / "xenc", {0: "relevance"}, seed=3),
        "nli": build_classifier(roberta, root / "nli", NLI, seed=4),
        "bart-nli": build_classifier(bart, root / "bart-nli", NLI, seed=5),
        "deberta-xenc": build_classifier(deberta, root / "deberta-xenc", {0: "relevance"}, seed=6),
        "deberta-nli": build_classifier(deberta, root / "deberta-nli", NLI, seed=7),
    }
    for name, folder in folders.items():
        import_checkpoint(folder, store, ImportOptions(name=name), log=lambda _: None)
    return store, folders


@contextlib.asynccontextmanager
async def serving(store: Path, **settings: object) -> AsyncIterator[httpx.AsyncClient]:
    app = create_app(
        Settings(model_store=store, threads=1, max_wait_ms=2, model_thread_priority="nice", **settings)  # type: ignore[arg-type]
    )
    async with app.router.lifespan_context(app):
        transport = httpx.ASGITransport(app=app)
        async with httpx.AsyncClient(transport=transport, base_url="http://test", timeout=60) as client:
            for _ in range(600):
                if (await client.get("/readyz")).status_code == 200:
                    break
                await asyncio.sleep(0.1)
            yield client


def reference(folder: Path, pairs: list[tuple[str, str]]) -> np.ndarray:
    """transformers' logits of a padded batch of pairs."""
    tok = transformers.AutoTokenizer.from_pretrained(folder)
    model = transformers.AutoModelForSequenceClassification.from_pretrained(folder).eval()
    enc = tok([a for a, _ in pairs], [b for _, b in pairs], padding=True, return_tensors="pt")
    with torch.no_grad():
        return model(**enc).logits.numpy().astype(np.float64)


@pytest.mark.parametrize("xenc", ["xenc", "deberta-xenc"])
async def test_predict_and_rerank_answer_as_transformers(pair_store, xenc: str) -> None:
    store, folders = pair_store
    logits = reference(folders[xenc], [(QUERY, d) for d in DOCS])[:, 0]
    sigmoid = 1 / (1 + np.exp(-logits))
    async with serving(store) as c:
        r = await c.post("/predict", json={"model": xenc, "pairs": [[QUERY, d] for d in DOCS]})
        assert r.status_code == 200, r.text
        got = [p["scores"]["relevance"] for p in r.json()["predictions"]]
        assert np.abs(np.array(got) - sigmoid).max() <= 1e-4

        r = await c.post("/rerank", json={"model": xenc, "query": QUERY, "texts": DOCS, "return_text": True})
        assert r.status_code == 200, r.text
        ranks = r.json()
        assert [x["index"] for x in ranks] == list(np.argsort(-sigmoid, kind="stable"))
        assert np.abs(np.array([x["score"] for x in ranks]) - np.sort(sigmoid)[::-1]).max() <= 1e-4
        assert [x["text"] for x in ranks] == [DOCS[x["index"]] for x in ranks]

        raw = (await c.post("/rerank", json={"model": xenc, "query": QUERY, "texts": DOCS, "raw_scores": True})).json()
        assert all("text" not in x for x in raw)
        assert np.abs(np.array([x["score"] for x in raw]) - np.sort(logits)[::-1]).max() <= 1e-4

        models = {m["name"]: m for m in (await c.get("/v1/models")).json()["data"]}
        assert models[xenc].get("pairs") is True and "pairs" not in models["tiny-clf"]


@pytest.mark.parametrize("multi_label", [False, True])
@pytest.mark.parametrize("model", ["nli", "bart-nli", "deberta-nli"])
async def test_zero_shot_matches_transformers_pipeline(pair_store, model: str, multi_label: bool) -> None:
    store, folders = pair_store
    pipe = transformers.pipeline(
        "zero-shot-classification",
        model=transformers.AutoModelForSequenceClassification.from_pretrained(folders[model]),
        tokenizer=transformers.AutoTokenizer.from_pretrained(folders[model]),
    )
    want = [pipe(text, candidate_labels=LABELS, multi_label=multi_label) for text in TEXTS]
    async with serving(store) as c:
        body = {"model": model, "texts": TEXTS, "candidate_labels": LABELS, "multi_label": multi_label}
        r = await c.post("/zero-shot-classification", json=body)
        assert r.status_code == 200, r.text
        answer = r.json()
        assert (answer["model"], answer["version"]) == (model, 1)
        for got, ref in zip(answer["results"], want, strict=True):
            assert got["labels"] == ref["labels"]
            assert np.abs(np.array(got["scores"]) - np.array(ref["scores"])).max() <= 1e-4
        one = await c.post("/zero-shot-classification", json=body | {"candidate_labels": ["animals"]})
        ref_one = pipe(TEXTS[0], candidate_labels=["animals"])
        assert abs(one.json()["results"][0]["scores"][0] - ref_one["scores"][0]) <= 1e-4


async def test_bad_pair_input_is_a_clear_4xx_and_others_go_on(pair_store) -> None:
    store, _ = pair_store
    zs = {"model": "nli", "texts": TEXTS, "candidate_labels": LABELS}
    async with serving(store) as c:
        cases = [
            ("/predict", {"model": "tiny-clf", "pairs": [["a", "b"]]}, 422, "takes single texts, not pairs"),
            ("/rerank", {"model": "tiny-clf", "query": "a", "texts": ["b"]}, 422, "takes single texts, not pairs"),
            ("/predict", {"model": "xenc", "texts": ["a"], "pairs": [["a", "b"]]}, 422, "either texts or pairs"),
            ("/predict", {"model": "xenc", "pairs": [["a"]]}, 422, "pairs"),
            ("/zero-shot-classification", zs | {"hypothesis_template": "no braces"}, 422, "hypothesis_template"),
            ("/zero-shot-classification", zs | {"hypothesis_template": "{} and {x}"}, 422, "one `{}`"),
            ("/zero-shot-classification", zs | {"candidate_labels": []}, 422, "candidate_labels"),
            ("/zero-shot-classification", zs | {"candidate_labels": [f"l{i}" for i in range(10_000)]}, 422, "64"),
            ("/zero-shot-classification", zs | {"model": "xenc"}, 422, "needs an NLI model"),
            ("/rerank", {"model": "xenc", "query": "a " * 200, "texts": ["b"]}, 413, "in a pair"),
        ]
        for path, body, status, fragment in cases:
            r = await c.post(path, json=body)
            assert r.status_code == status, (path, body, r.text)
            assert fragment in r.json()["error"], r.text
        long = {"model": "xenc", "query": "a " * 200, "texts": ["b"], "truncate": True}
        assert (await c.post("/rerank", json=long)).status_code == 200
        assert (await c.post("/predict", json={"model": "tiny-clf", "texts": ["fine"]})).status_code == 200


async def test_a_pair_counts_as_one_text_against_max_texts(pair_store) -> None:
    """One rule for every pair protocol: a pair is one text of SERVE_MAX_TEXTS (/predict pairs, a
    rerank's documents, OIP rows); zero-shot counts its texts (its texts x labels: SERVE_MAX_QUEUE)."""
    store, _ = pair_store
    rows = [["a b", "c d"], ["e f", "g h"]]

    def oip(n: int) -> dict[str, object]:
        return {
            "inputs": [
                {"name": "text", "shape": [n], "datatype": "BYTES", "data": [a for a, _ in rows * 2][:n]},
                {"name": "text_pair", "shape": [n], "datatype": "BYTES", "data": [b for _, b in rows * 2][:n]},
            ]
        }

    zs = {"model": "nli", "candidate_labels": LABELS}
    async with serving(store, max_texts=2) as c:
        within = [
            ("/predict", {"model": "xenc", "pairs": rows}),  # four texts, two pairs
            ("/rerank", {"model": "xenc", "query": "q", "texts": ["a", "b"]}),
            ("/v2/models/xenc/infer", oip(2)),
            ("/zero-shot-classification", zs | {"texts": TEXTS}),  # six pairs
        ]
        for path, body in within:
            r = await c.post(path, json=body)
            assert r.status_code == 200, (path, r.text)
        over = [
            ("/predict", {"model": "xenc", "pairs": [*rows, ["i", "j"]]}, "pairs has 3 items; at most 2"),
            ("/rerank", {"model": "xenc", "query": "q", "texts": ["a", "b", "c"]}, "texts has 3 items"),
            ("/v2/models/xenc/infer", oip(3), "has 3 items; at most 2"),
            ("/zero-shot-classification", zs | {"texts": [*TEXTS, "x"]}, "texts has 3 items"),
        ]
        for path, body, fragment in over:
            r = await c.post(path, json=body)
            assert r.status_code == 422 and fragment in r.json()["error"], (path, r.text)


async def test_the_api_document_describes_the_pair_bodies(pair_store) -> None:
    store, _ = pair_store
    async with serving(store) as c:
        doc = (await c.get("/openapi.json")).json()
    schemas = doc["components"]["schemas"]
    assert {"query", "texts", "raw_scores", "return_text", "truncate"} <= set(schemas["RerankRequest"]["properties"])
    assert schemas["ZeroShotRequest"]["properties"]["candidate_labels"]["maxItems"] == 64
    assert "pairs" in schemas["PredictRequest"]["properties"]
    assert "/rerank" in doc["paths"] and "/zero-shot-classification" in doc["paths"]


async def test_oip_infer_takes_a_second_bytes_input_text_pair(pair_store) -> None:
    store, folders = pair_store
    probs = reference(folders["nli"], [(t, "animals") for t in TEXTS])
    probs = np.exp(probs) / np.exp(probs).sum(axis=1, keepdims=True)

    def tensor(name: str, data: list[str]) -> dict[str, object]:
        return {"name": name, "shape": [len(data)], "datatype": "BYTES", "data": data}

    async with serving(store) as c:
        body = {"inputs": [tensor("text", TEXTS), tensor("text_pair", ["animals"] * len(TEXTS))]}
        r = await c.post("/v2/models/nli/infer", json=body)
        assert r.status_code == 200, r.text
        out = {o["name"]: o for o in r.json()["outputs"]}
        assert out["probabilities"]["shape"] == [2, 3]
        assert np.abs(np.array(out["probabilities"]["data"]).reshape(2, 3) - probs).max() <= 1e-4
        inputs = [i["name"] for i in (await c.get("/v2/models/nli")).json()["inputs"]]
        assert inputs == ["text", "text_pair"]
        assert [i["name"] for i in (await c.get("/v2/models/tiny-clf")).json()["inputs"]] == ["text"]
        bad = [
            ("nli", {"inputs": [tensor("text", TEXTS), tensor("text_pair", ["a"])]}, "holds 1 texts for the 2"),
            ("nli", {"inputs": [tensor("text", TEXTS), tensor("pair", ["a", "b"])]}, "inputs[1].name"),
            ("tiny-clf", {"inputs": [tensor("text", ["a"]), tensor("text_pair", ["b"])]}, "takes single texts"),
        ]
        for name, request, fragment in bad:
            r = await c.post(f"/v2/models/{name}/infer", json=request)
            assert r.status_code == 422 and fragment in r.json()["error"], r.text
