"""The serving tokenizer of a Hugging Face checkpoint, imported from a local folder.

The service encodes with one `tokenizers.Tokenizer` and frames the ids itself, so an import yields
a tokenizer without post-processor, the framing of an encoder input per source language and the
decoder tokens forced first per target language. transformers' own tokenizer for the checkpoint is
the reference: every import checks probe texts (ids, framing, decoding) against it and refuses a
tokenizer that disagrees or that would emit an id past the model's embedding.

Where transformers 5 itself runs on `tokenizers` (BERT, DistilBERT, RoBERTa, BART, XLM-R, NLLB,
mBART) its backend is copied, so it is the tokenizer transformers runs, whichever files it was built
from. Marian and M2M100 are SentencePiece-backed in transformers 5; their SentencePiece model is
converted here, so serving needs no SentencePiece: transformers' `SpmConverter` supplies the
normalizer and pre-tokenizer of the SentencePiece model, and the Unigram or BPE model is rebuilt in
vocab.json's ids (transformers looks every piece up in vocab.json, unknown ones as <unk>).
What each family needs (files, conversion, language codes, forced target tokens) is a `Tokenization`
its registry entry states (`export.hf.families`), picking the rules defined here (`check_marian`,
`nllb_languages`, `decoder_start_targets`, ...); no code here looks up a family.
"""

from __future__ import annotations

import json
import re
import warnings
from collections.abc import Callable, Iterable, Sequence
from dataclasses import dataclass
from pathlib import Path

import transformers
from sentencepiece import sentencepiece_model_pb2
from tokenizers import AddedToken, Regex, Tokenizer, decoders, models
from transformers.convert_slow_tokenizer import SpmConverter

from export.hf import ImportProblem
from service.contract.manifest import PairFraming

Tok = transformers.PreTrainedTokenizerBase


@dataclass(frozen=True)
class SentencePiece:
    """A SentencePiece-backed transformers tokenizer this module converts (transformers 5 runs it
    without `tokenizers`): its class, the SentencePiece model's file beside vocab.json, and whether
    the model's ids past the table decode as <unk> glued to the text (M2M100's "made-up words")."""

    tokenizer_class: str  # type(hf).__name__
    spm_file: str
    unknown_to_model_size: bool = False
    check: Callable[[Tok], None] | None = None  # what of this tokenizer the conversion cannot serve


# Per target language, the decoder tokens forced first: (tokenizer, model config, language codes) -> them
TargetRule = Callable[[Tok, transformers.PretrainedConfig, list[str]], dict[str, tuple[int, ...]]]


@dataclass(frozen=True)
class Tokenization:
    """How a family's tokenizer is turned into the serving tokenizer and its framing: stated once,
    in its registry entry (`export.hf.families`)."""

    name: str  # in messages: "nllb", "bert"
    # sets of files of which one must be complete (transformers falls back to defaults for some
    # missing files instead of failing, so their absence is caught before it loads anything)
    files: tuple[tuple[str, ...], ...]
    targets: TargetRule  # the decoder tokens forced first per target language ({} for a classifier)
    languages: Callable[[Tok], list[str]] | None = None  # the language codes of a multilingual tokenizer
    sentencepiece: SentencePiece | None = None  # the conversion when transformers runs no `tokenizers` backend


@dataclass(frozen=True)
class Framing:
    prefix: tuple[int, ...]  # ids before a text's own ids
    suffix: tuple[int, ...]  # ids after them


@dataclass(frozen=True)
class ImportedTokenizer:
    tokenizer: Tokenizer  # encode(text).ids: the text's own ids, no framing; decode gives the text back
    special_ids: tuple[int, ...]  # left out when decoding generated ids (specials, language tokens)
    sources: dict[str, Framing]  # source language code ("" for a monolingual model) -> encoder framing
    targets: dict[str, tuple[int, ...]]  # target language code -> decoder tokens forced first; {} classifiers
    pad_id: int
    unk_id: int
    eos_id: int | None
    bos_id: int | None
    pair: PairFraming | None = None  # a classifier's framing of two texts (`_pair_framing`); none: translators


