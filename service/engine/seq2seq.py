"""A sequence-to-sequence model's texts as sources and its outputs as texts again: a plug-in.

The engine and the step scheduler see sources only (token ids, each with its decode parameters)
and give back each source's hypotheses. What a source is, and how the outputs make a text, is a
`Preparation`'s: `prepare(texts, options)` gives the sources with what `assemble` needs to put
the texts together again (`Prepared`); `assemble(prepared, hypotheses, length_penalty)` gives,
per text, its n-best outputs. Translation (`service.engine.translation.Translation`) cuts lines
and sentences, masks protected spans and frames each sentence with its language's tokens; a
text-to-text model (a summarizer) reads each text whole (`WholeText`).
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass, field
from typing import Literal, Protocol, TypeVar

from service.engine.decoding import Hypothesis, Placeholders
from service.engine.tokenizer import TextCodec


@dataclass(frozen=True)
class SourceOptions:
    """What a request says about its sources besides decoding (a plug-in reads what it knows)."""

    source_language: str | None = None
    target_language: str | None = None
    truncate: bool = False  # a source past the model's limit loses its end instead of being refused


@dataclass(frozen=True)
class Prepared:
    """Texts as sources: one token-id list per source, in text order; `owner[i]` the text of source i;
    `forced` the tokens every output starts with (a target-language token); `placeholders`, per
    source, the tokens its output must hold once each (`decoding.Placeholders`: translation's
    masked spans), empty when no source has any. A plug-in extends it with what its `assemble`
    needs."""

    sources: list[list[int]]
    owner: list[int]
    forced: tuple[int, ...]
    placeholders: Sequence[Placeholders] = field(default=(), kw_only=True)

    def placeholders_of(self, source: int) -> Placeholders | None:
        """Source `source`'s placeholders, if its plug-in has any."""
        return self.placeholders[source] if self.placeholders else None


@dataclass(frozen=True)
class Generated:
    """One output of one text."""

    text: str
    score: float  # length-penalised sequence log-probability
    logprob: float
    finish_reason: Literal["eos", "length"]  # "length": cut at max_new_tokens
    spans_appended: int = 0  # protected spans its tokens lacked, put at the end (a translation cut at its limit)


P = TypeVar("P", bound=Prepared)


class Preparation(Protocol[P]):
    """A plug-in: texts to sources, sources' hypotheses to texts."""

    def prepare(self, texts: Sequence[str], options: SourceOptions) -> P:
        """The texts' sources and what `assemble` needs; raises InvalidInput / InputTooLong."""

    def assemble(
        self, prepared: P, hyps: Sequence[Sequence[Hypothesis]], length_penalty: float
    ) -> list[list[Generated]]:
        """Per text, its n-best outputs, best first, from each source's hypotheses (best first)."""

    def visible(self, prepared: P, index: int, outputs: Sequence[str], partial: str) -> str:
        """The start of text `index`'s output that is final (a stream may show it): `outputs`,
        the decoded best output of its first sources, in order; `partial`, the next one's text so
        far (final as text: no half character). Once `outputs` holds every source of the text, it
        is the text `assemble` gives for those outputs."""


class WholeText:
    """Text-to-text: each text is one source, read whole (no lines, sentences or masks), after the
    model's `prefix` (T5's "summarize: "), framed as the model frames any source; its hypotheses
    are its outputs."""

    def __init__(self, codec: TextCodec, forced: Sequence[int] = (), prefix: str = "") -> None:
        self.codec, self.forced, self.prefix = codec, tuple(forced), prefix

    def prepare(self, texts: Sequence[str], options: SourceOptions) -> Prepared:
        names = [f"texts[{i}]" for i in range(len(texts))]
        whole = [self.prefix + t for t in texts] if self.prefix else texts
        return Prepared(
            self.codec.encode(whole, names, truncate=options.truncate), list(range(len(texts))), self.forced
        )

    def assemble(
        self, prepared: Prepared, hyps: Sequence[Sequence[Hypothesis]], length_penalty: float
    ) -> list[list[Generated]]:
        """The hypotheses as they are: each was scored alone with `length_penalty` already."""
        return [
            [Generated(self.codec.decode(h.tokens), h.score, h.logprob, h.finish_reason) for h in row] for row in hyps
        ]

    def visible(self, prepared: Prepared, index: int, outputs: Sequence[str], partial: str) -> str:
        """The output once it ends, else what it reads so far."""
        return outputs[0] if outputs else partial
