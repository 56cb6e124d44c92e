"""The registry of imported model families (`export.hf.families`): one entry per family and task,
found by the config's model type (and its architectures where a type has two), the tokenization a
checkpoint's declared tokenizer class names. No model is built here."""

from __future__ import annotations

import json
from pathlib import Path

import pytest
import transformers

from export.hf import ImportProblem, families, tokenizer
from export.hf.classifiers import ClassifierLayout, takes_segments
from export.hf.families import FAMILIES, family_of


def test_one_entry_per_model_type_and_task() -> None:
    keys = [(f.model_type, f.task) for f in FAMILIES]
    assert len(keys) == len(set(keys))
    assert {f.model_type for f in FAMILIES} >= {"marian", "bart", "mbart", "m2m_100", "bert", "roberta"}


def test_a_family_is_found_by_its_model_type() -> None:
    assert family_of(transformers.MarianConfig()).task == "translation"
    assert family_of(transformers.XLMRobertaConfig()).task == "classification"
    assert family_of(transformers.T5Config()).task == family_of(transformers.MT5Config()).task == "translation"
    with pytest.raises(ImportProblem, match="unsupported model family 'gpt2' \\(supported: bart, bert, "):
        family_of(transformers.GPT2Config())


def test_deberta_v2_and_v3_are_one_classifier_entry() -> None:
    """cross-encoder/nli-deberta-v3-* and microsoft/deberta-v2-* are both `deberta-v2`: one classifier
    entry, its tokenizer spm.model or tokenizer.json; token types an input only where the config has
    a table of two rows (v2), never for v3 (type_vocab_size 0)."""
    v3 = transformers.DebertaV2Config(type_vocab_size=0, architectures=["DebertaV2ForSequenceClassification"])
    family = family_of(v3)
    assert (family.model_type, family.task) == ("deberta-v2", "classification")
    assert family.tokenization.files == (("tokenizer.json",), ("spm.model",))
    assert isinstance(family.graph, ClassifierLayout)
    assert family.graph.model_class == "DebertaV2ForSequenceClassification"
    assert not takes_segments(v3, family.graph)
    assert takes_segments(transformers.DebertaV2Config(type_vocab_size=2), family.graph)
    assert not takes_segments(
        transformers.DebertaV2Config(type_vocab_size=2), family_of(transformers.RobertaConfig()).graph
    )


def test_two_tasks_of_one_model_type_are_told_apart_by_architectures() -> None:
    """BART has a translator and a classifier entry (bart-large-mnli's class): the checkpoint's
    architectures pick one; none named: the translator."""
    classifier = family_of(transformers.BartConfig(architectures=["BartForSequenceClassification"]))
    translator = family_of(transformers.BartConfig(architectures=["BartForConditionalGeneration"]))
    assert (classifier.model_type, classifier.task) == ("bart", "classification")
    assert (translator.model_type, translator.task) == ("bart", "translation")
    assert family_of(transformers.BartConfig()) is translator


@pytest.mark.parametrize(
    ("config", "declared", "name"),
    [
        (transformers.M2M100Config(), "NllbTokenizer", "nllb"),
        (transformers.M2M100Config(), "M2M100Tokenizer", "m2m_100"),
        (transformers.M2M100Config(), None, "m2m_100"),
        (transformers.MBartConfig(), "MBart50TokenizerFast", "mbart50"),
        (transformers.MBartConfig(), "MBartTokenizer", "mbart"),
    ],
)
def test_the_declared_tokenizer_class_picks_the_tokenization(
    tmp_path: Path, config: transformers.PretrainedConfig, declared: str | None, name: str
) -> None:
    if declared is not None:
        (tmp_path / "tokenizer_config.json").write_text(json.dumps({"tokenizer_class": declared}))
    chosen = family_of(config).tokenization_for(tmp_path)
    assert chosen.name == name
    assert (chosen.targets is tokenizer.decoder_start_targets) == (name == "mbart")


def test_a_sequence_classifier_of_a_translator_family_is_refused(monkeypatch: pytest.MonkeyPatch) -> None:
    """A sequence classifier of a family served only as a translator is refused, never published as
    a translator with its classification head dropped (BartForSequenceClassification was, before
    BART had a classifier entry)."""
    translators = tuple(f for f in FAMILIES if not (f.model_type == "bart" and f.task == "classification"))
    monkeypatch.setattr(families, "FAMILIES", translators)
    with pytest.raises(ImportProblem, match="bart: BartForSequenceClassification is a sequence classifier"):
        families.family_of(transformers.BartConfig(architectures=["BartForSequenceClassification"]))
