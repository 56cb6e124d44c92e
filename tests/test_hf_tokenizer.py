"""export.hf.tokenizer against transformers, on tiny checkpoints built here (nothing is downloaded).

Each family's tokenizer files are written the way its checkpoints ship them, from a SentencePiece,
WordPiece or byte-level BPE model trained in well under a second on a multilingual corpus made up
here. vocab.json orders are shuffled, so a conversion that used SentencePiece's ids instead of
vocab.json's would fail on nearly every text.
"""

from __future__ import annotations

import io
import json
import random
import shutil
import warnings
from collections.abc import Sequence
from dataclasses import dataclass
from pathlib import Path

import pytest
import sentencepiece as spm
import transformers
from sentencepiece import sentencepiece_model_pb2
from tokenizers import Tokenizer, models, normalizers, pre_tokenizers, trainers
from transformers.models.m2m_100.tokenization_m2m_100 import FAIRSEQ_LANGUAGE_CODES as M2M_CODES
from transformers.models.nllb.tokenization_nllb import FAIRSEQ_LANGUAGE_CODES as NLLB_CODES

from export.hf import ImportProblem
from export.hf.tokenizer import ImportedTokenizer, import_tokenizer

SCRIPTS = (
    "abcdefghijklmnopqrstuvwxyzéèàçñöüßø",
    "абвгдежзиклмнопрстуфхцчшыэюя",
    "αβγδεζηθικλμνξοπρστυφχψω",
    "的一是不了人我在有他这中大来上国个到说们为子和你地出道也时年",
    "ابتثجحخدذرزسشصضطظعغفقكلمنهوي",
)


def corpus(n: int, seed: int) -> list[str]:
    """Sentences of made-up words in five scripts, with capitals, digits and punctuation."""
    rng = random.Random(seed)
    out = []
    for _ in range(n):
        script = rng.choice(SCRIPTS)
        words = []
        for _ in range(rng.randint(3, 10)):
            word = "".join(rng.choice(script) for _ in range(rng.randint(1, 6)))
            word = word.capitalize() if rng.random() < 0.2 else word
            word = str(rng.randint(0, 9999)) if rng.random() < 0.05 else word
            words.append(word + (rng.choice(",.!?;:") if rng.random() < 0.1 else ""))
        out.append(("" if script == SCRIPTS[3] else " ").join(words))
    return out


def texts() -> list[str]:
    """Over 200 texts: every script, characters no model saw, emoji, specials, whitespace."""
    fixed = [
        *("", " ", "   ", "\t", "\n", " \n\t ", "a", "  leading", "trailing  ", "in   between", "x\ty\nz"),
        *("Hello, world!", "café naïve", "e\u0301", "ﬁ ligature", "① ② Ⅻ", "ＡＢＣ１２３", "½ ¼", "™ ©"),
        *("\u200b zero\u200bwidth", "😀", "😀😀 👍🏽 ❤️", "👨‍👩‍👧", "☃ ♞ ∑ ∫", "עברית", "ไทย", "हिन्दी"),
        *("한국어", "日本語のテキスト", "</s>", "<unk>", "<pad>", "<s>", "<mask>", "[CLS] [SEP]", "a</s>b"),
        *("x <unk> y", "text </s>", "__en__ and __fr__", "eng_Latn", "ro_RO x", "12345 67.89 1,000,000"),
        *("$%^&*()[]{}", "--- ... !!!", "'quoted' \"double\"", "can't won't", "a.b.c", "▁", "▁▁x", " ▁ "),
    ]
    rng = random.Random(5)
    chars = "".join(SCRIPTS) + " ,.!?0123456789ЖΩ✓€£ĳœøåł" + "  "
    sentences = corpus(200, 11)
    soup = ["".join(rng.choice(chars) for _ in range(rng.randint(1, 40))) for _ in range(100)]
    mixed = [f"{rng.choice(sentences)} {rng.choice(fixed[12:])} {rng.choice(sentences)}" for _ in range(30)]
    return [*fixed, *sentences[:80], *soup, *mixed]


TEXTS = texts()


def train_spm(sentences: list[str], vocab_size: int, model_type: str) -> bytes:
    model = io.BytesIO()
    spm.SentencePieceTrainer.train(
        sentence_iterator=iter(sentences),
        model_writer=model,
        vocab_size=vocab_size,
        model_type=model_type,
        character_coverage=1.0,
        num_threads=1,
        minloglevel=2,
    )
    return model.getvalue()


