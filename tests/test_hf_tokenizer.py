"""export.hf.tokenizer against transformers, on tiny checkpoints built here (nothing is downloaded).

Each family's tokenizer files are written the way its checkpoints ship them, from a SentencePiece,
WordPiece or byte-level BPE model trained in well under a second on a multilingual corpus made up
here. vocab.json orders are shuffled, so a conversion that used SentencePiece's ids instead of
vocab.json's would fail on nearly every text.
"""

from __future__ import annotations

import json
import random
import shutil
from collections.abc import Sequence
from pathlib import Path

import pytest
import sentencepiece as spm
import transformers

from export.hf import ImportProblem
from export.hf.families import family_of, import_tokenizer
from export.hf.tokenizer import ImportedTokenizer, convert_tokenizer
from tests.hf_checkpoints import (
    NLLB_CODES,
    TEXTS,
    Checkpoint,
    corpus,
    m2m_config,
    normal_pieces,
    train_spm,
    write_m2m,
    write_marian,
    write_nllb,
)

pytestmark = pytest.mark.families  # Hugging Face families against transformers: left out of `make test-fast`


def assert_encodes_like(hf: transformers.PreTrainedTokenizerBase, imported: ImportedTokenizer, source: str) -> None:
    """Framed ids of every text equal transformers' input_ids with `source` as its source language."""
    if source:
        hf.src_lang = source
    framing = imported.sources[source]
    for text in TEXTS:
        ids = imported.tokenizer.encode(text).ids
        assert [*framing.prefix, *ids, *framing.suffix] == hf(text)["input_ids"], (source, text)


def assert_decodes_like(
    hf: transformers.PreTrainedTokenizerBase, imported: ImportedTokenizer, target: str, extra: Sequence[list[int]] = ()
) -> None:
    """Generated ids (forced tokens, a text's target ids, eos) decode as transformers decodes them."""
    if target:
        hf.tgt_lang = target
    end = [hf.eos_token_id if hf.eos_token_id is not None else hf.sep_token_id]
    forced = list(imported.targets.get(target, ()))
    generated = [[*forced, *hf(text_target=text, add_special_tokens=False)["input_ids"], *end] for text in TEXTS]
    special = set(imported.special_ids)
    for ids in [*generated, *extra]:
        want = hf.decode(ids, skip_special_tokens=True)
        assert imported.tokenizer.decode([i for i in ids if i not in special]) == want, (target, ids)


def random_ids(size: int, seed: int, count: int = 300) -> list[list[int]]:
    rng = random.Random(seed)
    return [[rng.randrange(size) for _ in range(rng.randint(0, 20))] for _ in range(count)]


def test_marian_is_converted_with_vocab_json_ids(marian: Checkpoint) -> None:
    hf = marian.hf()
    assert type(hf).__name__ == "MarianTokenizer"  # SentencePiece-backed in transformers 5: converted here
    vocab = json.loads((marian.folder / "vocab.json").read_text())
    model = (marian.folder / "source.spm").read_bytes()
    source = spm.SentencePieceProcessor(model_proto=model)
    moved = [p for p in normal_pieces(model) if vocab[p] != source.piece_to_id(p)]
    assert len(moved) > 0.9 * len(normal_pieces(model))  # SentencePiece's own ids differ for nearly every piece

    imported = import_tokenizer(marian.folder, marian.config)

    assert imported.sources == {"": imported.sources[""]} and imported.sources[""].suffix == (0,)
    assert imported.sources[""].prefix == () and imported.targets == {"": ()}
    assert (imported.pad_id, imported.unk_id, imported.eos_id, imported.bos_id) == (vocab["<pad>"], 1, 0, None)
    assert set(imported.special_ids) == {0, 1, vocab["<pad>"]}
    assert_encodes_like(hf, imported, "")
    assert_decodes_like(hf, imported, "", random_ids(len(vocab), 1))  # target.spm's pieces and source-only ones
    assert len(TEXTS) >= 200


def test_marian_leaves_a_lone_unknown_character_unknown(tmp_path: Path, unigram: bytes) -> None:
    """The one known difference: a character the source model lacks but vocab.json has as a target piece.

    transformers looks SentencePiece's unknown span up in vocab.json and finds the target piece; the
    converted tokenizer keeps it <unk>, as it does for any span of unknown characters (a longer span
    is <unk> in both: no vocabulary entry is a run of characters SentencePiece could not segment).
    """
    target = train_spm([*corpus(1200, 2), *["աբգդե զէըթ"] * 50], 450, "unigram")
    vocab = write_marian(tmp_path / "m", unigram, target)
    config = transformers.MarianConfig(vocab_size=len(vocab), pad_token_id=vocab["<pad>"], eos_token_id=0)
    hf = Checkpoint(tmp_path / "m", config).hf()
    imported = import_tokenizer(tmp_path / "m", config)

    assert hf("xա y")["input_ids"][2] == vocab["ա"]
    assert imported.tokenizer.encode("xա y").ids[2] == imported.unk_id
    assert [*imported.tokenizer.encode("x աբ y").ids, 0] == hf("x աբ y")["input_ids"]