SPM_OR_JSON = (("tokenizer.json",), ("sentencepiece.bpe.model",))
_NLLB_CODE = re.compile(r"[a-z]{3}_[A-Z][a-z]{3}")

# Texts whose ids, framing and decoding must agree with transformers at every import. Plain ASCII
# only: every real vocabulary has these characters, and a wrongly mapped id shows on any of them.
PROBES = (
    "Hello, world!",
    "The quick brown fox jumps over the lazy dog.",
    "",
    " ",
    "   ",
    "  two  spaces  between  ",
    "tab\tand\nnew line",
    "Numbers 12345, 3.14 and 1,000,000.",
    "UPPER lower MiXeD",
    "it's a \"test\" (really) - isn't it?",
    "a-b_c/d\\e | f@g.h #1 $2 %3 &4 *5 +6 =7 ~8",
    "x",
)
_FRAMING_PROBE = "Hello world."

# Prefix of vocabulary entries the segmenter must never produce: vocab.json tokens that are no piece
# of the source SentencePiece model (Marian's target-side pieces). The decoder removes it again.
_HIDDEN = "\U0010ffff"
_UNKNOWN = "\ufdd0"  # where an id no token stands for was, while decoding (a noncharacter: in no text)
_STRIP = Regex(r"\A[\s\x1c-\x1f]+|[\s\x1c-\x1f]+\z")  # Python's str.strip(): \s and \x1c-\x1f
# transformers' clean_up_tokenization, in its order
_CLEANUP: tuple[tuple[str, str], ...] = (
    (" .", "."),
    (" ?", "?"),
    (" !", "!"),
    (" ,", ","),
    (" ' ", "'"),
    (" n't", "n't"),
    (" 'm", "'m"),
    (" 's", "'s"),
    (" 've", "'ve"),
    (" 're", "'re"),
)


def convert_tokenizer(folder: Path, config: transformers.PretrainedConfig, family: Tokenization) -> ImportedTokenizer:
    """The serving tokenizer of the checkpoint in `folder`, converted as its family states, checked
    against transformers'."""
    _check_files(folder, family)
    hf = _load(folder, config)
    model_size = getattr(config, "vocab_size", None)
    serving = _serving_tokenizer(folder, hf, family.sentencepiece, model_size if isinstance(model_size, int) else 0)
    special = set(hf.all_special_ids) | {i for i, t in hf.added_tokens_decoder.items() if t.special}
    _check_probes(hf, serving, special, [*PROBES, *_special_probes(hf)])

    codes = family.languages(hf) if family.languages is not None else []
    sources = {code: _source_framing(hf, serving, code) for code in codes} if codes else {"": _framing(hf, serving)}
    architectures = getattr(config, "architectures", None) or []
    classifies = bool(architectures) and all(a.endswith("ForSequenceClassification") for a in architectures)
    targets = {} if classifies else family.targets(hf, config, codes)
    framing_ids = {i for f in sources.values() for i in (*f.prefix, *f.suffix)} | {
        i for t in targets.values() for i in t
    }
    if hf.pad_token_id is None or hf.unk_token_id is None:
        raise ImportProblem(f"the tokenizer in {folder} has no pad or no unknown token")
    imported = ImportedTokenizer(
        tokenizer=serving,
        special_ids=tuple(sorted(special | framing_ids)),
        sources=sources,
        targets=targets,
        pad_id=hf.pad_token_id,
        unk_id=hf.unk_token_id,
        eos_id=hf.eos_token_id,
        bos_id=hf.bos_token_id,
        pair=_pair_framing(hf, serving) if classifies else None,
    )
    if family.languages is not None:
        _check_languages(imported, hf.mask_token_id)
    _check_vocabulary(imported, config)
    return imported


