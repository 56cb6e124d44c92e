"""Text <-> token ids with the model's own tokenizer file; limits are checked, never truncated
unless a request asks (a pair: transformers' `longest_first`)."""

from __future__ import annotations

from collections.abc import Iterable, Sequence
from typing import NamedTuple

from tokenizers import Encoding, Tokenizer

from service.contract import spans, verbatim
from service.contract.graphs import SPECIAL_IDS
from service.contract.manifest import Framing, Manifest, PairFraming
from service.errors import InputTooLong


class Encoded(NamedTuple):
    """A classifier input's framed ids and how many of them are in segment 0 (all of a single
    text's; a pair's prefix, first text and middle)."""

    ids: list[int]
    first: int


def longest_first(n1: int, n2: int, budget: int) -> tuple[int, int]:
    """How many ids of each text of a pair are kept within `budget`, as transformers' fast
    tokenizers truncate `longest_first` (tokenizers' `truncate_encodings`): the shorter text is kept
    whole if the longer one can give up enough, else each keeps half the budget (the longer one
    the odd id); the ends of the texts are cut."""
    if n1 + n2 <= budget:
        return n1, n2
    short = min(n1, n2)
    keep_short, keep_long = (short, budget - short) if short <= budget // 2 else (budget // 2, budget - budget // 2)
    return (keep_short, keep_long) if n1 <= n2 else (keep_long, keep_short)


