"""The sequence-to-sequence engine: encoder once per batch, then cached decoder steps, usable
without the service. It decodes sources (token ids, each with its own search); texts become
sources and outputs texts through a plug-in (`seq2seq.Preparation`): `translation` (lines,
sentences, spans, languages) or `whole_text` (text-to-text).

engine = load_translator(entry, LoadOptions(variant="int8"))
engine.translate(["Open file"], DecodeParams(beam_size=4))
engine.generate(engine.whole_text, ["Open file"], DecodeParams(beam_size=4))
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from dataclasses import dataclass
from typing import TypeVar

import numpy as np

from service.contract.graphs import IO_CONTRACT_VERSION, READABLE_IO_CONTRACTS, pad
from service.contract.manifest import Framing, Manifest, ManifestError
from service.engine import runtime
from service.engine.decoding import DecodeParams, Hypothesis, Placeholders, Search
from service.engine.running import LaneBatch, RunningBatch, ShardedBatch
from service.engine.seq2seq import Generated, P, Preparation, Prepared, SourceOptions, WholeText
from service.engine.tokenizer import TextCodec
from service.engine.translation import Sentences, Translation
from service.errors import InvalidInput
from service.store import StoreEntry, read_pinned

T = TypeVar("T")


@dataclass(frozen=True)
class AttentionMap:
    source_tokens: list[str]
    target_tokens: list[str]
    weights: np.ndarray  # (layers, heads, target, source)


class TranslatorEngine:
    """Texts in, hypotheses out, without a server: every sentence of a call joins one running
    batch (`RunningBatch`) and leaves it when done. The service's step scheduler drives the same
    batch from its own thread with sentences coming and going."""

    def __init__(
        self,
        manifest: Manifest,
        rt: runtime.TranslatorRuntime,
        codec: TextCodec,
        variant: str,
        narrow: runtime.TranslatorRuntime | None = None,
        shards: int = 1,
    ) -> None:
        self.manifest, self.rt, self.codec, self.variant = manifest, rt, codec, variant
        self.narrow, self.shards = narrow, shards  # one-thread decoder for sharded batches
        self._spare: list[RunningBatch[int] | ShardedBatch[int]] = []  # idle batches, buffers kept
        st = manifest.special_tokens
        self.pad_id, self.eos_id = st["pad_id"], st["eos_id"]
        self.bos_id = st.get("decoder_start_id", st["bos_id"])  # the first step's input
        self.max_new_tokens = manifest.max_new_tokens
        self.generation = manifest.generation
        # the plug-ins that turn its texts into sources and back (`seq2seq.Preparation`)
        self.translation = Translation(manifest, codec)
        self.whole_text = WholeText(codec, manifest.targets.get("", ()), manifest.prefix)
        self.verbatim = self.translation.verbatim

    def encode(self, texts: Sequence[str]) -> list[list[int]]:
        """Source ids of whole texts (no line or sentence splitting: see `prepare`)."""
        return self.codec.encode(texts)

    # -- the translation plug-in's, for callers that use the engine alone (benchmarks, tests) --------

    def languages(self) -> tuple[list[str], list[str]]:
        return self.translation.languages()

    def source_framing(self, language: str | None) -> tuple[str, Framing | None]:
        return self.translation.source_framing(language)

    def forced_prefix(self, language: str | None) -> tuple[int, ...]:
        return self.translation.forced_prefix(language)

    def prepare(self, texts: Sequence[str], source_language: str | None = None) -> Sentences:
        """Texts as sentences to translate: lines and sentences split, spans masked, ids encoded
        (`Translation.split`: the target language's tokens are `forced_prefix`'s)."""
        return self.translation.split(texts, source_language)

    def assemble(
        self, prepared: Sentences, hyps: Sequence[Sequence[Hypothesis]], length_penalty: float
    ) -> list[list[Generated]]:
        """Per text, its n-best translations (`Translation.assemble`)."""
        return self.translation.assemble(prepared, hyps, length_penalty)

    # -- sources in, hypotheses out --------------------------------------------------------------

    def default_params(self) -> DecodeParams:
        """What a request that sets nothing decodes with: the model's own generation defaults."""
        g = self.generation
        return DecodeParams(
            beam_size=g.beam_size,
            max_new_tokens=min(self.max_new_tokens, DecodeParams.max_new_tokens),
            length_penalty=g.length_penalty,
            no_repeat_ngram_size=g.no_repeat_ngram_size,
            early_stopping=g.early_stopping,
            min_new_tokens=g.min_new_tokens,
        )

    def search(
        self,
        params: DecodeParams,
        limit: int | None = None,
        forced: Sequence[int] = (),
        placeholders: Placeholders | None = None,
    ) -> Search:
        """A fresh search for one sentence of this model; `forced`: its first tokens (`forced_prefix`);
        `placeholders`: the tokens its output holds once each (`Prepared.placeholders_of`)."""
        if params.max_new_tokens > self.max_new_tokens:
            raise InvalidInput(f"max_new_tokens must be at most {self.max_new_tokens} for this model")
        eos = self.generation.forced_eos
        return Search(params, self.bos_id, self.eos_id, limit, forced=forced, forced_eos=eos, placeholders=placeholders)

    def searches(self, prepared: Prepared, params: DecodeParams) -> list[Search]:
        """A search per prepared source, all with `params` (`search`)."""
        return [
            self.search(params, forced=prepared.forced, placeholders=prepared.placeholders_of(k))
            for k in range(len(prepared.sources))
        ]

    def translate_ids(
        self,
        seqs: Sequence[Sequence[int]],
        params: DecodeParams | Sequence[DecodeParams],
        max_new_tokens: Sequence[int] | None = None,
        timer: Callable[[str, float], None] | None = None,
    ) -> list[list[Hypothesis]]:
        """Hypotheses per sentence (best first); `params` one for all or one per sentence.

        `timer(stage, seconds)`, when given, receives each "encode" and "decode" (step) wall time.
        """
        per = [params] * len(seqs) if isinstance(params, DecodeParams) else list(params)
        limits = list(max_new_tokens) if max_new_tokens is not None else [None] * len(seqs)
        return self.run(seqs, [self.search(p, n) for p, n in zip(per, limits, strict=True)], timer)

    def run(
        self,
        seqs: Sequence[Sequence[int]],
        searches: Sequence[Search],
        timer: Callable[[str, float], None] | None = None,
    ) -> list[list[Hypothesis]]:
        """Decodes prepared searches in one running batch until every one is done."""
        out: list[list[Hypothesis]] = [s.hypotheses() for s in searches]
        batch = self._spare.pop() if self._spare else self.new_batch()
        batch.set_timer(timer)
        live = [i for i, s in enumerate(searches) if not s.done]
        try:
            batch.join([seqs[i] for i in live], [searches[i] for i in live], live)
            while batch.blocks:
                for i, hyps in batch.step():
                    out[i] = hyps
        except BaseException:
            batch.drop(lambda _: False)
            raise
        finally:
            self._spare.append(batch)  # its buffers serve the next call (no regrowth)
        return out

    def new_batch(self, timer: Callable[[str, float], None] | None = None) -> RunningBatch[T] | ShardedBatch[T]:
        """An empty running batch: sharded over one-thread decoder calls when there are threads
        to shard over (`load_translator`), else one batch on all threads."""
        if self.narrow is not None and self.shards > 1:
            return ShardedBatch(self.narrow, self.rt, self.shards, self.pad_id, timer)
        return RunningBatch(self.rt, self.pad_id, timer)

    def new_lanes(
        self,
        route: Callable[[T], bool] | None = None,
        turn: Callable[[float, float], bool] | None = None,
        timer: Callable[[str, float], None] | None = None,
    ) -> LaneBatch[T]:
        """`new_batch` with an express batch beside it (`LaneBatch`), on the decoder that uses every
        thread: its steps are small, one sentence's latency is what they are for. Its owner names
        each sentence's lane and each step's, or gives `route` and `turn` to decide them."""
        return LaneBatch(self.new_batch(timer), RunningBatch(self.rt, self.pad_id, timer), route, turn)

    def translate(
        self,
        texts: Sequence[str],
        params: DecodeParams | None = None,
        source_language: str | None = None,
        target_language: str | None = None,
    ) -> list[list[Generated]]:
        """Texts in, n-best translations out, exactly as the service answers (same sentence layout)."""
        return self.generate(self.translation, texts, params, SourceOptions(source_language, target_language))

    def generate(
        self,
        preparation: Preparation[P],
        texts: Sequence[str],
        params: DecodeParams | None = None,
        options: SourceOptions | None = None,
    ) -> list[list[Generated]]:
        """Texts in, n-best outputs out through a plug-in (`translation`, `whole_text`), as the service answers."""
        params = params or self.default_params()
        prepared = preparation.prepare(texts, options or SourceOptions())
        searches = self.searches(prepared, params)
        return preparation.assemble(prepared, self.run(prepared.sources, searches), params.length_penalty)

    def attention(self, source: Sequence[int], hyp: Hypothesis) -> AttentionMap:
        """Cross-attention of one decoded sentence: the hypothesis is fed again, one cached step
        per token (EOS included when it ended so), and each step's weights over the source kept."""
        rt = self.rt
        ids, mask = pad([source], self.pad_id)
        cross = rt.encode(ids, mask)
        targets = [*hyp.tokens, self.eos_id] if hyp.finished else list(hyp.tokens)
        cache = [np.zeros((1, rt.heads, len(targets), rt.d_k), np.float32) for _ in range(2 * rt.n_layers)]
        weights: list[np.ndarray] = []
        for t, token in enumerate([self.bos_id, *targets[:-1]] if targets else []):
            out = rt.decode(np.array([token], np.int64), np.array([t], np.int64), mask, cache, cross, attention=True)
            for buf, new in zip(cache, out.new_kv, strict=True):
                buf[:, :, t] = new[:, :, 0]
            assert out.attention is not None
            weights.append(out.attention)
        stacked = np.concatenate(weights) if weights else np.zeros((0, rt.n_layers, rt.heads, len(source)))
        return AttentionMap(self.codec.tokens(source), self.codec.tokens(targets), np.transpose(stacked, (1, 2, 0, 3)))

    def warmup(self) -> None:
        top = self.manifest.max_source_tokens
        for n, length, beam in ((1, 8, 1), (4, 16, 4), (16, 24, 4), (32, 24, 1)):
            seqs = [[5] * min(length, top) + [self.eos_id]] * n
            self.translate_ids(seqs, DecodeParams(beam_size=beam, max_new_tokens=min(4, self.max_new_tokens)))
        # The limits the manifest promises, run once: a source as long as it allows, and a step at
        # the last position a translation reaches. Graphs that cannot (a position table shorter than
        # the manifest says) fail here, at load, not in a request.
        rt, f = self.rt, self.codec.framing
        ids, mask = pad([[*f.prefix, *[5] * top, *f.suffix]], self.pad_id)
        cross = rt.encode(ids, mask)
        last = max(0, self.max_new_tokens - 1)
        cache = [np.zeros((1, rt.heads, last + 1, rt.d_k), np.float32) for _ in range(2 * rt.n_layers)]
        rt.decode(np.array([self.bos_id], np.int64), np.array([last], np.int64), mask, cache, cross)


