"""Attention maps on request: shapes, rows summing to 1, and equal to PyTorch's (fp32)."""

from __future__ import annotations

import time
from collections.abc import Iterator
from pathlib import Path

import numpy as np
import pytest
import torch
from fastapi.testclient import TestClient
from tokenizers import Tokenizer

from export.model import Classifier, Translator, causal_bias, padding_bias
from service.app import create_app
from service.settings import Settings


@pytest.fixture(scope="module")
def client(tiny_store: Path) -> Iterator[TestClient]:
    with TestClient(create_app(Settings(model_store=tiny_store, threads=1, model_thread_priority="nice"))) as c:
        end = time.monotonic() + 120  # generous: a busy machine is slow, not wrong
        while c.get("/readyz").status_code != 200:
            assert time.monotonic() < end
            time.sleep(0.02)
        yield c


@torch.no_grad()
def torch_cross_attention(model: Translator, source: list[int], targets: list[int]) -> np.ndarray:
    """(layers, heads, target, source) from the full, uncached teacher-forced decoder."""
    src = torch.tensor([source])
    mask = torch.ones_like(src)
    cross = model.cross_kv(model.encode(src, mask))
    tgt = torch.tensor([[model.config.bos_id, *targets[:-1]]])
    x = model.embed(tgt)
    out = []
    for layer, layer_cross, past in zip(model.layers, cross, model.empty_past(1), strict=True):
        x, _, weights = layer(x, past, layer_cross, causal_bias(tgt.size(1), 0, x.device), padding_bias(mask))
        out.append(weights[0])
    return torch.stack(out).numpy()


@pytest.mark.parametrize("decode", [{"decode": "greedy"}, {"beam_size": 3}])
def test_translation_attention_equals_pytorch(
    client: TestClient, tiny_translator: Translator, tiny_tokenizer: Tokenizer, decode: dict[str, object]
) -> None:
    r = client.post("/translate", json={"texts": ["The cat sees a dog."], "return_attention": True, **decode})
    assert r.status_code == 200, r.text
    [tr] = r.json()["translations"]
    [m] = tr["attention"]
    weights = np.array(m["weights"])
    layers, heads = len(tiny_translator.layers), tiny_translator.config.n_heads
    assert weights.shape == (layers, heads, len(m["target_tokens"]), len(m["source_tokens"]))
    assert np.abs(weights.sum(-1) - 1).max() < 1e-3
    source = [tiny_tokenizer.token_to_id(t) for t in m["source_tokens"]]
    targets = [tiny_tokenizer.token_to_id(t) for t in m["target_tokens"]]
    assert np.abs(weights - torch_cross_attention(tiny_translator, source, targets)).max() < 1e-4


def test_classifier_attention_equals_pytorch(
    client: TestClient, tiny_classifier: Classifier, tiny_tokenizer: Tokenizer
) -> None:
    r = client.post("/predict", json={"texts": ["A small red dog runs."], "return_attention": True})
    assert r.status_code == 200, r.text
    att = r.json()["predictions"][0]["attention"]
    weights = np.array(att["weights"])
    assert weights.shape == (tiny_classifier.config.n_heads, len(att["tokens"]), len(att["tokens"]))
    assert np.abs(weights.sum(-1) - 1).max() < 1e-3
    seq = tiny_tokenizer.encode("A small red dog runs.").ids
    assert [tiny_tokenizer.id_to_token(i) for i in seq] == att["tokens"]
    with torch.no_grad():
        _, ref = tiny_classifier.with_attention(torch.tensor([seq]), torch.ones(1, len(seq), dtype=torch.long))
    assert np.abs(weights - ref[0].numpy()).max() < 1e-4


def test_attention_takes_one_text(client: TestClient) -> None:
    for path in ("/translate", "/predict"):
        r = client.post(path, json={"texts": ["a", "b"], "return_attention": True})
        assert r.status_code == 422 and "one text" in r.json()["error"]
    r = client.post("/translate", json={"texts": ["The cat."]})
    assert "attention" not in r.json()["translations"][0]
