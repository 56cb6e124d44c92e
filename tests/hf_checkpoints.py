"""Tiny Hugging Face checkpoints' tokenizer files, built here (nothing is downloaded): each family's
files written the way its checkpoints ship them, from a SentencePiece, WordPiece or byte-level BPE
model trained in well under a second on a multilingual corpus made up here. vocab.json orders are
shuffled, so a conversion that used SentencePiece's ids instead of vocab.json's fails on nearly
every text. Fixtures for tests/test_hf_tokenizer.py and tests/test_import_hf.py (conftest.py).
"""

from __future__ import annotations

import io
import json
import random
import shutil
import warnings
from dataclasses import dataclass
from pathlib import Path

import pytest
import sentencepiece as spm
import torch
import transformers
from sentencepiece import sentencepiece_model_pb2
from tokenizers import Tokenizer, models, normalizers, pre_tokenizers, trainers
from torch import nn
from transformers.models.m2m_100.tokenization_m2m_100 import FAIRSEQ_LANGUAGE_CODES as M2M_CODES
from transformers.models.nllb.tokenization_nllb import FAIRSEQ_LANGUAGE_CODES as NLLB_CODES

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


def train_spm(sentences: list[str], vocab_size: int, model_type: str, **special: int | str) -> bytes:
    """A SentencePiece model trained here; `special`: its special pieces' ids and names (`pad_id`, `pad_piece`, ...)."""
    model = io.BytesIO()
    spm.SentencePieceTrainer.train(
        sentence_iterator=iter(sentences),
        model_writer=model,
        vocab_size=vocab_size,
        model_type=model_type,
        character_coverage=1.0,
        num_threads=1,
        minloglevel=2,
        **special,
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


def t5_files(tmp_path_factory: pytest.TempPathFactory, name: str, shipped_json: bool) -> Path:
    """google-t5's files: spiece.model (<pad> 0, </s> 1, <unk> 2) and 10 sentinels <extra_id_N> after
    the pieces; `shipped_json`: saved again by transformers with its tokenizer.json (mT5, Flan-T5)."""
    folder = tmp_path_factory.mktemp(name)
    model = train_spm(corpus(1200, 1), 400, "unigram", pad_id=0, eos_id=1, unk_id=2, bos_id=-1)
    (folder / "spiece.model").write_bytes(model)
    config = {"tokenizer_class": "T5Tokenizer", "extra_ids": 10, "model_max_length": 512}
    (folder / "tokenizer_config.json").write_text(json.dumps(config))
    if shipped_json:
        transformers.AutoTokenizer.from_pretrained(folder, local_files_only=True).save_pretrained(folder)
    return folder


def _t5_config(kind: type[transformers.PretrainedConfig], folder: Path, **options: object) -> Checkpoint:
    size = len(transformers.AutoTokenizer.from_pretrained(folder, local_files_only=True))
    # the embedding a few rows past the tokenizer, as google's (32128 rows for 32100 ids)
    config = kind(vocab_size=size + 4, pad_token_id=0, eos_token_id=1, decoder_start_token_id=0, **options)
    return Checkpoint(folder, config)


@pytest.fixture(scope="session")
def t5(tmp_path_factory: pytest.TempPathFactory) -> Checkpoint:
    """T5 1.0 (t5-small): ReLU feed-forward, tied head scaled by d_model ** -0.5; spiece.model only."""
    return _t5_config(transformers.T5Config, t5_files(tmp_path_factory, "t5", False), feed_forward_proj="relu")


@pytest.fixture(scope="session")
def flan_t5(tmp_path_factory: pytest.TempPathFactory) -> Checkpoint:
    """T5 1.1 / Flan-T5: gated-GELU feed-forward, a head of its own, unscaled."""
    folder = t5_files(tmp_path_factory, "flan-t5", True)
    return _t5_config(transformers.T5Config, folder, feed_forward_proj="gated-gelu", tie_word_embeddings=False)


@pytest.fixture(scope="session")
def mt5(tmp_path_factory: pytest.TempPathFactory) -> Checkpoint:
    folder = t5_files(tmp_path_factory, "mt5", True)
    return _t5_config(transformers.MT5Config, folder, feed_forward_proj="gated-gelu", tie_word_embeddings=False)


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


DEBERTA_V3 = {  # microsoft/deberta-v3-*'s options (buckets and relative reach scaled to 64 positions)
    "relative_attention": True,
    "pos_att_type": "p2c|c2p",
    "position_buckets": 16,
    "max_relative_positions": -1,  # max_position_embeddings
    "norm_rel_ebd": "layer_norm",
    "share_att_key": True,
    "position_biased_input": False,
    "type_vocab_size": 0,
}
DEBERTA_V2 = {  # DeBERTa-v2's older layout: absolute positions, token types, own position projections, no buckets
    **DEBERTA_V3,
    "position_buckets": -1,
    "max_relative_positions": 24,
    "norm_rel_ebd": "none",
    "share_att_key": False,
    "position_biased_input": True,
    "type_vocab_size": 2,
    "conv_kernel_size": 3,
    "conv_act": "gelu",
}


def deberta_files(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """microsoft/deberta-v3-*'s files: spm.model ([PAD] 0, [CLS] 1, [SEP] 2, [UNK] 3; transformers
    adds [MASK] after the pieces) and tokenizer_config.json, no tokenizer.json."""
    folder = tmp_path_factory.mktemp("deberta")
    ids = {"pad_id": 0, "bos_id": 1, "eos_id": 2, "unk_id": 3}
    pieces = {"pad_piece": "[PAD]", "bos_piece": "[CLS]", "eos_piece": "[SEP]", "unk_piece": "[UNK]"}
    (folder / "spm.model").write_bytes(train_spm(corpus(1200, 6), 400, "unigram", **ids, **pieces))
    specials = {"bos_token": "[CLS]", "eos_token": "[SEP]", "unk_token": "[UNK]", "sep_token": "[SEP]"}
    specials |= {"pad_token": "[PAD]", "cls_token": "[CLS]", "mask_token": "[MASK]"}
    config = {"tokenizer_class": "DebertaV2Tokenizer", "do_lower_case": False, "split_by_punct": False, **specials}
    (folder / "tokenizer_config.json").write_text(json.dumps(config))
    return folder


@pytest.fixture(scope="session")
def deberta(tmp_path_factory: pytest.TempPathFactory) -> Checkpoint:
    """A DeBERTa-v3 (cross-encoder/nli-deberta-v3-*): spm.model only, the embedding past the
    tokenizer (128100 rows for 128001 ids in the real ones)."""
    folder = deberta_files(tmp_path_factory)
    size = len(transformers.AutoTokenizer.from_pretrained(folder, local_files_only=True))
    return Checkpoint(folder, transformers.DebertaV2Config(vocab_size=size + 3, pad_token_id=0, **DEBERTA_V3))


@pytest.fixture(scope="session")
def deberta_v2(tmp_path_factory: pytest.TempPathFactory, deberta: Checkpoint) -> Checkpoint:
    """A DeBERTa-v2-layout config (segments, absolute positions, convolution) over the same
    tokenizer, saved again by transformers (tokenizer.json)."""
    folder = saved(tmp_path_factory, "deberta-v2", deberta.hf())
    config = transformers.DebertaV2Config(vocab_size=deberta.config.vocab_size, pad_token_id=0, **DEBERTA_V2)
    return Checkpoint(folder, config)


# -- tiny random seq2seq checkpoints over these tokenizers (tests/test_import_hf.py, test_serve_checkpoint.py) --

SMALL = {
    "d_model": 32,
    "encoder_layers": 2,
    "decoder_layers": 2,
    "encoder_attention_heads": 4,
    "decoder_attention_heads": 4,
    "encoder_ffn_dim": 48,
    "decoder_ffn_dim": 48,
    "max_position_embeddings": 64,
    "dropout": 0.0,
    "attention_dropout": 0.0,
    "activation_dropout": 0.0,
}
T5_SMALL = {  # 4 heads of 8 over d_model 40: heads x d_kv is not d_model, as in Flan-T5 small
    "d_model": 40,
    "d_kv": 8,
    "d_ff": 48,
    "num_layers": 2,
    "num_decoder_layers": 2,
    "num_heads": 4,
    "relative_attention_num_buckets": 8,
    "relative_attention_max_distance": 20,  # sources and steps of the checks reach past it
    "dropout_rate": 0.0,
}
MODELS = {
    "marian": transformers.MarianMTModel,
    "bart": transformers.BartForConditionalGeneration,
    "mbart": transformers.MBartForConditionalGeneration,
    "m2m_100": transformers.M2M100ForConditionalGeneration,
    "t5": transformers.T5ForConditionalGeneration,
    "mt5": transformers.MT5ForConditionalGeneration,
}


def build(
    tokenizer: Checkpoint,
    folder: Path,
    generation: dict[str, object],
    seed: int = 0,
    eos_bias: float = 6.0,
    **config_options: object,
) -> Path:
    """A save_pretrained folder: the tokenizer's files, a tiny random model over its vocabulary."""
    shutil.copytree(tokenizer.folder, folder)
    base = tokenizer.config
    t5 = base.model_type in ("t5", "mt5")
    config = base.__class__(**{**base.to_diff_dict(), **(T5_SMALL if t5 else SMALL), **config_options})
    config.decoder_start_token_id = base.decoder_start_token_id if base.decoder_start_token_id is not None else 2
    torch.manual_seed(seed)
    model = MODELS[config.model_type](config).eval()
    if t5:
        _t5_weights(model, eos_bias, tied=getattr(base, "scale_decoder_outputs", False))
    else:
        _bart_weights(model, eos_bias)
    model.save_pretrained(folder)
    transformers.GenerationConfig(
        decoder_start_token_id=config.decoder_start_token_id,
        eos_token_id=config.eos_token_id,
        pad_token_id=config.pad_token_id,
        **generation,
    ).save_pretrained(folder)
    return folder


def _t5_weights(model: nn.Module, eos_bias: float, tied: bool) -> None:
    """Weights away from the initialisation (0.2: the gated feed-forward's products grow fast enough
    at 0.3 that fp32's rounding alone moves a log-probability past 1e-4); an untied head of its own
    (T5 1.1, mT5) at the scale T5 1.0 gives its tied one. T5 has no logits bias: EOS is made likelier
    along the mean direction of the decoder's last hidden states."""
    with torch.no_grad():
        for p in model.parameters():
            p.add_(torch.randn_like(p) * 0.2)
        head = model.get_output_embeddings()
        if not tied:
            head.weight = nn.Parameter((head.weight + 0.3 * torch.randn_like(head.weight)) * model.config.d_model**-0.5)
        ids = torch.randint(3, model.config.vocab_size - 20, (16, 12), generator=torch.Generator().manual_seed(0))
        hidden = model(input_ids=ids, decoder_input_ids=ids, output_hidden_states=True).decoder_hidden_states[-1]
        mean = (hidden * (model.config.d_model**-0.5 if tied else 1.0)).mean((0, 1))
        head.weight[model.config.eos_token_id] += eos_bias * mean / mean.dot(mean)


def _bart_weights(model: nn.Module, eos_bias: float) -> None:
    config = model.config
    with torch.no_grad():
        for p in model.parameters():  # well away from the initialisation, so no check passes by luck
            p.add_(torch.randn_like(p) * 0.3)
        # EOS made likelier, so sentences end at varied lengths and beam search's stopping rules matter
        eos, output = config.eos_token_id, model.get_output_embeddings().weight
        if hasattr(model, "final_logits_bias"):
            model.final_logits_bias.normal_()
            model.final_logits_bias[0, eos] += eos_bias
        else:  # M2M100: through the decoder's final layer norm, along the EOS row of the output projection
            model.get_decoder().layer_norm.bias.add_(eos_bias * output[eos] / output[eos].dot(output[eos]))


FAMILY_CASES = {
    # fixture, generation config (as checkpoints of the family ship it), target language
    "marian": ("marian", {"num_beams": 4, "max_length": 20, "bad_words_ids": [[None]], "forced_eos_token_id": 0}, None),
    "bart": ("bart", {"num_beams": 4, "max_length": 20, "early_stopping": True, "length_penalty": 2.0}, None),
    "nllb": ("nllb", {"num_beams": 4, "max_length": 20, "length_penalty": 2.0}, "fra_Latn"),
    "m2m": ("m2m", {"num_beams": 4, "max_length": 20, "early_stopping": True}, "fr"),  # fairseq's tokenizer, converted
    "mbart50": ("mbart50", {"num_beams": 4, "max_length": 20, "early_stopping": "never"}, "de_DE"),
    "t5": ("t5", {"num_beams": 4, "max_length": 20, "early_stopping": True}, None),
    "flan_t5": ("flan_t5", {"num_beams": 4, "max_length": 20, "length_penalty": 2.0}, None),
    "mt5": ("mt5", {"num_beams": 4, "max_length": 20}, None),
}


# -- tiny random sequence classifiers over these tokenizers (tests/test_hf_classifiers.py: pairs) --

CLASSIFIER_SIZES = {
    "hidden_size": 32,
    "num_hidden_layers": 2,
    "num_attention_heads": 4,
    "intermediate_size": 37,
    "max_position_embeddings": 64,
}


def build_classifier(tokenizer: Checkpoint, folder: Path, id2label: dict[int, str], seed: int = 0) -> Path:
    """A save_pretrained folder: the tokenizer's files, a tiny random `*ForSequenceClassification`
    of its family over its vocabulary, every weight moved well off its initial value (the token
    type table too, so a wrong segment shows in the logits)."""
    shutil.copytree(tokenizer.folder, folder)
    base = tokenizer.config
    labels = {"id2label": id2label, "label2id": {v: k for k, v in id2label.items()}}
    sizes = SMALL if base.is_encoder_decoder else CLASSIFIER_SIZES
    # DeBERTa's config keeps the pooler width it was made with: it follows the new hidden size
    diff = {k: v for k, v in base.to_diff_dict().items() if k != "pooler_hidden_size"}
    config = base.__class__(**{**diff, **sizes, **labels})
    torch.manual_seed(seed)
    model = transformers.AutoModelForSequenceClassification.from_config(config).eval()
    with torch.no_grad():
        for p in model.parameters():
            p.add_(torch.randn_like(p) * 0.3)
    model.save_pretrained(folder)
    return folder
