"""The classifier engine: texts -> class probabilities over ONNX Runtime, usable without the service.

engine = load_classifier(entry, LoadOptions(variant="int8"))
engine.predict(["great movie"])
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass

import numpy as np

from service.contract.graphs import SPECIAL_IDS, TOKEN_TYPE_IDS, pad
from service.contract.manifest import Manifest
from service.engine import runtime
from service.engine.lengths import length_groups
from service.engine.tokenizer import Encoded, TextCodec
from service.store import StoreEntry, read_pinned


@dataclass(frozen=True)
class Prediction:
    label: str
    score: float
    scores: dict[str, float]


def softmax(x: np.ndarray) -> np.ndarray:
    z = np.exp(x - x.max(axis=-1, keepdims=True))
    return z / z.sum(axis=-1, keepdims=True)


def probabilities(logits: np.ndarray) -> np.ndarray:
    """(N, C) logits -> probabilities as transformers' text-classification pipeline reads them:
    a softmax over the labels; a single logit (a scorer, a cross-encoder) through a sigmoid."""
    if logits.shape[-1] == 1:
        return 1.0 / (1.0 + np.exp(-logits))
    return softmax(logits)


CALL_TOKENS = 32  # a classifier run's fixed cost in padded tokens' worth (16 and 48 measured slower at 64 texts)


class ClassifierEngine:
    def __init__(
        self, manifest: Manifest, session: runtime.ort.InferenceSession, codec: TextCodec, variant: str
    ) -> None:
        self.manifest, self.session, self.codec, self.variant = manifest, session, codec, variant
        self.labels = list(manifest.labels)
        self.pad_id = manifest.special_tokens.get("pad_id", SPECIAL_IDS["pad_id"])
        graph = manifest.graphs.get("model")
        self.segments = graph is not None and any(i.name == TOKEN_TYPE_IDS for i in graph.inputs)

    @property
    def pairs(self) -> bool:
        """Whether the model takes pairs of texts (its manifest frames them)."""
        return self.codec.pair is not None

    def encode(self, texts: Sequence[str]) -> list[list[int]]:
        return self.codec.encode(texts)

    def encode_rows(self, texts: Sequence[str], truncate: bool = False) -> list[Encoded]:
        return self.codec.encode_rows(texts, truncate)

    def encode_pairs(self, pairs: Sequence[tuple[str, str]], truncate: bool = False) -> list[Encoded]:
        return self.codec.encode_pairs(pairs, truncate)

    def logits_ids(self, seqs: Sequence[Sequence[int]], firsts: Sequence[int] | None = None) -> np.ndarray:
        """(N, C) float64 logits for a batch of token id lists (`firsts`: each row's ids in segment
        0, the rest in segment 1; none: all), in runs of texts of similar length (`length_groups`):
        a run's time is its padded tokens'. Random test texts, the bundled int8 model, 2026-12-03:
        32 of them took 0.58x the time of one padded run on one thread, 0.73x on two (64: 0.46x,
        0.75x); a text's logits do not depend on its run's other texts."""
        out = np.empty((len(seqs), len(self.labels)), np.float64)
        for group in length_groups([len(s) for s in seqs], CALL_TOKENS):
            ids, mask = pad([seqs[i] for i in group], self.pad_id)
            types = None
            if self.segments:
                starts = np.array([firsts[i] if firsts is not None else len(seqs[i]) for i in group])[:, None]
                types = ((np.arange(ids.shape[1])[None, :] >= starts) & (mask == 1)).astype(np.int64)  # (B, T)
            out[group] = runtime.run_classifier(self.session, ids, mask, types).astype(np.float64)
        return out

    def classify_ids(self, seqs: Sequence[Sequence[int]], firsts: Sequence[int] | None = None) -> np.ndarray:
        """(N, C) probabilities (`probabilities`) of `logits_ids`."""
        return probabilities(self.logits_ids(seqs, firsts))

    def to_predictions(self, rows: Sequence[Sequence[float]]) -> list[Prediction]:
        """Per row of probabilities: the best label (the first among equals), its probability and every class's."""
        out = []
        for row in rows:
            best = max(range(len(row)), key=row.__getitem__)
            out.append(Prediction(self.labels[best], row[best], dict(zip(self.labels, row, strict=True))))
        return out

    def attention(self, text: str) -> tuple[list[str], np.ndarray]:
        """The text's tokens and its last layer's self-attention (H, S, S): rows attend to columns."""
        [ids] = self.encode([text])
        arr, mask = pad([ids], self.pad_id)
        types = np.zeros_like(arr) if self.segments else None
        return self.codec.tokens(ids), runtime.classifier_attention(self.session, arr, mask, types)[0]

    def predict(self, texts: Sequence[str]) -> list[Prediction]:
        return self.to_predictions(self.classify_ids(self.encode(texts)).tolist())

    def warmup(self) -> None:
        top = self.manifest.max_source_tokens  # a model with short positions cannot take longer rows
        for n, length in ((1, 8), (8, 24), (32, 48)):
            self.classify_ids([[5] * min(length, top)] * n)


def load_classifier(entry: StoreEntry, options: runtime.LoadOptions | None = None) -> ClassifierEngine:
    options = options or runtime.LoadOptions()
    m = entry.require_manifest()
    variant = runtime.choose_variant(m, options.variant)
    providers = runtime.resolve_providers(options.providers)
    threads = options.threads or runtime.cpu_quota()
    session = runtime.make_session(read_pinned(entry, m.variant_files(variant)["model"]), providers, threads)
    codec = TextCodec.of(m, read_pinned(entry, m.tokenizer))
    return ClassifierEngine(m, session, codec, variant)