def test_m2m100_is_converted_with_languages(m2m: Checkpoint) -> None:
    hf = m2m.hf()
    assert type(hf).__name__ == "M2M100Tokenizer"
    imported = import_tokenizer(m2m.folder, m2m.config)

    assert len(imported.sources) == len(imported.targets) == 100
    en, fr = hf.get_lang_id("en"), hf.get_lang_id("fr")
    assert imported.sources["en"].prefix == (en,) and imported.sources["en"].suffix == (2,)
    assert imported.targets["fr"] == (fr,) and {en, fr} <= set(imported.special_ids)
    for code in ("en", "zh"):
        assert_encodes_like(hf, imported, code)
    # the model's last 8 ids are "made-up words" no token stands for: transformers decodes each as <unk>,
    # glued to the pieces on both sides; a tiny random model generates them
    made_up = list(range(m2m.config.vocab_size - 8, m2m.config.vocab_size))
    words = hf("Hello big world", add_special_tokens=False)["input_ids"]
    around = [[made_up[0], *words], [*words, made_up[1]], [words[0], made_up[2], *words[1:]], [*made_up[:3], *words]]
    assert hf.decode(around[2], skip_special_tokens=True).count("<unk>") == 1
    assert_decodes_like(hf, imported, "fr", [*around, *random_ids(m2m.config.vocab_size, 2)])


def test_m2m100_as_transformers_5_saves_it(m2m_saved: Checkpoint) -> None:
    """Saved by transformers 5 the language tokens are no longer special: "__fr__" in a text is text,
    and transformers' decode keeps a language token; the service leaves it out (it is in special_ids)."""
    hf = m2m_saved.hf()
    imported = import_tokenizer(m2m_saved.folder, m2m_saved.config)

    fr = hf.get_lang_id("fr")
    assert imported.targets["fr"] == (fr,) and fr in imported.special_ids and fr not in hf.all_special_ids
    assert_encodes_like(hf, imported, "ru")
    hf.tgt_lang = "fr"
    special = set(imported.special_ids)
    for text in TEXTS[:50]:
        ids = [*hf(text_target=text, add_special_tokens=False)["input_ids"], 2]
        assert imported.tokenizer.decode([i for i in ids if i not in special]) == hf.decode(
            ids, skip_special_tokens=True
        )
    assert hf.decode([fr, *ids], skip_special_tokens=True).startswith("__fr__")


@pytest.mark.parametrize("name", ["nllb", "nllb_json"])
def test_nllb(name: str, request: pytest.FixtureRequest, bpe: bytes) -> None:
    checkpoint: Checkpoint = request.getfixturevalue(name)
    hf = checkpoint.hf()
    assert type(hf).__name__ == "NllbTokenizer"
    imported = import_tokenizer(checkpoint.folder, checkpoint.config)

    words = 4 + len(normal_pieces(bpe))
    eng, fra = words + NLLB_CODES.index("eng_Latn"), words + NLLB_CODES.index("fra_Latn")
    assert len(imported.sources) == len(imported.targets) == len(NLLB_CODES)
    assert imported.sources["eng_Latn"].prefix == (eng,) and imported.sources["eng_Latn"].suffix == (2,)
    assert imported.targets["fra_Latn"] == (fra,) and {eng, fra} <= set(imported.special_ids)
    for code in ("eng_Latn", "rus_Cyrl"):
        assert_encodes_like(hf, imported, code)
    assert_decodes_like(hf, imported, "fra_Latn", random_ids(len(hf), 3))


@pytest.mark.parametrize(("name", "framing"), [("mbart50", "lang ... </s>"), ("mbart", "... </s> lang")])
def test_mbart(name: str, framing: str, request: pytest.FixtureRequest) -> None:
    """mBART-50 frames "[lang] text </s>" and forces the target language after the decoder start;
    cc25 frames "text </s> [lang]" and starts the decoder with the language its config names."""
    checkpoint: Checkpoint = request.getfixturevalue(name)
    hf = checkpoint.hf()
    imported = import_tokenizer(checkpoint.folder, checkpoint.config)

    assert imported.tokenizer.post_processor is None and len(imported.sources) == len(hf.lang_code_to_id)
    for code in ("en_XX", "zh_CN"):
        lang = hf.convert_tokens_to_ids(code)
        shape = ((lang,), (2,)) if name == "mbart50" else ((), (2, lang))
        assert (imported.sources[code].prefix, imported.sources[code].suffix) == shape
        assert_encodes_like(hf, imported, code)
    if name == "mbart50":
        assert imported.targets == {code: (i,) for code, i in hf.lang_code_to_id.items()}
    else:
        assert imported.targets == {"ro_RO": ()}
    assert set(hf.lang_code_to_id.values()) <= set(imported.special_ids)
    assert_decodes_like(hf, imported, "ro_RO" if name == "mbart50" else "", random_ids(len(hf), 4))


