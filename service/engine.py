"""The inference engine: classifier and translator over ONNX Runtime, usable without the HTTP service.

engine = load_engine(entry, LoadOptions(variant="int8"))
engine.predict(["great movie"])          # ClassifierEngine
engine.translate(["Open file"], params)  # TranslatorEngine
"""

from __future__ import annotations

import logging
import time
from collections.abc import Callable, Sequence
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass

import numpy as np

from service import runtime
from service.decoding import DecodeParams, Hypothesis, beam_search, greedy
from service.errors import InvalidInput
from service.manifest import Manifest, ManifestError
from service.registry import StoreEntry, read_pinned
from service.tokenizer import TextCodec

log = logging.getLogger(__name__)


@dataclass(frozen=True)
class LoadOptions:
    providers: tuple[str, ...] = ("cpu",)
    threads: int = 0  # 0: the CPU quota of the container
    variant: str | None = None  # None: the manifest's default variant


@dataclass(frozen=True)
class Prediction:
    label: str
    score: float
    scores: dict[str, float]


@dataclass(frozen=True)
class Translation:
    text: str
    score: float  # length-penalised sequence log-probability
    logprob: float


def pad(seqs: Sequence[Sequence[int]], pad_id: int = 0) -> tuple[np.ndarray, np.ndarray]:
    """Pads to the longest sequence of this batch, not to the model maximum."""
    n = max(len(s) for s in seqs)
    ids = np.full((len(seqs), n), pad_id, dtype=np.int64)
    mask = np.zeros((len(seqs), n), dtype=np.int64)
    for i, s in enumerate(seqs):
        ids[i, : len(s)] = s
        mask[i, : len(s)] = 1
    return ids, mask


def softmax(x: np.ndarray) -> np.ndarray:
    z = np.exp(x - x.max(axis=-1, keepdims=True))
    return z / z.sum(axis=-1, keepdims=True)


class ClassifierEngine:
    task = "classification"

    def __init__(
        self, manifest: Manifest, session: runtime.ort.InferenceSession, codec: TextCodec, variant: str
    ) -> None:
        self.manifest, self.session, self.codec, self.variant = manifest, session, codec, variant
        self.labels = list(manifest.labels)

    def encode(self, texts: Sequence[str]) -> list[list[int]]:
        return self.codec.encode(texts)

    def classify_ids(self, seqs: Sequence[Sequence[int]]) -> np.ndarray:
        """(N, C) probabilities for a batch of token id lists."""
        ids, mask = pad(seqs, self.manifest.special_tokens["pad_id"])
        return softmax(runtime.run_classifier(self.session, ids, mask).astype(np.float64))

    def to_predictions(self, probs: np.ndarray) -> list[Prediction]:
        out = []
        for row in probs:
            best = int(row.argmax())
            out.append(
                Prediction(
                    self.labels[best],
                    float(row[best]),
                    {lab: float(p) for lab, p in zip(self.labels, row, strict=True)},
                )
            )
        return out

    def predict(self, texts: Sequence[str]) -> list[Prediction]:
        return self.to_predictions(self.classify_ids(self.encode(texts)))

    def warmup(self) -> None:
        top = self.manifest.max_source_tokens  # a model with short positions cannot take longer rows
        for n, length in ((1, 8), (8, 24), (32, 48)):
            self.classify_ids([[5] * min(length, top)] * n)


# Decoder rows (sentences x beams) each shard must get: with fewer, splitting a batch costs more
# than it gains (bench/engine.py, 2 cores).
MIN_SHARD_ROWS = 4


