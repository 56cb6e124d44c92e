"""Text <-> token ids with the model's own tokenizer file; limits are checked, never truncated."""

from __future__ import annotations

from collections.abc import Sequence

from tokenizers import Tokenizer

from service.errors import InputTooLong


class TextCodec:
    def __init__(self, tokenizer_json: bytes, max_tokens: int, eos_id: int | None = None) -> None:
        self.tok = Tokenizer.from_str(tokenizer_json.decode("utf-8"))
        self.max_tokens = max_tokens
        self.eos_id = eos_id  # appended to translator sources, as in training
        unk = self.tok.token_to_id("<unk>")
        if unk is None:
            raise ValueError("tokenizer has no <unk> token")
        self.unk_id: int = unk

    def encode(self, texts: Sequence[str]) -> list[list[int]]:
        """Token ids per text; an empty text becomes a single <unk> so every row has one real token."""
        out = []
        eos = self.eos_id
        suffix: list[int] = [] if eos is None else [eos]
        extra = len(suffix)
        for i, enc in enumerate(self.tok.encode_batch(list(texts))):
            ids = enc.ids or [self.unk_id]
            if len(ids) + extra > self.max_tokens:
                raise InputTooLong(
                    f"texts[{i}] has {len(ids) + extra} tokens; this model accepts at most {self.max_tokens}"
                )
            out.append(ids + suffix)
        return out

    def decode(self, ids: Sequence[int]) -> str:
        return self.tok.decode(list(ids))

    def decode_batch(self, rows: Sequence[Sequence[int]]) -> list[str]:
        return self.tok.decode_batch([list(r) for r in rows])