@pytest.mark.parametrize(
    ("name", "first", "last", "forced"),
    [
        ("xlmr", "<s>", "</s>", None),
        ("bert", "[CLS]", "[SEP]", None),
        ("distilbert", "[CLS]", "[SEP]", None),
        ("roberta", "<s>", "</s>", None),
        ("deberta", "[CLS]", "[SEP]", None),  # DeBERTa-v3: spm.model alone
        ("deberta_v2", "[CLS]", "[SEP]", None),  # saved again by transformers: tokenizer.json
        ("bart", "<s>", "</s>", "<s>"),  # BART's labels start with <s>: generation forces it
    ],
)
def test_monolingual(name: str, first: str, last: str, forced: str | None, request: pytest.FixtureRequest) -> None:
    checkpoint: Checkpoint = request.getfixturevalue(name)
    hf = checkpoint.hf()
    imported = import_tokenizer(checkpoint.folder, checkpoint.config)

    ids = hf.convert_tokens_to_ids
    assert imported.tokenizer.post_processor is None and list(imported.sources) == [""]
    assert (imported.sources[""].prefix, imported.sources[""].suffix) == ((ids(first),), (ids(last),))
    assert imported.targets == ({} if forced is None else {"": (ids(forced),)})
    assert set(hf.all_special_ids) <= set(imported.special_ids)
    assert_encodes_like(hf, imported, "")
    assert_decodes_like(hf, imported, "", random_ids(len(hf), 5))


@pytest.mark.parametrize("name", ["t5", "mt5"])  # spiece.model alone; tokenizer.json shipped beside it
def test_t5_sentencepiece_with_its_sentinels(name: str, request: pytest.FixtureRequest) -> None:
    checkpoint: Checkpoint = request.getfixturevalue(name)
    hf = checkpoint.hf()
    imported = import_tokenizer(checkpoint.folder, checkpoint.config)

    assert imported.tokenizer.post_processor is None
    assert (imported.sources[""].prefix, imported.sources[""].suffix) == ((), (hf.eos_token_id,))
    assert imported.targets == {"": ()}  # labels carry no prefix: the decoder starts from the pad id alone
    sentinels = [hf.convert_tokens_to_ids(f"<extra_id_{i}>") for i in range(10)]
    assert sentinels == list(range(len(hf) - 1, len(hf) - 11, -1))  # after the pieces, the first one last
    assert set(sentinels) <= set(imported.special_ids)
    masked = "Hello <extra_id_0> world <extra_id_9>."
    assert imported.tokenizer.encode(masked).ids == hf(masked, add_special_tokens=False)["input_ids"]
    assert_encodes_like(hf, imported, "")
    assert_decodes_like(hf, imported, "", random_ids(len(hf), 6))


@pytest.mark.parametrize("name", ["marian", "bert", "roberta"])
def test_decoding_cleans_up_as_transformers_does(name: str, request: pytest.FixtureRequest, tmp_path: Path) -> None:
    """clean_up_tokenization_spaces (true in many checkpoints): transformers then drops the space before
    punctuation, except for BPE tokenizers, which it leaves alone."""
    checkpoint: Checkpoint = request.getfixturevalue(name)
    folder = shutil.copytree(checkpoint.folder, tmp_path / name)
    settings = json.loads((folder / "tokenizer_config.json").read_text())
    (folder / "tokenizer_config.json").write_text(json.dumps({**settings, "clean_up_tokenization_spaces": True}))
    hf = Checkpoint(folder, checkpoint.config).hf()
    assert hf.clean_up_tokenization_spaces
    imported = import_tokenizer(folder, checkpoint.config)
    punctuated = [
        [i for w in ("a", " .", " ?", " !", " ,", " ' ", " n't", " 's") for i in hf.encode(w, add_special_tokens=False)]
    ]
    assert_decodes_like(hf, imported, "", [*punctuated, *random_ids(len(hf), 6)])


