"""The bundled default models: intact, validated at export, and decoding as the export verified."""

from __future__ import annotations

from pathlib import Path

import numpy as np
import pytest
import torch

from bench.engines import newest
from export.model import greedy_loop
from export.validate import TOLERANCES
from service import store
from service.contract import spans
from service.contract.graphs import pad
from service.engine.classifier import ClassifierEngine, load_classifier
from service.engine.decoding import DecodeParams
from service.engine.running import SOURCE_ALIGN
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
    return newest(store.scan(STORE))


def test_bundled_store_is_intact_and_validated(entries: dict[str, store.StoreEntry]) -> None:
    assert {"sentiment", "en-de"} <= set(entries)
    total = 0
    for entry in entries.values():
        assert entry.manifest is not None, entry.error  # every file's size and sha256 checked at load
        total += sum(f.size for f in entry.manifest.files.values())
    assert total < 80 * 1024 * 1024


def test_shipped_classifier_variants_agree(entries: dict[str, store.StoreEntry]) -> None:
    """Recomputed, not re-read from the manifest: each shipped variant was held to its tolerance
    against PyTorch fp32 at export, so two of them cannot differ by more than the two together."""
    entry = entries["sentiment"]
    assert entry.manifest is not None
    probs = {}
    for variant in entry.manifest.variants:
        engine = load_classifier(entry, LoadOptions(threads=1, variant=variant))
        assert isinstance(engine, ClassifierEngine)
        probs[variant] = engine.classify_ids(engine.encode(SENTENCES))
    (a, pa), (b, pb) = probs.items()
    assert np.abs(pa - pb).max() <= TOLERANCES[a] + TOLERANCES[b], (a, b)
    assert (pa.argmax(-1) == pb.argmax(-1)).all()


@pytest.mark.parametrize("variant", ["int8", "fp16"])
def test_shipped_translator_variants_are_batch_invariant(entries: dict[str, store.StoreEntry], variant: str) -> None:
    """The export's batch-invariance figure, recomputed: each sentence decodes to the same tokens
    alone as beside the others; the scores agree to fp16 precision (4e-6 apart seen for fp16)."""
    mt = load_translator(entries["en-de"], LoadOptions(threads=1, variant=variant))
    assert isinstance(mt, TranslatorEngine)
    seqs = mt.encode(SENTENCES[:5])
    params = DecodeParams(beam_size=1, max_new_tokens=48)
    together = [row[0] for row in mt.translate_ids(seqs, params)]
    alone = [mt.translate_ids([s], params)[0][0] for s in seqs]
    assert [h.tokens for h in together] == [h.tokens for h in alone]
    assert [h.score for h in together] == pytest.approx([h.score for h in alone], abs=1e-3)


def plain_greedy(engine: TranslatorEngine, seqs: list[list[int]], max_new: int) -> list[list[int]]:
    """The exporter's greedy loop over the engine's runtime: every row runs every step at the same
    position, its cache grown by concatenation (one spare masked slot), no row dropping."""
    rt = engine.rt
    ids, mask = pad(seqs)
    cross = rt.encode(ids, mask)
    n = len(seqs)
    cache = [np.zeros((n, rt.heads, 0, rt.d_k), np.float32) for _ in range(2 * rt.n_layers)]
    spare = np.zeros((n, rt.heads, 1, rt.d_k), np.float32)

    def step(prefix: torch.Tensor) -> np.ndarray:
        positions = np.full(n, prefix.shape[1] - 1, np.int64)
        tokens = prefix[:, -1].numpy().astype(np.int64)
        out = rt.decode(tokens, positions, mask, [np.concatenate([c, spare], axis=2) for c in cache], cross)
        cache[:] = [np.concatenate([c, kv], axis=2) for c, kv in zip(cache, out.new_kv, strict=True)]
        return out.logprobs

    return greedy_loop(step, n, engine.bos_id, engine.eos_id, max_new, torch.device("cpu"))


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


def test_a_sentence_beside_a_longer_one_scores_bit_for_bit_as_alone(entries: dict[str, store.StoreEntry]) -> None:
    """One answer per input, to the last bit: a test-split sentence of 19 tokens took scores
    -0.65800 alone and -0.65811 beside a 23-token one, while the running batch's source width was
    the longest row's (the sums over the source changed order at its unaligned end)."""
    mt = load_translator(entries["en-de"], LoadOptions(threads=1))
    text = "You must have defined the source range under Data - Define range as a database range."
    (sentence,) = mt.prepare([text]).sources
    (longer,) = mt.prepare(
        ["The file could not be saved because the disk is full, so please free some space and try again later."]
    ).sources
    assert len(sentence) % SOURCE_ALIGN and len(longer) > len(sentence)
    params = DecodeParams(beam_size=1, max_new_tokens=mt.max_new_tokens)
    alone = mt.translate_ids([sentence], params)[0]
    beside = mt.translate_ids([sentence, longer], params)[0]
    assert [(h.tokens, h.score) for h in beside] == [(h.tokens, h.score) for h in alone]


def test_each_protected_span_comes_back_exactly_once_placed_by_the_model(entries: dict[str, store.StoreEntry]) -> None:
    """Spans the bundled model would drop (greedy: "config.xml" came back appended at the end) are
    placed by the model itself, each exactly once, greedy, beam and as served (`decoding.Placeholders`)."""
    mt = load_translator(entries["en-de"], LoadOptions(threads=1))
    texts = [
        "Open C:\\Program Files\\App\\config.xml in a text editor.",
        "Run make test with --verbose, then open http://localhost:8080/status and read /var/log/app.log.",
        "Set $HOME, %s and {name} in settings.ini before version 2.3.1 ships on 2024-05-01.",
    ]
    ids = {mt.codec.tok.token_to_id(p) for p in spans.PLACEHOLDERS}
    prepared = mt.prepare(texts)
    limit = mt.max_new_tokens
    for params in (
        DecodeParams(beam_size=1, max_new_tokens=limit),
        DecodeParams(beam_size=4, max_new_tokens=limit),
        mt.default_params(),
    ):
        hyps = mt.run(prepared.sources, mt.searches(prepared, params))
        for source, row in zip(prepared.sources, hyps, strict=True):
            assert sorted(t for t in row[0].tokens if t in ids) == sorted(t for t in source if t in ids)
        for text, row in zip(texts, mt.translate(texts, params), strict=True):
            found = spans.find_spans(text, True, mt.codec.alphabet, verbatim=True, words=mt.codec.words)
            assert len(found) >= 2 and row[0].spans_appended == 0
            for span in {text[s.start : s.end] for s in found}:
                assert row[0].text.count(span) == text.count(span), (span, row[0].text)
