"""Recovering a trainable model from a published version's float graphs (`export.recover`)."""

from __future__ import annotations

import json
import shutil
from pathlib import Path

import pytest
import torch

from export import recover, train
from export.model import Classifier, Translator


def test_fp32_graphs_give_back_the_exact_weights(tiny_store: Path, tiny_translator: Translator) -> None:
    got = recover.recover_translator(tiny_store / "tiny-mt" / "1", "fp32").state_dict()
    for key, want in tiny_translator.state_dict().items():
        assert torch.equal(got[key], want), key


def test_fp16_graphs_give_the_weights_rounded_to_fp16(tiny_store: Path, tiny_translator: Translator) -> None:
    got = recover.recover_translator(tiny_store / "tiny-mt" / "1", "fp16").state_dict()
    for key, want in tiny_translator.state_dict().items():
        assert torch.equal(got[key], want.half().float()), key


def test_int8_graphs_and_classifiers_are_refused(tiny_store: Path) -> None:
    with pytest.raises(recover.RecoverError, match="quantised"):
        recover.recover_translator(tiny_store / "tiny-mt" / "1", "int8")
    with pytest.raises(recover.RecoverError, match="not a translation model"):
        recover.recover_translator(tiny_store / "tiny-clf" / "1", "fp32")
    with pytest.raises(recover.RecoverError, match="quantised"):
        recover.recover_classifier(tiny_store / "tiny-clf" / "1", "int8")
    with pytest.raises(recover.RecoverError, match="not a classification model"):
        recover.recover_classifier(tiny_store / "tiny-mt" / "1", "fp32")


@pytest.mark.parametrize("variant", ["fp32", "fp16"])
def test_a_classifier_comes_back_from_its_float_graph(
    tiny_store: Path, tiny_classifier: Classifier, variant: str
) -> None:
    got = recover.recover(tiny_store / "tiny-clf" / "1", variant).state_dict()
    assert set(got) == set(tiny_classifier.state_dict())
    for key, want in tiny_classifier.state_dict().items():
        assert torch.equal(got[key], want if variant == "fp32" else want.half().float()), key


def test_a_recovered_classifier_run_loads_with_its_report(tiny_store: Path, tmp_path: Path) -> None:
    """The run folder is one `export.publish` takes: the checkpoint loads, and the version's training
    report comes along for the new manifest."""
    version = tiny_store / "tiny-clf" / "1"
    assert recover.main([str(version), "--out", str(tmp_path / "run"), "--variant", "fp32"]) == 0
    model, _ = train.load_checkpoint(tmp_path / "run")
    assert isinstance(model, Classifier)
    manifest = json.loads((version / "manifest.json").read_text())
    report = json.loads((tmp_path / "run" / "report.json").read_text())
    assert report == manifest["metrics"].get("train", {})
    assert report.get("span_rules", 1) == manifest["span_rules"]


def test_a_recovered_run_trains_on_from_where_the_version_stood(
    tiny_store: Path, tiny_translator: Translator, tmp_path: Path
) -> None:
    """`export.train translator --init` takes the run's weights and tokenizer; at a zero learning rate
    the trained model is the one it started from, and another architecture is refused in one line."""
    version = tiny_store / "tiny-mt" / "1"
    assert recover.main([str(version), "--out", str(tmp_path / "recovered"), "--variant", "fp32"]) == 0
    data = tmp_path / "data" / "translation"
    data.mkdir(parents=True)
    rows = "".join(f'{{"en": "one two {i}", "de": "eins zwei {i}", "source": "x"}}\n' for i in range(40))
    for split in ("train", "valid", "test"):
        (data / f"{split}.jsonl").write_text(rows)
    c = tiny_translator.config
    shape = ["--d-model", str(c.d_model), "--heads", str(c.n_heads), "--d-ff", str(c.d_ff), "--layers", str(c.n_layers)]
    shape += ["--dec-layers", str(c.n_dec_layers), "--max-len", str(c.max_len), "--dropout", str(c.dropout)]
    args = ["translator", "--data-dir", str(tmp_path / "data"), "--init", str(tmp_path / "recovered"), *shape]
    args += [
        "--steps",
        "4",
        "--eval-every",
        "2",
        "--warmup",
        "1",
        "--lr",
        "0",
        "--batch-tokens",
        "200",
        "--threads",
        "1",
    ]
    train.main([*args, "--out", str(tmp_path / "on")])
    model, _ = train.load_checkpoint(tmp_path / "on")
    for key, want in tiny_translator.state_dict().items():  # (the last checkpoints' mean: within rounding)
        torch.testing.assert_close(model.state_dict()[key], want, rtol=1e-6, atol=1e-7, msg=key)
    assert (tmp_path / "on" / "tokenizer.json").read_bytes() == (version / "tokenizer.json").read_bytes()
    shutil.rmtree(tmp_path / "on")
    with pytest.raises(SystemExit, match="train failed: --init .* architecture differs"):
        train.main([*args, "--out", str(tmp_path / "on"), "--d-ff", str(2 * c.d_ff)])
