"""The bundled default models: intact, validated at export, and decoding as the export verified."""

from __future__ import annotations

from pathlib import Path

import numpy as np
import pytest

from service import registry
from service.decoding import DecodeParams
from service.engine import ClassifierEngine, LoadOptions, TranslatorEngine, load_engine, pad

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
def entries() -> dict[str, registry.StoreEntry]:
    return registry.newest(registry.scan(STORE))


def test_bundled_store_is_intact_and_validated(entries: dict[str, registry.StoreEntry]) -> None:
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
    """A loop with no row dropping or reordering: every row runs every step until all have ended."""
    rt = engine.rt
    ids, mask = pad(seqs)
    state = rt.encode(ids, mask)
    rows = np.arange(len(seqs))
    tok = np.full(len(seqs), engine.bos_id, np.int64)
    out: list[list[int]] = [[] for _ in seqs]
    done = np.zeros(len(seqs), bool)
    for _ in range(max_new):
        logp, state = rt.step(tok, state, rows)
        tok = logp.argmax(-1).astype(np.int64)
        for i, t in enumerate(tok):
            if not done[i]:
                if t == engine.eos_id:
                    done[i] = True
                else:
                    out[i].append(int(t))
        if done.all():
            break
    return out


def test_default_translator_engine_matches_the_plain_cached_loop(entries: dict[str, registry.StoreEntry]) -> None:
    engine = load_engine(entries["en-de"], LoadOptions(threads=2))
    assert isinstance(engine, TranslatorEngine)
    seqs = engine.encode(SENTENCES)
    got = engine.translate_ids(seqs, DecodeParams(beam_size=1, max_new_tokens=64))
    assert [list(h[0].tokens) for h in got] == plain_greedy(engine, seqs, 64)
    beam = engine.translate(SENTENCES, DecodeParams(beam_size=4, max_new_tokens=64))
    assert all(row[0].text.strip() for row in beam)


def test_default_classifier_reads_obvious_sentiment(entries: dict[str, registry.StoreEntry]) -> None:
    engine = load_engine(entries["sentiment"], LoadOptions(threads=2))
    assert isinstance(engine, ClassifierEngine)
    preds = engine.predict(
        ["This movie is wonderful, I loved every minute of it!", "Terrible service, I hate this airline so much."]
    )
    assert [p.label for p in preds] == ["positive", "negative"]
