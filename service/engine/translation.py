"""Translation as a sequence-to-sequence plug-in (`service.engine.seq2seq.Preparation`): lines and
sentences split (`text.split`), protected spans masked, each sentence framed with its source
language's tokens and its translation started with the target language's; the sentences'
translations joined back into the text's layout, spans restored. Nothing else in the engine
knows sentences, spans or languages.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass, replace
from typing import Literal

from service.contract import spans
from service.contract.manifest import Framing, Manifest
from service.engine import languages, text
from service.engine.decoding import Hypothesis, Placeholders
from service.engine.seq2seq import Generated, Prepared, SourceOptions
from service.engine.tokenizer import TextCodec


@dataclass(frozen=True)
class Sentences(Prepared):
    """Texts as the sentences the model translates: one source per sentence, in text order."""

    layouts: list[text.Layout]


class Translation:
    """The translation plug-in of one model (its manifest's languages, its tokenizer)."""

    def __init__(self, manifest: Manifest, codec: TextCodec) -> None:
        self.manifest, self.codec = manifest, codec
        self.language = manifest.source_language or "en"
        # A model trained on masked text has one token per placeholder; an older one gets raw spans.
        self.protects_spans = codec.has_tokens(spans.PLACEHOLDERS)
        # Its placeholder ids: each sentence's output holds those of its source once each (`decoding.Placeholders`).
        ids = [codec.tok.token_to_id(p) for p in spans.PLACEHOLDERS] if self.protects_spans else []
        self.placeholder_ids = frozenset(i for i in ids if i is not None)
        self.verbatim = manifest.span_rules >= 2  # identifiers, code and names masked as in its training

    def languages(self) -> tuple[list[str], list[str]]:
        """The source and target languages this model translates between (codes as it names them)."""
        m = self.manifest
        sources = [k for k in m.sources if k] or [m.source_language or ""]
        targets = [k for k in m.targets if k] or [m.target_language or ""]
        return [s for s in sources if s], [t for t in targets if t]

    def source_framing(self, language: str | None) -> tuple[str, Framing | None]:
        """The language sentences are split by and the ids around a source, for a requested source language."""
        m = self.manifest
        if not [k for k in m.sources if k]:
            languages.check("source", language, [m.source_language] if m.source_language else [])
            return self.language, None
        code = languages.resolve("source", language or m.source_language, list(m.sources))
        return code.split("_")[0].split("-")[0], m.sources[code]

    def forced_prefix(self, language: str | None) -> tuple[int, ...]:
        """The tokens a translation into `language` starts with (a multilingual model's language token)."""
        m = self.manifest
        if not [k for k in m.targets if k]:
            languages.check("target", language, [m.target_language] if m.target_language else [])
            return tuple(m.targets.get("", ()))
        return tuple(m.targets[languages.resolve("target", language or m.target_language, list(m.targets))])

    def prepare(self, texts: Sequence[str], options: SourceOptions) -> Sentences:
        """Texts as sentences to translate (`split`), each translation started with the target
        language's tokens (a text too long is told before a language unknown)."""
        return replace(self.split(texts, options.source_language), forced=self.forced_prefix(options.target_language))

    def split(self, texts: Sequence[str], source_language: str | None = None) -> Sentences:
        """Texts as sentences: lines and sentences split, spans masked, ids encoded (no target yet:
        `forced` is empty)."""
        language, framing = self.source_framing(source_language)
        codec = self.codec
        layouts = [
            text.split(t, language, self.protects_spans, codec.alphabet, codec.words, self.verbatim) for t in texts
        ]
        owner = [i for i, layout in enumerate(layouts) for _ in layout.segments]
        names = [
            f"texts[{i}] sentence {j + 1}" for i, layout in enumerate(layouts) for j in range(len(layout.segments))
        ]
        sentences = [seg.text for layout in layouts for seg in layout.segments]
        sources = codec.encode(sentences, names, framing)
        return Sentences(sources, owner, (), layouts, placeholders=self.placeholders(sources))

    def placeholders(self, sources: Sequence[Sequence[int]]) -> list[Placeholders]:
        """Per masked source, the placeholders its translation must hold once each (none for a
        model without placeholder tokens: it gets raw spans)."""
        reserved = self.placeholder_ids
        if not reserved:
            return []
        return [Placeholders(tuple(dict.fromkeys(i for i in ids if i in reserved)), reserved) for ids in sources]

    def visible(self, prepared: Sentences, index: int, outputs: Sequence[str], partial: str) -> str:
        """The text's layout up to its first unfinished sentence, spans restored, then what is
        final of that sentence's translation so far (`spans.unmask_prefix`). A control's label
        shows nothing before it ends: its accelerator is put back on the whole text."""
        layout = prepared.layouts[index]
        if len(outputs) >= len(layout.segments):
            return text.join(layout, list(outputs))
        if layout.label is not None:
            return ""
        out = []
        for piece in layout.pieces:
            if isinstance(piece, str):
                out.append(piece)
            elif piece < len(outputs):
                out.append(spans.unmask(outputs[piece], layout.segments[piece].spans))
            else:
                out.append(spans.unmask_prefix(partial, layout.segments[piece].spans))
                break
        return "".join(out)

    def assemble(
        self, prepared: Sentences, hyps: Sequence[Sequence[Hypothesis]], length_penalty: float
    ) -> list[list[Generated]]:
        """Per text, its n-best translations: the k-th combines each sentence's k-th hypothesis (or
        its last, when a sentence has fewer); score = summed log-prob / summed length**penalty.
        Kept in that order, not re-sorted by the combined score: the first is every sentence's best,
        the answer without `num_hypotheses` (sorted, a combination of second-best sentences could
        score higher under a length penalty and change a multi-sentence text's top answer)."""
        per_text: list[list[Sequence[Hypothesis]]] = [[] for _ in prepared.layouts]
        for i, row in zip(prepared.owner, hyps, strict=True):
            per_text[i].append(row)
        out = []
        for layout, rows in zip(prepared.layouts, per_text, strict=True):
            n = max((len(r) for r in rows), default=1)
            ranked = []
            for k in range(n):
                chosen = [r[min(k, len(r) - 1)] for r in rows]
                logprob = sum(h.logprob for h in chosen)
                length = sum(len(h.tokens) + h.finished for h in chosen)
                score = logprob / length**length_penalty if length else logprob
                reason: Literal["eos", "length"] = "eos" if all(h.finished for h in chosen) else "length"
                outputs = [self.codec.decode(h.tokens) for h in chosen]
                appended = sum(spans.missing(o, seg.spans) for o, seg in zip(outputs, layout.segments, strict=True))
                ranked.append(Generated(text.join(layout, outputs), score, logprob, reason, appended))
            out.append(ranked)
        return out
