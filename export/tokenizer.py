"""Subword tokenizer training (HF `tokenizers`, BPE with byte fallback), saved as one JSON file.

Lossless by construction: NFC is the only normalisation (canonical composition; no NFKC
rewriting of ``10⁵`` or ``™``), every character outside the learned vocabulary is spelled as
its UTF-8 bytes (``<0xC3>``...) instead of becoming ``<unk>``, and the special tokens live only
in the vocabulary, never as "added tokens": a user who types ``</s>`` gets those characters,
not an end-of-sentence. So ``decode(encode(s)) == NFC(s)`` for every string, except that the
word marker ``▁`` (U+2581) reads back as a space (the translator protects it as a span).

A classifier's tokenizer also lowers a capital that starts a sentence before a lower-case
letter (`sentence_case`): "Impressive results." reads as "impressive results.". That capital is
spelling, not meaning, and BPE pieces are cased: the bundled classifier, trained without this,
put "Impressive." and "Rude staff." on the wrong side and "impressive" and "rude" on the right
one. A classifier never decodes, so this loss is free; the translator's tokenizer stays lossless.
Its 26 rules make tokenizing 1.4x slower (the bundled tokenizer, test texts in batches of 32:
about 35 instead of 25 µs a text), against some 870 µs of model time a text at batch 32.

Metaspace pre-tokenisation splits on spaces only, never on punctuation, so identifiers such as
`dpkg-split` or `|FILE|` decode exactly as written. The translator's placeholders (``⟨1⟩``...,
`service.contract.spans`) are added tokens: one id each, matched before BPE.
"""

from __future__ import annotations

import json
import re
from collections.abc import Iterable, Sequence
from pathlib import Path

from tokenizers import AddedToken, Regex, Tokenizer, decoders, models, normalizers, pre_tokenizers, trainers

from service.contract import spans
from service.contract.graphs import SPECIAL_IDS
from service.contract.spans import PLACEHOLDERS
from service.contract.verbatim import whole_words

PAD, BOS, EOS, UNK, MASK = "<pad>", "<s>", "</s>", "<unk>", "<mask>"
SPECIAL_TOKENS = [PAD, BOS, EOS, UNK, MASK]  # ids 0..4, fixed across every model of the project
BYTE_TOKENS = [f"<0x{b:02X}>" for b in range(256)]
_PLACEHOLDER = re.compile("|".join(map(re.escape, PLACEHOLDERS)))  # one id each: kept out of BPE training


# Where a sentence starts: the text's start, or after . ! ? (and a closing quote) and one space;
# an opening quote or parenthesis may come first.
_SENTENCE_START = r"""(?<=^|^\s|^["'“‘(]|[.!?]\s|[.!?]["'”’)]\s|[.!?]\s["'“‘(])"""


def sentence_case() -> normalizers.Normalizer:
    """Lowers A-Z at a sentence start when a lower-case letter follows ("Awful." -> "awful.";
    "AWFUL!", "I" and "iPhone" stay): one rule per letter, since a replacement is a literal."""
    letters = "ABCDEFGHIJKLMNOPQRSTUVWXYZ"
    return normalizers.Sequence(
        [normalizers.Replace(Regex(f"{_SENTENCE_START}{c}(?=[a-z])"), c.lower()) for c in letters]
    )


def _normalizer(lower_sentence_starts: bool) -> normalizers.Normalizer:
    return normalizers.Sequence([normalizers.NFC(), sentence_case()]) if lower_sentence_starts else normalizers.NFC()


def with_sentence_case(tok: Tokenizer) -> Tokenizer:
    """`tok` with `sentence_case` after its NFC: for a classifier tokenizer trained before it."""
    out = Tokenizer.from_str(tok.to_str())
    out.normalizer = _normalizer(True)
    return out


def _pre_tokenizer() -> pre_tokenizers.PreTokenizer:
    return pre_tokenizers.Metaspace(replacement="▁", prepend_scheme="first")


def train_bpe(
    texts: Iterable[str], vocab_size: int, min_frequency: int = 2, lower_sentence_starts: bool = False
) -> Tokenizer:
    """A BPE tokenizer of `vocab_size` ids in all: specials, learned pieces, 256 bytes, placeholders;
    `lower_sentence_starts`: with `sentence_case` (classifiers)."""
    learned = vocab_size - len(BYTE_TOKENS) - len(PLACEHOLDERS)
    if learned <= len(SPECIAL_TOKENS):
        raise ValueError(f"vocab_size {vocab_size} leaves no room for learned pieces")
    base = Tokenizer(models.BPE(unk_token=UNK))
    base.normalizer = _normalizer(lower_sentence_starts)
    base.pre_tokenizer = _pre_tokenizer()
    trainer = trainers.BpeTrainer(
        vocab_size=learned, min_frequency=min_frequency, special_tokens=SPECIAL_TOKENS, show_progress=False
    )
    base.train_from_iterator((_PLACEHOLDER.sub(" ", t) for t in texts), trainer=trainer)
    model = json.loads(base.to_str())["model"]
    vocab: dict[str, int] = dict(model["vocab"])
    merges = [tuple(m.split(" ", 1)) if isinstance(m, str) else tuple(m) for m in model["merges"]]
    for b in BYTE_TOKENS:
        vocab.setdefault(b, len(vocab))

    tok = Tokenizer(models.BPE(vocab=vocab, merges=merges, unk_token=UNK, byte_fallback=True))
    tok.normalizer = _normalizer(lower_sentence_starts)
    tok.pre_tokenizer = _pre_tokenizer()
    tok.decoder = decoders.Sequence(
        [decoders.ByteFallback(), decoders.Metaspace(replacement="▁", prepend_scheme="first")]
    )
    tok.add_tokens([AddedToken(p, normalized=False, special=False) for p in PLACEHOLDERS])
    for name, i in zip(SPECIAL_TOKENS, SPECIAL_IDS.values(), strict=True):
        if tok.token_to_id(name) != i:
            raise RuntimeError(f"special token {name} got id {tok.token_to_id(name)}, expected {i}")
    return tok


def save(tok: Tokenizer, path: Path) -> None:
    tok.save(str(path))


def load(path: Path) -> Tokenizer:
    return Tokenizer.from_file(str(path))


def encode_texts(tok: Tokenizer, texts: Sequence[str], max_len: int) -> list[list[int]]:
    """Ids per text, cut at `max_len`; an empty text is one <unk> (every row has a real token)."""
    return [e.ids[:max_len] or [SPECIAL_IDS["unk_id"]] for e in tok.encode_batch(list(texts))]


def encode_sources(
    tok: Tokenizer, texts: Sequence[str], max_len: int, verbatim: bool = True, common: frozenset[str] = frozenset()
) -> tuple[list[list[int]], list[spans.Masked]]:
    """Translator source ids as the service builds them (spans masked, EOS appended, at most
    `max_len` ids in all) and the masks that restore the spans after decoding; `common`: the
    model's `common_words`, never names."""
    known, words = spans.alphabet(tok.get_vocab()), whole_words(tok.get_vocab()) | common
    masked = [spans.mask(t, known, words, verbatim) for t in texts]
    ids = encode_texts(tok, [m.text for m in masked], max_len - 1)
    return [s + [SPECIAL_IDS["eos_id"]] for s in ids], masked