def normal_pieces(model: bytes) -> list[str]:
    proto = sentencepiece_model_pb2.ModelProto()
    proto.ParseFromString(model)
    return [p.piece for p in proto.pieces if p.type == 1]


def shuffled(tokens: list[str], seed: int) -> list[str]:
    tokens = list(tokens)
    random.Random(seed).shuffle(tokens)
    return tokens


@pytest.fixture(scope="session")
def unigram() -> bytes:
    return train_spm(corpus(1200, 1), 400, "unigram")


@pytest.fixture(scope="session")
def bpe() -> bytes:
    return train_spm(corpus(1200, 1), 400, "bpe")


@dataclass
class Checkpoint:
    """A tokenizer folder, the model config that goes with it, and transformers' tokenizer for both."""

    folder: Path
    config: transformers.PretrainedConfig

    def hf(self) -> transformers.PreTrainedTokenizerBase:
        with warnings.catch_warnings():
            warnings.simplefilter("ignore")  # Marian's "Recommended: pip install sacremoses"
            return transformers.AutoTokenizer.from_pretrained(self.folder, config=self.config, local_files_only=True)


def added(content: str, lstrip: bool = False) -> dict[str, object]:
    flags = {"lstrip": lstrip, "normalized": False, "rstrip": False, "single_word": False, "special": True}
    return {"content": content, **flags}


def write_marian(folder: Path, source: bytes, target: bytes, extra: tuple[str, ...] = ()) -> dict[str, int]:
    """source.spm, target.spm and a vocab.json over both in Marian's layout: </s> 0, <unk> 1, <pad> last."""
    folder.mkdir(parents=True, exist_ok=True)
    (folder / "source.spm").write_bytes(source)
    (folder / "target.spm").write_bytes(target)
    pieces = list(dict.fromkeys([*normal_pieces(source), *normal_pieces(target), *extra]))
    vocab = {"</s>": 0, "<unk>": 1, **{p: i + 2 for i, p in enumerate(shuffled(pieces, 0))}}
    vocab["<pad>"] = len(vocab)
    (folder / "vocab.json").write_text(json.dumps(vocab))
    return vocab


@pytest.fixture(scope="session")
def marian(tmp_path_factory: pytest.TempPathFactory, unigram: bytes) -> Checkpoint:
    target = train_spm(corpus(1200, 2), 450, "unigram")  # the same scripts, different pieces
    files = tmp_path_factory.mktemp("marian-files")
    vocab = write_marian(files, unigram, target)
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        tok = transformers.MarianTokenizer(
            source_spm=str(files / "source.spm"), target_spm=str(files / "target.spm"), vocab=str(files / "vocab.json")
        )
    folder = tmp_path_factory.mktemp("marian")
    tok.save_pretrained(folder)
    pad = vocab["<pad>"]
    config = transformers.MarianConfig(
        vocab_size=len(vocab), pad_token_id=pad, eos_token_id=0, decoder_start_token_id=pad
    )
    return Checkpoint(folder, config)


def write_m2m(folder: Path, model: bytes, pieces: list[str]) -> int:
    """The files of facebook/m2m100_*: fairseq's dictionary as vocab.json, languages after it, as specials."""
    folder.mkdir(parents=True, exist_ok=True)
    (folder / "sentencepiece.bpe.model").write_bytes(model)
    vocab = {"<s>": 0, "<pad>": 1, "</s>": 2, "<unk>": 3, **{p: i + 4 for i, p in enumerate(pieces)}}
    (folder / "vocab.json").write_text(json.dumps(vocab))
    languages = [f"__{c}__" for c in M2M_CODES["m2m100"]]
    specials = {
        "bos_token": "<s>",
        "eos_token": "</s>",
        "sep_token": "</s>",
        "unk_token": "<unk>",
        "pad_token": "<pad>",
    }
    config = {**specials, "language_codes": "m2m100", "num_madeup_words": 8, "tokenizer_class": "M2M100Tokenizer"}
    (folder / "tokenizer_config.json").write_text(json.dumps({**config, "additional_special_tokens": languages}))
    (folder / "special_tokens_map.json").write_text(json.dumps({**specials, "additional_special_tokens": languages}))
    return len(vocab)


def m2m_config(words: int) -> transformers.M2M100Config:
    return transformers.M2M100Config(vocab_size=words + 100 + 8, pad_token_id=1, eos_token_id=2, bos_token_id=0)