def declared_class(folder: Path) -> str:
    """The tokenizer class `tokenizer_config.json` declares ("" if none): it tells apart checkpoints
    of one model type with different tokenizers (NLLB is an m2m_100, mBART-50 an mbart)."""
    if (folder / "tokenizer_config.json").is_file():
        return str(json.loads((folder / "tokenizer_config.json").read_text()).get("tokenizer_class") or "")
    return ""


def _check_files(folder: Path, family: Tokenization) -> None:
    if not any(all((folder / name).is_file() for name in names) for names in family.files):
        wanted = " or ".join(" + ".join(names) for names in family.files)
        raise ImportProblem(f"{folder} lacks the tokenizer files of a {family.name} checkpoint: expected {wanted}")


def _load(folder: Path, config: transformers.PretrainedConfig) -> transformers.PreTrainedTokenizerBase:
    try:
        with warnings.catch_warnings():
            warnings.simplefilter("ignore")  # Marian's "Recommended: pip install sacremoses", and the like
            return transformers.AutoTokenizer.from_pretrained(folder, config=config, local_files_only=True)
    except Exception as e:  # transformers raises many kinds; the message says what it could not read
        raise ImportProblem(f"transformers cannot load the tokenizer in {folder}: {type(e).__name__}: {e}") from e


def _serving_tokenizer(
    folder: Path, hf: transformers.PreTrainedTokenizerBase, spm: SentencePiece | None, model_size: int
) -> Tokenizer:
    """A copy of the backend transformers runs, or the family's conversion of a SentencePiece-backed
    tokenizer. `model_size`, config.vocab_size: M2M100's model has ids no token stands for (its
    "made-up words" after the languages), which transformers decodes as <unk>; the converted table
    reaches them too."""
    if isinstance(hf, transformers.TokenizersBackend):
        tok = Tokenizer.from_str(hf.backend_tokenizer.to_str())
        tok.post_processor = None
        tok.no_truncation()
        tok.no_padding()
        cleans = hf.clean_up_tokenization_spaces and (
            not isinstance(tok.model, models.BPE)
            or hf.clean_up_tokenization_spaces_for_bpe_even_though_it_will_corrupt_output
        )
        if cleans and tok.decoder is not None:
            tok.decoder = decoders.Sequence([tok.decoder, *_cleanup()])
        return tok
    name = type(hf).__name__
    if spm is None or name != spm.tokenizer_class:
        raise ImportProblem(f"{name} is neither backed by tokenizers nor a SentencePiece tokenizer known here")
    if spm.check is not None:
        spm.check(hf)
    size, unknown = (model_size, str(hf.unk_token)) if spm.unknown_to_model_size else (0, None)
    vocab = json.loads((folder / "vocab.json").read_text(encoding="utf-8"))
    return _from_sentencepiece((folder / spm.spm_file).read_bytes(), vocab, hf.added_tokens_decoder, hf, size, unknown)


def check_marian(hf: Tok) -> None:
    """Marian checkpoints the conversion cannot serve: two vocabularies, target language tokens."""
    if hf.separate_vocabs:
        raise ImportProblem("Marian checkpoints with separate source and target vocabularies are not supported")
    codes = [t for t in hf.encoder if t.startswith(">>") and t.endswith("<<")]
    if codes:
        raise ImportProblem(
            f"multilingual Marian checkpoints are not supported: vocab.json has target language tokens "
            f"({', '.join(codes[:3])}...) that belong at the start of the encoder input"
        )


