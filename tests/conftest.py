"""Session fixtures: tiny real models (seeded, trained for a few seconds on tasks whose right
answers are known, see `tests.tiny`), their tokenizer, and an exported store."""

from __future__ import annotations

import shutil
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
import torch
from tokenizers import Tokenizer

from export import tokenizer as tokenizer_lib
from export.model import Classifier, ClassifierConfig, Translator, TranslatorConfig, greedy
from export.tokenizer import encode_sources, encode_texts
from service.contract import spans
from service.contract.graphs import pad
from tests.tiny import LABELS, WORDS, expected_label, expected_translation, sentences, tokenizer_texts
from tests.tiny import train_classifier as train_classifier_task
from tests.tiny import train_translator as train_translator_task

pytest_plugins = ["tests.hf_checkpoints"]  # tiny Hugging Face checkpoints' tokenizers

__all__ = ["LABELS", "WORDS", "sentences", "CHECKED_TEXTS"]

# Texts the fixtures prove their model right on before any test runs; tests that assert exact
# answers draw from these.
CHECKED_TEXTS = [
    *sentences(60, seed=3),
    "The cat sees a dog.",
    "A big red house.",
    "The small blue window.",
    "The red cat sees a dog.",
    "Open the blue window.",
    "Open the window.",
    "The red cat.",
    "A blue dog runs.",
    "A dog runs.",
    "The cat 5 sees http://example.org a dog.",
    "Open the file ⟨1⟩ save.",
]


def pytest_configure(config: pytest.Config) -> None:
    """PyTorch on one thread for the whole session (training, export and its validation, whose
    ONNX Runtime sessions take PyTorch's thread count): on a busy 2-core machine two threads
    spin against each other, and a tiny model's forward pass took 30 times as long."""
    torch.set_num_threads(1)


@pytest.fixture(autouse=True)
def one_torch_thread() -> None:
    """Back to one thread before each test: the export and import CLIs set their `--threads`
    (default 2) and leave it."""
    if torch.get_num_threads() != 1:
        torch.set_num_threads(1)


@pytest.fixture(scope="session")
def tiny_tokenizer() -> Tokenizer:
    return tokenizer_lib.train_bpe(tokenizer_texts(), vocab_size=400)


@pytest.fixture(scope="session")
def tiny_translator(tiny_tokenizer: Tokenizer) -> Translator:
    """The word-mapping translator (`tests.tiny.expected_translation`), checked on `CHECKED_TEXTS`."""
    torch.manual_seed(0)
    cfg = TranslatorConfig(
        vocab_size=tiny_tokenizer.get_vocab_size(),
        d_model=64,
        n_heads=4,
        d_ff=128,
        n_layers=1,
        n_dec_layers=2,  # two, so that the page and the attention maps have layers to choose
        max_len=24,
    )
    model = Translator(cfg)  # dropout 0.1 in the config: export must switch it off itself
    t0 = time.perf_counter()
    train_translator_task(model, tiny_tokenizer)
    srcs, masked = encode_sources(tiny_tokenizer, CHECKED_TEXTS, cfg.max_len)
    ids, mask = (torch.from_numpy(a) for a in pad(srcs))
    outs = greedy(model.eval(), ids, mask, cfg.max_len)
    got = [spans.unmask(tiny_tokenizer.decode(o), m.spans) for o, m in zip(outs, masked, strict=True)]
    wrong = [(t, g) for t, g in zip(CHECKED_TEXTS, got, strict=True) if g != expected_translation(t)]
    assert not wrong, f"the tiny translator did not learn its task ({time.perf_counter() - t0:.0f} s): {wrong}"
    return model


@pytest.fixture(scope="session")
def tiny_classifier(tiny_tokenizer: Tokenizer) -> Classifier:
    """The colour-word classifier (`tests.tiny.expected_label`), checked on `CHECKED_TEXTS`."""
    torch.manual_seed(1)
    cfg = ClassifierConfig(
        vocab_size=tiny_tokenizer.get_vocab_size(), d_model=32, n_heads=4, d_ff=64, n_layers=2, max_len=32
    )
    model = Classifier(cfg)
    train_classifier_task(model, tiny_tokenizer)
    ids, mask = (torch.from_numpy(a) for a in pad(encode_texts(tiny_tokenizer, CHECKED_TEXTS, cfg.max_len)))
    with torch.no_grad():
        got = [LABELS[i] for i in model.eval()(ids, mask).argmax(-1).tolist()]
    wrong = [(t, g) for t, g in zip(CHECKED_TEXTS, got, strict=True) if g != expected_label(t)]
    assert not wrong, f"the tiny classifier did not learn its task: {wrong}"
    return model


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


@pytest.fixture(scope="module")
def browser(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Any]:
    """Headless Chromium for one test module's page tests (`tests.browser`; `make browser` installs it)."""
    from tests.browser import start_chromium  # selenium: only for the tests that ask for a browser

    driver = start_chromium(tmp_path_factory.mktemp("chromium"))
    try:
        yield driver
    finally:
        driver.quit()


def corrupt_copy(tiny_store: Path, into: Path) -> Path:
    """A copy of the tiny store whose tiny-mt decoder has one bit flipped: its sha256 no longer
    matches the manifest, so the version is refused at load."""
    store = into / "store"
    shutil.copytree(tiny_store, store)
    onnx = store / "tiny-mt" / "1" / "decoder.onnx"
    data = bytearray(onnx.read_bytes())
    data[len(data) // 2] ^= 0x01
    onnx.write_bytes(bytes(data))
    return store