@pytest.fixture(scope="session")
def m2m(tmp_path_factory: pytest.TempPathFactory, bpe: bytes) -> Checkpoint:
    folder = tmp_path_factory.mktemp("m2m") / "hub"
    words = write_m2m(folder, bpe, shuffled(normal_pieces(bpe), 1))
    return Checkpoint(folder, m2m_config(words))


@pytest.fixture(scope="session")
def m2m_saved(tmp_path_factory: pytest.TempPathFactory, m2m: Checkpoint) -> Checkpoint:
    """The same checkpoint through M2M100Tokenizer.save_pretrained (transformers 5 writes no languages)."""
    folder = tmp_path_factory.mktemp("m2m-saved")
    hf = transformers.M2M100Tokenizer(
        vocab_file=str(m2m.folder / "vocab.json"), spm_file=str(m2m.folder / "sentencepiece.bpe.model")
    )
    hf.save_pretrained(folder)
    return Checkpoint(folder, m2m.config)


def write_nllb(folder: Path, model: bytes, pin_ids: bool = True, languages: bool = True) -> int:
    """facebook/nllb-200-* without tokenizer.json: fairseq ids, languages then <mask> after the text pieces."""
    folder.mkdir(parents=True, exist_ok=True)
    (folder / "sentencepiece.bpe.model").write_bytes(model)
    words = 4 + len(normal_pieces(model))  # <s> <pad> </s> <unk>, then every piece but SentencePiece's three
    ids = {str(i): added(t) for i, t in enumerate(["<s>", "<pad>", "</s>", "<unk>"])}
    ids |= {str(words + i): added(code) for i, code in enumerate(NLLB_CODES)}
    ids[str(words + len(NLLB_CODES))] = added("<mask>", lstrip=True)
    specials = {"bos_token": "<s>", "eos_token": "</s>", "sep_token": "</s>", "cls_token": "<s>"}
    specials |= {"unk_token": "<unk>", "pad_token": "<pad>", "mask_token": "<mask>"}
    config = {**specials, "tokenizer_class": "NllbTokenizer", "src_lang": "eng_Latn", "legacy_behaviour": False}
    config |= {"additional_special_tokens": NLLB_CODES} if languages else {}
    config |= {"added_tokens_decoder": ids} if pin_ids else {}
    (folder / "tokenizer_config.json").write_text(json.dumps(config))
    return words + len(NLLB_CODES) + 1


@pytest.fixture(scope="session")
def nllb(tmp_path_factory: pytest.TempPathFactory, bpe: bytes) -> Checkpoint:
    folder = tmp_path_factory.mktemp("nllb") / "spm-only"
    size = write_nllb(folder, bpe)
    return Checkpoint(folder, transformers.M2M100Config(vocab_size=size + 2, pad_token_id=1, eos_token_id=2))


@pytest.fixture(scope="session")
def nllb_json(tmp_path_factory: pytest.TempPathFactory, nllb: Checkpoint) -> Checkpoint:
    folder = tmp_path_factory.mktemp("nllb-json")
    nllb.hf().save_pretrained(folder)
    assert (folder / "tokenizer.json").is_file()
    return Checkpoint(folder, nllb.config)


def from_spm(
    tmp_path_factory: pytest.TempPathFactory, name: str, model: bytes, tokenizer_class: str
) -> tuple[Path, transformers.PreTrainedTokenizerBase]:
    """A folder with the SentencePiece model only, loaded by transformers and saved again (tokenizer.json)."""
    files = tmp_path_factory.mktemp(f"{name}-spm")
    (files / "sentencepiece.bpe.model").write_bytes(model)
    (files / "tokenizer_config.json").write_text(json.dumps({"tokenizer_class": tokenizer_class}))
    hf = transformers.AutoTokenizer.from_pretrained(files, local_files_only=True)
    folder = tmp_path_factory.mktemp(name)
    hf.save_pretrained(folder)
    return folder, hf


@pytest.fixture(scope="session")
def mbart50(tmp_path_factory: pytest.TempPathFactory, unigram: bytes) -> Checkpoint:
    folder, hf = from_spm(tmp_path_factory, "mbart50", unigram, "MBart50Tokenizer")
    return Checkpoint(folder, transformers.MBartConfig(vocab_size=len(hf), pad_token_id=1, eos_token_id=2))


@pytest.fixture(scope="session")
def mbart(tmp_path_factory: pytest.TempPathFactory, unigram: bytes) -> Checkpoint:
    """mBART-cc25 fine-tuned into Romanian (facebook/mbart-large-en-ro): the decoder starts with ro_RO."""
    folder, hf = from_spm(tmp_path_factory, "mbart", unigram, "MBartTokenizer")
    start = hf.convert_tokens_to_ids("ro_RO")
    config = transformers.MBartConfig(vocab_size=len(hf), pad_token_id=1, eos_token_id=2, decoder_start_token_id=start)
    return Checkpoint(folder, config)


