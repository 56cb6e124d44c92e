"""Text <-> token ids with the model's own tokenizer file; limits are checked, never truncated."""

from __future__ import annotations

from collections.abc import Iterable, Sequence

from tokenizers import Encoding, Tokenizer

from service.contract import spans, verbatim
from service.contract.graphs import SPECIAL_IDS
from service.contract.manifest import Framing, Manifest
from service.errors import InputTooLong


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
        self, texts: Sequence[str], names: Sequence[str] | None = None, framing: Framing | None = None
    ) -> list[list[int]]:
        """Token ids per text, framed; an empty text becomes a single <unk> so every row has one
        real token. `names` say which input each text is, for the error of one that is too long."""
        f = framing or self.framing
        out = []
        for i, enc in enumerate(self._encodings(texts)):
            ids = enc.ids or [self.unk_id]
            if len(ids) > self.max_tokens:
                name = names[i] if names is not None else f"texts[{i}]"
                raise InputTooLong(f"{name} has {len(ids)} tokens; this model accepts at most {self.max_tokens}")
            out.append([*f.prefix, *ids, *f.suffix])
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