def _from_sentencepiece(
    spm: bytes,
    vocab: dict[str, int],
    added: dict[int, AddedToken],
    hf: transformers.PreTrainedTokenizerBase,
    size: int = 0,
    unknown: str | None = None,
) -> Tokenizer:
    """SentencePiece's segmentation of `spm` with the ids of `vocab` (plus transformers' added tokens).
    With `unknown` (M2M100), every id below `size` that no token stands for decodes as that text, glued
    to the next piece, as M2M100Tokenizer decodes it (SentencePiece decodes the pieces after it anew)."""
    proto = sentencepiece_model_pb2.ModelProto()  # type: ignore[attr-defined]  # generated protobuf code
    proto.ParseFromString(spm)
    pieces = {p.piece: p.score for p in proto.pieces if p.type in (1, 4)}  # NORMAL, USER_DEFINED: the segmenter's
    orphans = [p for p in pieces if p not in vocab]
    if orphans:
        raise ImportProblem(
            f"{len(orphans)} pieces of the SentencePiece model are missing from vocab.json (e.g. {orphans[:3]}): "
            f"transformers turns them into <unk> after segmenting, which a converted tokenizer cannot do"
        )
    by_id: dict[int, str] = {}
    for token, i in [*vocab.items(), *((t.content, i) for i, t in added.items())]:
        if by_id.setdefault(i, token) != token:
            raise ImportProblem(f"id {i} is both {by_id[i]!r} and {token!r} in vocab.json and the added tokens")
    unk = str(hf.unk_token)
    if vocab.get(unk) is None:
        raise ImportProblem(f"vocab.json has no unknown token {unk!r}")
    byte_fallback = proto.trainer_spec.byte_fallback
    seen = {t.content for t in added.values()} | {unk}
    if byte_fallback:
        seen |= {p.piece for p in proto.pieces if p.type == 6}  # BYTE pieces, looked up by name

    entries: dict[int, str] = {}  # id -> the string the model knows it by
    for i in range(max(max(by_id) + 1, size)):
        token = by_id.get(i, f"<unknown {i}>" if unknown is not None else f"<unused {i}>")
        entries[i] = token if token in pieces or token in seen else _HIDDEN + token

    # SentencePiece's normalizer and pre-tokenizer, as transformers builds them for this model
    tok = SpmConverter.build_tokenizer_from_spm_proto(proto, {p.piece: i for i, p in enumerate(proto.pieces)})
    if tok is None:
        raise ImportProblem("the SentencePiece model is neither Unigram nor BPE")
    if proto.trainer_spec.model_type == 1:  # Unigram; scores of the hidden entries keep the lowest, as <unk>'s
        low = min(pieces.values())
        table = [(token, pieces.get(token, low)) for token in entries.values()]
        tok.model = models.Unigram(table, unk_id=vocab[unk], byte_fallback=byte_fallback)
    else:  # BPE: transformers' merges, ranked by the merged piece's score, over vocab.json's ids
        built = json.loads(tok.to_str())["model"]
        merges = [tuple(m) if isinstance(m, list) else tuple(m.split(" ")) for m in built["merges"]]
        tok.model = models.BPE(
            vocab={token: i for i, token in entries.items()},
            merges=merges,
            unk_token=unk,
            fuse_unk=True,
            byte_fallback=byte_fallback,
            ignore_merges=bool(built.get("ignore_merges")),
        )
    for i, t in sorted(added.items()):
        copy = AddedToken(
            t.content, single_word=t.single_word, lstrip=t.lstrip, rstrip=t.rstrip, normalized=t.normalized
        )
        if t.special:
            tok.add_special_tokens([copy])
        else:
            tok.add_tokens([copy])
        if tok.token_to_id(t.content) != i:
            raise ImportProblem(f"added token {t.content!r} gets id {tok.token_to_id(t.content)}, not {i}")
    # transformers decodes with SentencePiece's decode, then str.strip() (and its clean-up if configured)
    steps: list[decoders.Decoder] = [decoders.Replace(Regex(_HIDDEN + r"<unknown \d+>"), _UNKNOWN)] if unknown else []
    steps += [decoders.Replace(_HIDDEN, ""), decoders.Replace("▁", " ")]
    steps += [decoders.ByteFallback()] if byte_fallback else []
    steps += [decoders.Fuse()]
    steps += [decoders.Replace(Regex(_UNKNOWN + " ?"), unknown)] if unknown else []
    steps += [decoders.Replace(_STRIP, "")]
    tok.decoder = decoders.Sequence(steps + (_cleanup() if hf.clean_up_tokenization_spaces else []))
    return tok


