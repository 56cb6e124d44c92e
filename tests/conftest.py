"""Session fixtures: tiny real models (random-init, seeded), their tokenizer, and an exported store."""

from __future__ import annotations

from pathlib import Path

import pytest
import torch
from tokenizers import Tokenizer

from export import tokenizer as tokenizer_lib
from export.model import Classifier, ClassifierConfig, Translator, TranslatorConfig

WORDS = "the a cat dog house tree red blue small big runs sleeps sees file open save close window".split()
LABELS = ["negative", "neutral", "positive"]


def sentences(n: int, seed: int = 0) -> list[str]:
    g = torch.Generator().manual_seed(seed)
    out = []
    for _ in range(n):
        k = int(torch.randint(2, 9, (1,), generator=g))
        idx = torch.randint(0, len(WORDS), (k,), generator=g).tolist()
        out.append(" ".join(WORDS[i] for i in idx).capitalize() + ".")
    return out


@pytest.fixture(scope="session")
def tiny_tokenizer() -> Tokenizer:
    return tokenizer_lib.train_bpe(sentences(400), vocab_size=400)


@pytest.fixture(scope="session")
def tiny_translator(tiny_tokenizer: Tokenizer) -> Translator:
    torch.manual_seed(0)
    cfg = TranslatorConfig(
        vocab_size=tiny_tokenizer.get_vocab_size(),
        d_model=32,
        n_heads=4,
        d_ff=64,
        n_layers=2,
        n_dec_layers=2,
        max_len=24,
    )
    return Translator(cfg).eval()  # dropout 0.1 in the config: export must switch it off itself


@pytest.fixture(scope="session")
def tiny_classifier(tiny_tokenizer: Tokenizer) -> Classifier:
    torch.manual_seed(1)
    cfg = ClassifierConfig(
        vocab_size=tiny_tokenizer.get_vocab_size(), d_model=32, n_heads=4, d_ff=64, n_layers=2, max_len=32
    )
    return Classifier(cfg).eval()


@pytest.fixture(scope="session")
def tiny_store(
    tmp_path_factory: pytest.TempPathFactory,
    tiny_tokenizer: Tokenizer,
    tiny_translator: Translator,
    tiny_classifier: Classifier,
) -> Path:
    """A model store with `tiny-clf` and `tiny-mt` version 1, fp32 + int8 + fp16 variants; tiny-mt
    keeps its run's training curves (a figure) besides the positional encodings every version keeps."""
    from export.publish import ExportOptions, export_model
    from export.train import History, plot_history

    store = tmp_path_factory.mktemp("store")
    curves = tmp_path_factory.mktemp("run") / "curves.png"
    plot_history({"translator": History([1, 2, 3], [3.0, 2.6, 2.4], [3], [1.5], "bleu")}, curves)
    texts = sentences(120, seed=7)
    variants = ("fp32", "int8", "fp16")
    clf = ExportOptions("tiny-clf", 1, variants=variants, labels=tuple(LABELS))
    export_model(tiny_classifier, tiny_tokenizer, store, clf, validation_texts=texts, log=lambda _: None)
    mt = ExportOptions("tiny-mt", 1, variants=variants, source_language="en", target_language="de", figures=(curves,))
    export_model(tiny_translator, tiny_tokenizer, store, mt, validation_texts=texts, log=lambda _: None)
    return store