def test_a_bart_classifier_has_no_targets_and_frames_pairs(bart: Checkpoint) -> None:
    config = transformers.BartConfig(**{**bart.config.to_dict(), "architectures": ["BartForSequenceClassification"]})
    imported = convert_tokenizer(bart.folder, config, family_of(bart.config).tokenization)
    assert imported.targets == {}
    bos, eos = imported.bos_id, imported.eos_id
    assert imported.pair is not None  # <s> a </s></s> b </s>, as transformers' tokenizer joins a pair
    assert (imported.pair.prefix, imported.pair.middle, imported.pair.suffix) == ([bos], [eos, eos], [eos])


@pytest.mark.parametrize(
    ("name", "architecture"),
    [("bert", "BertForSequenceClassification"), ("distilbert", "DistilBertForSequenceClassification")],
)
def test_a_wordpiece_classifier_frames_pairs_as_cls_a_sep_b_sep(
    request: pytest.FixtureRequest, name: str, architecture: str, marian: Checkpoint
) -> None:
    """[CLS] a [SEP] b [SEP] ([CLS] is id 2, [SEP] 3 in the tiny vocabulary); a translator has no pair framing."""
    tok: Checkpoint = request.getfixturevalue(name)
    config = tok.config.__class__(**{**tok.config.to_dict(), "architectures": [architecture]})
    pair = import_tokenizer(tok.folder, config).pair
    assert pair is not None and (pair.prefix, pair.middle, pair.suffix) == ([2], [3], [3])
    assert import_tokenizer(marian.folder, marian.config).pair is None


def refused(folder: Path, config: transformers.PretrainedConfig) -> str:
    with pytest.raises(ImportProblem) as problem:
        import_tokenizer(folder, config)
    return str(problem.value)


def test_missing_files_are_named(tmp_path: Path, marian: Checkpoint, m2m: Checkpoint) -> None:
    assert "lacks the tokenizer files of a marian checkpoint" in refused(tmp_path, marian.config)
    (tmp_path / "source.spm").write_bytes((marian.folder / "source.spm").read_bytes())
    (tmp_path / "vocab.json").write_bytes((marian.folder / "vocab.json").read_bytes())
    assert "source.spm + target.spm + vocab.json" in refused(tmp_path, marian.config)
    assert "sentencepiece.bpe.model + vocab.json" in refused(tmp_path / "nothing", m2m.config)


def test_vocabulary_larger_than_the_model_is_refused(marian: Checkpoint, m2m: Checkpoint, bert: Checkpoint) -> None:
    for checkpoint, short in ((marian, 1), (m2m, 9), (bert, 1)):  # M2M100: the last language token
        config = type(checkpoint.config)(
            **{**checkpoint.config.to_dict(), "vocab_size": checkpoint.config.vocab_size - short}
        )
        assert "does not match the model" in refused(checkpoint.folder, config)


def test_pad_that_disagrees_with_the_config_is_refused(marian: Checkpoint) -> None:
    config = transformers.MarianConfig(**{**marian.config.to_dict(), "pad_token_id": 2})
    assert "pad id is" in refused(marian.folder, config)


def test_pieces_missing_from_vocab_json_are_refused(tmp_path: Path, bpe: bytes) -> None:
    pieces = normal_pieces(bpe)
    words = write_m2m(tmp_path / "m2m", bpe, pieces[:-5])
    assert "5 pieces of the SentencePiece model are missing from vocab.json" in refused(
        tmp_path / "m2m", m2m_config(words)
    )


def test_multilingual_marian_is_refused(tmp_path: Path, unigram: bytes) -> None:
    vocab = write_marian(tmp_path / "m", unigram, unigram, extra=(">>fra<<", ">>deu<<"))
    config = transformers.MarianConfig(vocab_size=len(vocab), pad_token_id=vocab["<pad>"], eos_token_id=0)
    assert "multilingual Marian checkpoints are not supported" in refused(tmp_path / "m", config)


def test_nllb_without_language_tokens_is_refused(tmp_path: Path, bpe: bytes, nllb: Checkpoint) -> None:
    """transformers 5 reads a SentencePiece-only NLLB folder without the languages as <unk> for every
    language, and without pinned ids it puts <mask> before them, shifting every language id by one."""
    write_nllb(tmp_path / "bare", bpe, pin_ids=False, languages=False)
    assert "maps to the unknown token" in refused(tmp_path / "bare", nllb.config)
    write_nllb(tmp_path / "unpinned", bpe, pin_ids=False)
    assert "before the language tokens" in refused(tmp_path / "unpinned", nllb.config)


def test_unsupported_model_type_is_refused(marian: Checkpoint) -> None:
    assert "unsupported model family 'gpt2'" in refused(marian.folder, transformers.GPT2Config())
