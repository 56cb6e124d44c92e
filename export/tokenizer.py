"""Subword tokenizer training (HF `tokenizers`, BPE), saved as one JSON file.

Metaspace pre-tokenisation splits on spaces only, never on punctuation, so identifiers and
placeholders such as `dpkg-split` or `|FILE|` decode back exactly as written (a punctuation
splitter would come back as `dpkg - split`). NFKC folds look-alike Unicode forms.
"""

from __future__ import annotations

from collections.abc import Iterable
from pathlib import Path

from tokenizers import Tokenizer, decoders, models, normalizers, pre_tokenizers, trainers

PAD, BOS, EOS, UNK, MASK = "<pad>", "<s>", "</s>", "<unk>", "<mask>"
SPECIAL_TOKENS = [PAD, BOS, EOS, UNK, MASK]  # ids 0..4, fixed across every model of the project


def train_bpe(texts: Iterable[str], vocab_size: int, min_frequency: int = 2) -> Tokenizer:
    tok = Tokenizer(models.BPE(unk_token=UNK))
    tok.normalizer = normalizers.Sequence([normalizers.NFKC(), normalizers.Strip()])
    tok.pre_tokenizer = pre_tokenizers.Metaspace(replacement="▁", prepend_scheme="always")
    tok.decoder = decoders.Metaspace(replacement="▁", prepend_scheme="always")
    trainer = trainers.BpeTrainer(
        vocab_size=vocab_size,
        min_frequency=min_frequency,
        special_tokens=SPECIAL_TOKENS,
        show_progress=False,
    )
    tok.train_from_iterator(texts, trainer=trainer)
    for i, name in enumerate(SPECIAL_TOKENS):
        if tok.token_to_id(name) != i:
            raise RuntimeError(f"special token {name} got id {tok.token_to_id(name)}, expected {i}")
    return tok


def special_ids() -> dict[str, int]:
    return {"pad_id": 0, "bos_id": 1, "eos_id": 2, "unk_id": 3, "mask_id": 4}


def save(tok: Tokenizer, path: Path) -> None:
    tok.save(str(path))


def load(path: Path) -> Tokenizer:
    return Tokenizer.from_file(str(path))
