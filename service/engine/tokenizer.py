"""Text <-> token ids with the model's own tokenizer file; limits are checked, never truncated."""

from __future__ import annotations

from collections.abc import Sequence

from tokenizers import Tokenizer

from service.contract import spans
from service.contract.graphs import SPECIAL_IDS
from service.errors import InputTooLong


class TextCodec:
    """`max_tokens` counts the text's own tokens; the EOS a translator source ends with comes on top
    (the manifest's `max_source_tokens` means the same)."""

    def __init__(self, tokenizer_json: bytes, max_tokens: int, eos_id: int | None = None) -> None:
        self.tok = Tokenizer.from_str(tokenizer_json.decode("utf-8"))
        self.max_tokens = max_tokens
        self.suffix: list[int] = [] if eos_id is None else [eos_id]  # appended to translator sources
        self.unk_id = SPECIAL_IDS["unk_id"]
        self._special = frozenset(SPECIAL_IDS.values())
        self.alphabet = spans.alphabet(self.tok.get_vocab())  # what it spells without byte tokens

    def encode(self, texts: Sequence[str], names: Sequence[str] | None = None) -> list[list[int]]:
        """Token ids per text; an empty text becomes a single <unk> so every row has one real token.
        `names` say which input each text is, for the error of one that is too long."""
        out = []
        for i, enc in enumerate(self.tok.encode_batch_fast(list(texts))):  # no character offsets: a quarter faster
            ids = enc.ids or [self.unk_id]
            if len(ids) > self.max_tokens:
                name = names[i] if names is not None else f"texts[{i}]"
                raise InputTooLong(f"{name} has {len(ids)} tokens; this model accepts at most {self.max_tokens}")
            out.append(ids + self.suffix)
        return out

    def has_tokens(self, pieces: Sequence[str]) -> bool:
        """Whether each piece is one token of the vocabulary (placeholders of a span-aware model)."""
        return all(self.tok.token_to_id(p) is not None for p in pieces)

    def count(self, text: str) -> int:
        return len(self.tok.encode(text).ids)

    def decode(self, ids: Sequence[int]) -> str:
        """Special ids (a model may emit <unk> or <pad>) are left out; everything else is text."""
        return str(self.tok.decode([i for i in ids if i not in self._special], skip_special_tokens=False))

    def tokens(self, ids: Sequence[int]) -> list[str]:
        """The vocabulary pieces of `ids`, for display (attention maps)."""
        return [self.tok.id_to_token(i) or "" for i in ids]