@pytest.fixture(scope="session")
def xlmr(tmp_path_factory: pytest.TempPathFactory, unigram: bytes) -> Checkpoint:
    folder, hf = from_spm(tmp_path_factory, "xlmr", unigram, "XLMRobertaTokenizer")
    return Checkpoint(folder, transformers.XLMRobertaConfig(vocab_size=len(hf), pad_token_id=1))


@pytest.fixture(scope="session")
def wordpiece() -> dict[str, int]:
    tok = Tokenizer(models.WordPiece(unk_token="[UNK]"))
    tok.normalizer = normalizers.BertNormalizer(lowercase=True)
    tok.pre_tokenizer = pre_tokenizers.BertPreTokenizer()
    specials = ["[PAD]", "[UNK]", "[CLS]", "[SEP]", "[MASK]"]
    tok.train_from_iterator(corpus(1200, 3), trainers.WordPieceTrainer(vocab_size=600, special_tokens=specials))
    return tok.get_vocab()


@pytest.fixture(scope="session")
def byte_bpe() -> tuple[dict[str, int], list[tuple[str, str]]]:
    tok = Tokenizer(models.BPE())
    tok.pre_tokenizer = pre_tokenizers.ByteLevel(add_prefix_space=False)
    specials = ["<s>", "<pad>", "</s>", "<unk>", "<mask>"]
    trainer = trainers.BpeTrainer(
        vocab_size=700, special_tokens=specials, initial_alphabet=pre_tokenizers.ByteLevel.alphabet()
    )
    tok.train_from_iterator(corpus(1200, 4), trainer)
    model = json.loads(tok.to_str())["model"]
    return model["vocab"], [tuple(m) if isinstance(m, list) else tuple(m.split(" ")) for m in model["merges"]]


def saved(tmp_path_factory: pytest.TempPathFactory, name: str, hf: transformers.PreTrainedTokenizerBase) -> Path:
    folder = tmp_path_factory.mktemp(name)
    hf.save_pretrained(folder)
    return folder


@pytest.fixture(scope="session")
def bert(tmp_path_factory: pytest.TempPathFactory, wordpiece: dict[str, int]) -> Checkpoint:
    folder = saved(tmp_path_factory, "bert", transformers.BertTokenizer(vocab=wordpiece))
    return Checkpoint(folder, transformers.BertConfig(vocab_size=len(wordpiece), pad_token_id=0))


@pytest.fixture(scope="session")
def distilbert(tmp_path_factory: pytest.TempPathFactory, wordpiece: dict[str, int]) -> Checkpoint:
    folder = saved(tmp_path_factory, "distilbert", transformers.DistilBertTokenizer(vocab=wordpiece))
    return Checkpoint(folder, transformers.DistilBertConfig(vocab_size=len(wordpiece), pad_token_id=0))


@pytest.fixture(scope="session")
def roberta(tmp_path_factory: pytest.TempPathFactory, byte_bpe: tuple) -> Checkpoint:
    vocab, merges = byte_bpe
    folder = saved(tmp_path_factory, "roberta", transformers.RobertaTokenizer(vocab=vocab, merges=merges))
    config = transformers.RobertaConfig(vocab_size=len(vocab), pad_token_id=1, bos_token_id=0, eos_token_id=2)
    return Checkpoint(folder, config)


@pytest.fixture(scope="session")
def bart(tmp_path_factory: pytest.TempPathFactory, byte_bpe: tuple) -> Checkpoint:
    vocab, merges = byte_bpe
    folder = saved(tmp_path_factory, "bart", transformers.BartTokenizer(vocab=vocab, merges=merges))
    return Checkpoint(folder, transformers.BartConfig(vocab_size=len(vocab), pad_token_id=1, eos_token_id=2))


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
    assert_decodes_like(hf, imported, "fr", random_ids(m2m.config.vocab_size - 8, 2))


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


def test_a_bart_classifier_has_no_targets(bart: Checkpoint) -> None:
    config = transformers.BartConfig(**{**bart.config.to_dict(), "architectures": ["BartForSequenceClassification"]})
    assert import_tokenizer(bart.folder, config).targets == {}


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
    assert "model type 't5' is not supported" in refused(marian.folder, transformers.T5Config())