def _cleanup() -> list[decoders.Decoder]:
    return [decoders.Fuse(), *(decoders.Replace(a, b) for a, b in _CLEANUP)]


def _special_probes(hf: transformers.PreTrainedTokenizerBase) -> list[str]:
    """Texts with the added tokens written out, which transformers matches before segmenting."""
    tokens = [t.content for t in hf.added_tokens_decoder.values()][:20]
    return [f"a {t} b" for t in tokens] + [f"{t}x{t}" for t in tokens[:3]]


def _check_probes(
    hf: transformers.PreTrainedTokenizerBase, serving: Tokenizer, special: set[int], texts: Iterable[str]
) -> None:
    for text in texts:
        want = hf(text, add_special_tokens=False)["input_ids"]
        got = serving.encode(text).ids
        if got != want:
            raise ImportProblem(f"the serving tokenizer encodes {text!r} as {got}, transformers as {want}")
        kept = [i for i in want if i not in special]
        if serving.decode(kept) != (back := hf.decode(want, skip_special_tokens=True)):
            raise ImportProblem(f"the serving tokenizer decodes {want} as {serving.decode(kept)!r}, not {back!r}")


def _framing(hf: transformers.PreTrainedTokenizerBase, serving: Tokenizer) -> Framing:
    """Where transformers puts a text's own ids among the ids it gives the encoder."""
    own = serving.encode(_FRAMING_PROBE).ids
    framed = hf(_FRAMING_PROBE)["input_ids"]
    at = _find(framed, own)
    framing = Framing(tuple(framed[:at]), tuple(framed[at + len(own) :]))
    for text in PROBES[:3]:
        if hf(text)["input_ids"] != [*framing.prefix, *serving.encode(text).ids, *framing.suffix]:
            raise ImportProblem(f"transformers frames {text!r} differently from {_FRAMING_PROBE!r}")
    return framing


_PAIR_PROBE = ("Hello world.", "Good night, moon!")


def _pair_framing(hf: transformers.PreTrainedTokenizerBase, serving: Tokenizer) -> PairFraming:
    """Where transformers puts two texts' own ids among the ids of a pair (`hf(a, b)`), checked on
    probe pairs; its token types, where it gives them, must be 0 up to the second text and 1 from
    it on (the contract's segments)."""
    first, second = (serving.encode(t).ids for t in _PAIR_PROBE)
    framed = hf(*_PAIR_PROBE)["input_ids"]
    at = _find(framed, first)
    rest = framed[at + len(first) :]
    at_b = _find(rest, second)
    pair = PairFraming(prefix=framed[:at], middle=rest[:at_b], suffix=rest[at_b + len(second) :])
    for a, b in [(PROBES[0], PROBES[1]), (PROBES[2], PROBES[0]), (PROBES[1], PROBES[11])]:
        got = hf(a, b)
        own_a, own_b = serving.encode(a).ids, serving.encode(b).ids
        if got["input_ids"] != [*pair.prefix, *own_a, *pair.middle, *own_b, *pair.suffix]:
            raise ImportProblem(f"transformers frames the pair {(a, b)!r} differently from {_PAIR_PROBE!r}")
        head = len(pair.prefix) + len(own_a) + len(pair.middle)
        types = got.get("token_type_ids")
        if types is not None and any(types) and types != [0] * head + [1] * (len(got["input_ids"]) - head):
            raise ImportProblem(f"transformers' token types of the pair {(a, b)!r} are not 0s then 1s: {types}")
    return pair


def _source_framing(hf: transformers.PreTrainedTokenizerBase, serving: Tokenizer, code: str) -> Framing:
    hf.src_lang = code
    return _framing(hf, serving)


def _find(framed: Sequence[int], own: Sequence[int]) -> int:
    for at in range(len(framed) - len(own) + 1):
        if list(framed[at : at + len(own)]) == list(own):
            return at
    raise ImportProblem(f"transformers' framed ids {list(framed)} do not contain the text's ids {list(own)}")