def load_translator(entry: StoreEntry, options: runtime.LoadOptions | None = None) -> TranslatorEngine:
    options = options or runtime.LoadOptions()
    m = entry.require_manifest()
    variant = runtime.choose_variant(m, options.variant)
    files = m.variant_files(variant)
    providers = runtime.resolve_providers(options.providers)
    threads = options.threads or runtime.cpu_quota()
    if m.io_contract not in READABLE_IO_CONTRACTS:
        raise ManifestError(
            f"{entry.folder}: exported for IO contract {m.io_contract}, this service needs {IO_CONTRACT_VERSION} "
            f"(the decoder writes its cache in place and reads each sentence's source once for all its beams); "
            f"re-export the checkpoint: python -m export.publish CHECKPOINT "
            f"--name {m.name} (a transformers checkpoint: python -m export.import_hf DIR --name {m.name})"
        )
    encoder = read_pinned(entry, files["encoder"])
    enc = runtime.make_session(encoder, providers, threads, spin=False)
    decoder = read_pinned(entry, files["decoder"])
    dec = runtime.make_session(decoder, providers, threads)
    n_layers = int(m.architecture["n_dec_layers"])
    eos_last = Framing(suffix=[m.special_tokens["eos_id"]])  # a source of a bundled export ends with EOS
    common = read_pinned(entry, m.common_words) if m.common_words else b""
    codec = TextCodec.of(m, read_pinned(entry, m.tokenizer), eos_last, common)
    rt = runtime.TranslatorRuntime(enc, dec, n_layers, options.device_buffers)
    narrow = None
    if threads > 1 and not runtime.uses_cuda(dec):  # CPU: shard large batches over one-thread calls
        narrow = runtime.TranslatorRuntime(
            runtime.make_session(encoder, providers, 1, arena=False),
            runtime.make_session(decoder, providers, 1, arena=False),
            n_layers,
        )
    return TranslatorEngine(m, rt, codec, variant, narrow, threads)
