"""The bundled default models: intact, validated at export, and decoding as the export verified."""

from __future__ import annotations

from pathlib import Path

import numpy as np
import pytest
import torch

from export.model import greedy_loop
from service import store
from service.contract.graphs import pad
from service.engine.classifier import ClassifierEngine, load_classifier
from service.engine.decoding import DecodeParams
from service.engine.runtime import LoadOptions
from service.engine.translator import TranslatorEngine, load_translator

STORE = Path(__file__).resolve().parent.parent / "model_store"
SENTENCES = [
    "Save the file.",
    "The window could not be opened.",
    "Show notifications",
    "I think he is right.",
    "Close all documents",
    "Delete the selected entries?",
    "She lives in a small house.",
    "Export as PDF",
]


@pytest.fixture(scope="module")
def entries() -> dict[str, store.StoreEntry]:
    return store.newest(store.scan(STORE))


def test_bundled_store_is_intact_and_validated(entries: dict[str, store.StoreEntry]) -> None:
    assert {"sentiment", "en-de"} <= set(entries)
    total = 0
    for entry in entries.values():
        assert entry.manifest is not None, entry.error
        m = entry.manifest.metrics
        assert m["fp32_max_abs_diff"] <= 1e-4
        total += sum(f.size for f in entry.manifest.files.values())
    mt = entries["en-de"].manifest
    assert mt is not None and mt.metrics["greedy_identical_rate"] == 1.0
    assert mt.metrics["greedy_parity_sentences"] >= 100
    assert total < 80 * 1024 * 1024


def plain_greedy(engine: TranslatorEngine, seqs: list[list[int]], max_new: int) -> list[list[int]]:
    """The exporter's greedy loop over the engine's runtime: every row runs every step, no row dropping."""
    ids, mask = pad(seqs)
    state = [engine.rt.encode(ids, mask)]
    rows = np.arange(len(seqs))

    def step(prefix: torch.Tensor) -> np.ndarray:
        logp, state[0] = engine.rt.step(prefix[:, -1].numpy(), state[0], rows)
        return logp

    return greedy_loop(step, len(seqs), engine.bos_id, engine.eos_id, max_new, torch.device("cpu"))


def test_default_translator_engine_matches_the_plain_cached_loop(entries: dict[str, store.StoreEntry]) -> None:
    engine = load_translator(entries["en-de"], LoadOptions(threads=2))
    assert isinstance(engine, TranslatorEngine)
    seqs = engine.encode(SENTENCES)
    got = engine.translate_ids(seqs, DecodeParams(beam_size=1, max_new_tokens=64))
    assert [list(h[0].tokens) for h in got] == plain_greedy(engine, seqs, 64)
    beam = engine.translate(SENTENCES, DecodeParams(beam_size=4, max_new_tokens=64))
    assert all(row[0].text.strip() for row in beam)


def test_default_classifier_reads_obvious_sentiment(entries: dict[str, store.StoreEntry]) -> None:
    engine = load_classifier(entries["sentiment"], LoadOptions(threads=2))
    assert isinstance(engine, ClassifierEngine)
    preds = engine.predict(
        ["This movie is wonderful, I loved every minute of it!", "Terrible service, I hate this airline so much."]
    )
    assert [p.label for p in preds] == ["positive", "negative"]