class TextCodec:
    """`max_tokens` counts the text's own tokens; the framing around them (a translator source's EOS,
    a BERT's [CLS] and [SEP], a language token) comes on top (the manifest's `max_source_tokens`
    means the same)."""

    def __init__(
        self,
        tokenizer_json: bytes,
        max_tokens: int,
        framing: Framing | None = None,
        unk_id: int = SPECIAL_IDS["unk_id"],
        skip_ids: Sequence[int] = tuple(SPECIAL_IDS.values()),
        common_words: Iterable[str] = (),
    ) -> None:
        self.tok = Tokenizer.from_str(tokenizer_json.decode("utf-8"))
        self.max_tokens = max_tokens
        self.framing = framing or Framing()
        self.pair: PairFraming | None = None  # a pair classifier's framing (`of`)
        self.unk_id = unk_id
        self._skip = frozenset(skip_ids)
        self.alphabet = spans.alphabet(self.tok.get_vocab())  # what it spells without byte tokens
        self.vocab_words = verbatim.whole_words(self.tok.get_vocab())  # what it holds whole: not names
        self.words = self.vocab_words | frozenset(common_words)  # nor what its training wrote in lower case

    @classmethod
    def of(
        cls, manifest: Manifest, tokenizer_json: bytes, fallback: Framing | None = None, common_words: bytes = b""
    ) -> TextCodec:
        """The codec a manifest describes; `fallback`: the framing of an export that states none;
        `common_words`: the manifest's `common_words` file, one word a line."""
        m, st = manifest, manifest.special_tokens
        framing = m.sources.get("") or fallback
        skip = m.skip_ids or [*st.values()]
        unk = st.get("unk_id", SPECIAL_IDS["unk_id"])
        codec = cls(tokenizer_json, m.max_source_tokens, framing, unk, skip, common_words.decode("utf-8").split())
        codec.pair = m.pair
        # A tokenizer that does not go with the model would answer every text alike, 200 each time.
        size, vocab = codec.tok.get_vocab_size(with_added_tokens=True), m.architecture.get("vocab_size")
        top = max(st.values(), default=0)
        if size <= top or (isinstance(vocab, int) and size > vocab):
            raise ValueError(
                f"tokenizer.json holds {size} tokens: it does not go with a model of vocabulary {vocab} "
                f"and special token ids up to {top}"
            )
        return codec

    def encode(
        self,
        texts: Sequence[str],
        names: Sequence[str] | None = None,
        framing: Framing | None = None,
        truncate: bool = False,
    ) -> list[list[int]]:
        """Token ids per text, framed; an empty text becomes a single <unk> so every row has one
        real token. `names` say which input each text is, for the error of one that is too long;
        with `truncate` it loses its end instead (as transformers' `truncation=True`)."""
        f = framing or self.framing
        out = []
        for i, enc in enumerate(self._encodings(texts)):
            ids = enc.ids or [self.unk_id]
            if truncate:
                ids = ids[: self.max_tokens]
            elif len(ids) > self.max_tokens:
                name = names[i] if names is not None else f"texts[{i}]"
                raise InputTooLong(f"{name} has {len(ids)} tokens; this model accepts at most {self.max_tokens}")
            out.append([*f.prefix, *ids, *f.suffix])
        return out

    def encode_rows(self, texts: Sequence[str], truncate: bool = False) -> list[Encoded]:
        """A classifier's single texts, framed, all in segment 0; `truncate`: a text past the limit
        loses its end instead of being refused."""
        if truncate:
            cut = [(enc.ids or [self.unk_id])[: self.max_tokens] for enc in self._encodings(texts)]
            rows = [[*self.framing.prefix, *ids, *self.framing.suffix] for ids in cut]
        else:
            rows = self.encode(texts)
        return [Encoded(ids, len(ids)) for ids in rows]

    @property
    def pair_budget(self) -> int:
        """The two texts' own ids a pair may hold: the model's positions less the pair framing."""
        assert self.pair is not None
        return self.max_tokens + len(self.framing.prefix) + len(self.framing.suffix) - self.pair.length

    def encode_pairs(self, pairs: Sequence[tuple[str, str]], truncate: bool = False) -> list[Encoded]:
        """Pairs framed as the model's tokenizer frames them (`prefix a middle b suffix`); a pair
        past the limit is refused, or with `truncate` cut as transformers' `longest_first` cuts it.
        An empty text is no ids (transformers' own framing of it)."""
        if self.pair is None:
            raise ValueError("this model takes single texts only")
        f, budget = self.pair, self.pair_budget
        encs = self._encodings([t for pair in pairs for t in pair])
        out = []
        for i in range(len(pairs)):
            a, b = encs[2 * i].ids, encs[2 * i + 1].ids
            if len(a) + len(b) > budget and not truncate:
                raise InputTooLong(
                    f"pairs[{i}] has {len(a) + len(b)} tokens; this model accepts at most {budget} in a pair"
                )
            keep_a, keep_b = longest_first(len(a), len(b), budget)
            head = [*f.prefix, *a[:keep_a], *f.middle]
            out.append(Encoded([*head, *b[:keep_b], *f.suffix], len(head)))
        return out

    def _encodings(self, texts: Sequence[str]) -> list[Encoding]:
        # One text (most requests) keeps the GIL: the batch call releases it, and on the event loop
        # getting it back behind the engine thread costs more than the rayon batch saves.
        if len(texts) == 1:
            return [self.tok.encode(texts[0], add_special_tokens=False)]
        return self.tok.encode_batch_fast(list(texts), add_special_tokens=False)  # no character offsets

    def has_tokens(self, pieces: Sequence[str]) -> bool:
        """Whether each piece is one token of the vocabulary (placeholders of a span-aware model)."""
        return all(self.tok.token_to_id(p) is not None for p in pieces)

    def count(self, text: str) -> int:
        return len(self.tok.encode(text, add_special_tokens=False).ids)

    def decode(self, ids: Sequence[int]) -> str:
        """Special ids (a model may emit <unk>, <pad> or a language token) are left out; everything else is text."""
        return str(self.tok.decode([i for i in ids if i not in self._skip], skip_special_tokens=False))

    def tokens(self, ids: Sequence[int]) -> list[str]:
        """The vocabulary pieces of `ids`, for display (attention maps)."""
        return [self.tok.id_to_token(i) or "" for i in ids]