def lang_code_languages(hf: Tok) -> list[str]:
    """The language codes of a fairseq multilingual tokenizer (M2M100, mBART): its `lang_code_to_id`."""
    return list(hf.lang_code_to_id)


def nllb_languages(hf: Tok) -> list[str]:
    """NLLB's language codes: its extra special tokens that look like `eng_Latn`."""
    return [str(t) for t in hf.extra_special_tokens if _NLLB_CODE.fullmatch(str(t))]


def no_targets(hf: Tok, config: transformers.PretrainedConfig, codes: list[str]) -> dict[str, tuple[int, ...]]:
    """A classifier: nothing is generated."""
    return {}


def label_prefix_targets(
    hf: Tok, config: transformers.PretrainedConfig, codes: list[str]
) -> dict[str, tuple[int, ...]]:
    """Per target language, the tokens transformers puts before a label's ids: the ones generation forces."""
    if not codes:
        return {"": _label_prefix(hf)}
    targets = {}
    for code in codes:
        hf.tgt_lang = code
        targets[code] = _label_prefix(hf)
    return targets


def decoder_start_targets(
    hf: Tok, config: transformers.PretrainedConfig, codes: list[str]
) -> dict[str, tuple[int, ...]]:
    """mBART-cc25: labels end "</s> lang", so the language token is the decoder's *start*, and the one
    target language reachable is the one config.decoder_start_token_id names."""
    start = getattr(config, "decoder_start_token_id", None)
    return {code: () for code, i in hf.lang_code_to_id.items() if i == start} or {"": ()}


def _label_prefix(hf: transformers.PreTrainedTokenizerBase) -> tuple[int, ...]:
    framed = hf(text_target=_FRAMING_PROBE)["input_ids"]
    own = hf(text_target=_FRAMING_PROBE, add_special_tokens=False)["input_ids"]
    return tuple(framed[: _find(framed, own)])


def _check_languages(imported: ImportedTokenizer, mask_id: int | None) -> None:
    """Language tokens of their own, placed where fairseq's dictionaries put them (before <mask>)."""
    for code, framing in imported.sources.items():
        if imported.unk_id in (*framing.prefix, *framing.suffix):
            raise ImportProblem(f"language code {code!r} has no token of its own: it maps to the unknown token")
    common = set.intersection(*({*f.prefix, *f.suffix} for f in imported.sources.values()))
    languages = {i for f in imported.sources.values() for i in (*f.prefix, *f.suffix)} - common
    if mask_id is not None and languages and mask_id < min(languages):
        raise ImportProblem(
            f"<mask> has id {mask_id}, before the language tokens (from {min(languages)}); fairseq puts it after "
            f"them, so the language ids are shifted: tokenizer_config.json should pin them (added_tokens_decoder)"
        )


def _check_vocabulary(imported: ImportedTokenizer, config: transformers.PretrainedConfig) -> None:
    """No id the tokenizer can produce may fall outside the model's embedding; pad and eos must agree."""
    size = getattr(config, "vocab_size", None)
    if not isinstance(size, int):
        raise ImportProblem("the model config has no vocab_size")
    entries = max(imported.tokenizer.get_vocab(with_added_tokens=True).values())
    for what, highest in (("a vocabulary entry", entries), ("a special or language token", max(imported.special_ids))):
        if highest >= size:
            raise ImportProblem(
                f"the tokenizer does not match the model: {what} has id {highest}, "
                f"but the model's vocabulary has {size} ids (config.vocab_size)"
            )
    for name, mine in (("pad_token_id", imported.pad_id), ("eos_token_id", imported.eos_id)):
        theirs = getattr(config, name, None)
        if theirs is not None and mine is not None and theirs != mine:
            raise ImportProblem(
                f"the tokenizer's {name.removesuffix('_token_id')} id is {mine}, the model config's {name} {theirs}"
            )