class TranslatorEngine:
    """Encoder once per batch, then cached decoder steps; finished sentences leave early.

    With `shards` > 1 a batch is split into up to `shards` contiguous groups of sentences, each
    decoded on its own thread (ONNX Runtime releases the GIL; one session serves them all). On
    CPU the sessions then run one intra-op thread each: measured on 2 cores, whole-sentence
    parallelism beats ONNX Runtime's intra-op threads at every batch size, because a decoder
    step is ~160 small operators that two intra-op threads cannot share well (see load_engine).
    Sentences are independent, so the result is the one of a single batch.
    """

    task = "translation"

    def __init__(
        self, manifest: Manifest, rt: runtime.TranslatorRuntime, codec: TextCodec, variant: str, shards: int = 1
    ) -> None:
        self.manifest, self.rt, self.codec, self.variant = manifest, rt, codec, variant
        st = manifest.special_tokens
        self.pad_id, self.bos_id, self.eos_id = st["pad_id"], st["bos_id"], st["eos_id"]
        self.max_new_tokens = manifest.max_new_tokens
        self.shards = max(1, shards)
        self._pool = ThreadPoolExecutor(self.shards, thread_name_prefix="decode") if self.shards > 1 else None

    def encode(self, texts: Sequence[str]) -> list[list[int]]:
        return self.codec.encode(texts)

    def translate_ids(
        self,
        seqs: Sequence[Sequence[int]],
        params: DecodeParams,
        max_new_tokens: Sequence[int] | None = None,
        timer: Callable[[str, float], None] | None = None,
    ) -> list[list[Hypothesis]]:
        """Decodes a batch: one encoder run, then cached decoder steps; finished sentences leave early.

        `timer(stage, seconds)`, when given, receives the "encode" and "decode" wall times.
        """
        if params.max_new_tokens > self.max_new_tokens:
            raise InvalidInput(f"max_new_tokens must be at most {self.max_new_tokens} for this model")
        limits = list(max_new_tokens) if max_new_tokens is not None else [params.max_new_tokens] * len(seqs)
        limits = [min(m, params.max_new_tokens) for m in limits]
        t0 = time.perf_counter()
        n = min(self.shards, len(seqs), len(seqs) * params.beam_size // MIN_SHARD_ROWS)
        if n < 2 or self._pool is None:
            hyps, encode_s = self._decode(seqs, params, limits)
        else:
            groups = np.array_split(np.arange(len(seqs)), n)
            futures = [
                self._pool.submit(self._decode, [seqs[i] for i in g], params, [limits[i] for i in g]) for g in groups
            ]
            parts = [f.result() for f in futures]
            hyps = [h for part, _ in parts for h in part]
            encode_s = max(s for _, s in parts)
        if timer is not None:
            timer("encode", encode_s)
            timer("decode", time.perf_counter() - t0 - encode_s)
        return hyps

    def _decode(
        self, seqs: Sequence[Sequence[int]], params: DecodeParams, limits: list[int]
    ) -> tuple[list[list[Hypothesis]], float]:
        """One group of sentences: the hypotheses and the encoder's wall time."""
        ids, mask = pad(seqs, self.pad_id)
        t0 = time.perf_counter()
        state = self.rt.encode(ids, mask)
        encode_s = time.perf_counter() - t0
        if params.beam_size == 1:
            best = greedy(self.rt.step, state, self.bos_id, self.eos_id, limits, length_penalty=params.length_penalty)
            return [[h] for h in best], encode_s
        return beam_search(self.rt.step, state, self.bos_id, self.eos_id, params, limits), encode_s

    def to_translations(self, hyps: Sequence[Sequence[Hypothesis]]) -> list[list[Translation]]:
        return [[Translation(self.codec.decode(h.tokens), h.score, h.logprob) for h in row] for row in hyps]

    def translate(self, texts: Sequence[str], params: DecodeParams | None = None) -> list[list[Translation]]:
        return self.to_translations(self.translate_ids(self.encode(texts), params or DecodeParams()))

    def warmup(self) -> None:
        top = self.manifest.max_source_tokens - 1  # room for the EOS every source ends with
        for n, length, beam in ((1, 8, 1), (4, 16, 4), (16, 24, 4), (32, 24, 1)):
            seqs = [[5] * min(length, top) + [self.eos_id]] * n
            self.translate_ids(seqs, DecodeParams(beam_size=beam, max_new_tokens=min(4, self.max_new_tokens)))


Engine = ClassifierEngine | TranslatorEngine


def choose_variant(manifest: Manifest, requested: str | None) -> str:
    if requested and requested in manifest.variants:
        return requested
    if requested:
        log.warning(
            "%s/%s has no %s variant; serving %s", manifest.name, manifest.version, requested, manifest.default_variant
        )
    return manifest.default_variant


def load_engine(entry: StoreEntry, options: LoadOptions = LoadOptions()) -> Engine:
    if entry.manifest is None:
        raise ManifestError(entry.error or f"{entry.folder}: not loadable")
    m = entry.manifest
    variant = choose_variant(m, options.variant)
    files = m.variant_files(variant)
    providers = runtime.resolve_providers(options.providers)
    threads = options.threads or runtime.cpu_quota()
    tok = read_pinned(entry, m.tokenizer)
    if m.task == "classification":
        session = runtime.make_session(read_pinned(entry, files["model"]), providers, threads)
        return ClassifierEngine(m, session, TextCodec(tok, m.max_source_tokens), variant)
    # CPU: one intra-op thread per session and `threads` sentence shards (TranslatorEngine). Measured
    # on 2 cores (bench/engine.py), 2 intra-op threads decode slower than 1 at every batch size
    # (batch 1 greedy: 25.0 ms against 18.5 ms), while 2 shards of a 32-sentence batch run 1.5x
    # faster than 2 intra-op threads.
    shards = threads if providers == ["CPUExecutionProvider"] else 1
    session_threads = 1 if shards > 1 else threads
    enc = runtime.make_session(read_pinned(entry, files["encoder"]), providers, session_threads)
    dec = runtime.make_session(read_pinned(entry, files["decoder"]), providers, session_threads)
    n_layers = int(m.architecture["n_dec_layers"])
    codec = TextCodec(tok, m.max_source_tokens, eos_id=m.special_tokens["eos_id"])
    return TranslatorEngine(m, runtime.TranslatorRuntime(enc, dec, n_layers), codec, variant, shards)
