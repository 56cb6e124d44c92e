"""The model families the importer serves: one entry per family, the one place a family is known.

Each entry states, once, what CTranslate2's converter states in one loader per config class: the
config mapping (the manifest's `architecture` from the Hugging Face config), the graph builder and
its quirks (norm placement, position offset, refused options; a classifier's loader, class and
positions), the tokenizer conversion (files, SentencePiece model, language codes) and the framing
(the decoder tokens forced per target language). Decoder start, forced BOS/EOS and suppressed ids
come from the checkpoint's generation config for every translator (`export.specs.imported`).

The graph code sees a step model (`export.graphs.StepModel`), never a family name; the plug-ins
(`export.hf.seq2seq`, `export.hf.classifiers`, `export.hf.tokenizer`) take the quirks they are
given. Adding a family is one entry here, plus a plug-in where its layers are new.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass, field
from functools import partial
from pathlib import Path
from typing import Literal

import transformers
from torch import nn

from export.hf import ImportProblem, bart_classifier, classifiers, deberta_classifier, seq2seq, t5
from export.hf import tokenizer as tok
from export.hf.classifiers import ClassifierLayout
from export.hf.seq2seq import Layout
from export.hf.steps import ImportedStep
from export.hf.tokenizer import ImportedTokenizer, SentencePiece, Tokenization

Config = transformers.PretrainedConfig
# A translator's graph builder: (transformers model, decoder start id, suppressed ids, end id) -> step model
StepBuilder = Callable[[nn.Module, int, tuple[int, ...], int], ImportedStep]


@dataclass(frozen=True)
class Family:
    """Everything the importer knows of one family: a `config.model_type` served as one task."""

    model_type: str
    # the spec that publishes it (`export.specs.imported`): "translation", an encoder-decoder (served
    # for translation or text2text), or a classifier
    task: Literal["translation", "classification"]
    architecture: Callable[[Config], dict[str, int | float | str]]  # config mapping: the manifest's dimensions
    check: Callable[[Config], None]  # ImportProblem naming what of a config its graph would not reproduce
    graph: StepBuilder | ClassifierLayout  # a translator's step model builder, a classifier's layout
    tokenization: Tokenization
    # tokenizer class prefix declared in tokenizer_config.json -> the tokenization it needs instead
    tokenizer_variants: dict[str, Tokenization] = field(default_factory=dict)
    # a translator's fp16 and int8 graphs checked against fp32 before they are published (T5: fp16
    # overflows in T5 1.1's feed-forward); the other families' pass the batch-invariance gate only
    variants_checked: bool = False
    # an encoder-decoder published as text-to-text unless told otherwise (T5, BART: summarizers and
    # instruction models read a text whole); the others as translators (`export.specs.imported.served_as`)
    text2text: bool = False

    def tokenization_for(self, folder: Path) -> Tokenization:
        """The tokenization of the checkpoint in `folder`: a variant its declared tokenizer class names."""
        declared = tok.declared_class(folder)
        return next(
            (t for prefix, t in self.tokenizer_variants.items() if declared.startswith(prefix)), self.tokenization
        )


def _classifier_architecture(config: Config) -> dict[str, int | float | str]:
    return {"family": config.model_type, "vocab_size": config.vocab_size}


_BPE_FILES = (("tokenizer.json",), ("vocab.json", "merges.txt"))
_WORDPIECE_FILES = (("tokenizer.json",), ("vocab.txt",))


def _bart_layout(
    model_type: str, layout: Layout, tokenization: Tokenization, text2text: bool = False, **variants: Tokenization
) -> Family:
    """A translator of the BART layer layout (`export.hf.seq2seq`) with its quirks."""
    check = partial(seq2seq.check_supported, layout=layout)
    build = partial(seq2seq.Seq2Seq, layout=layout)
    return Family(
        model_type, "translation", seq2seq.architecture, check, build, tokenization, variants, text2text=text2text
    )


def _t5(model_type: str) -> Family:
    """A T5-layout translator (`export.hf.t5`): T5 1.0 and 1.1, Flan-T5 (model type t5), mT5. Its
    SentencePiece vocabulary (spiece.model, sentinels <extra_id_N>) is converted by transformers'
    own T5 tokenizer when no tokenizer.json is shipped; labels carry no prefix (targets: none)."""
    tokenization = Tokenization(model_type, (("tokenizer.json",), ("spiece.model",)), tok.label_prefix_targets)
    return Family(
        model_type,
        "translation",
        t5.architecture,
        t5.check_supported,
        t5.T5Step,
        tokenization,
        variants_checked=True,
        text2text=True,
    )


def _classifier(model_type: str, layout: ClassifierLayout, files: tuple[tuple[str, ...], ...]) -> Family:
    """A BERT-family sequence classifier (`export.hf.classifiers`) with its quirks; it generates nothing."""
    check = partial(classifiers.check_supported, layout=layout)
    tokenization = Tokenization(model_type, files, tok.no_targets)
    return Family(model_type, "classification", _classifier_architecture, check, layout, tokenization)


FAMILIES: tuple[Family, ...] = (
    _bart_layout(
        "marian",
        Layout(pre_norm=False, position_offset="none"),
        Tokenization(
            "marian",
            (("source.spm", "target.spm", "vocab.json"),),
            tok.label_prefix_targets,
            sentencepiece=SentencePiece("MarianTokenizer", "source.spm", check=tok.check_marian),
        ),
    ),
    _bart_layout(
        "bart",
        Layout(pre_norm=False, position_offset="offset"),
        Tokenization("bart", _BPE_FILES, tok.label_prefix_targets),
        text2text=True,
    ),
    _bart_layout(
        "mbart",
        Layout(pre_norm=True, position_offset="offset"),
        Tokenization("mbart", tok.SPM_OR_JSON, tok.decoder_start_targets, languages=tok.lang_code_languages),
        MBart50=Tokenization("mbart50", tok.SPM_OR_JSON, tok.label_prefix_targets, languages=tok.lang_code_languages),
    ),
    _bart_layout(
        "m2m_100",
        Layout(
            pre_norm=True,
            position_offset="pad",
            refused=(("num_experts", "mixture-of-experts checkpoints (NLLB-MoE)"),),
        ),
        Tokenization(
            "m2m_100",
            (("sentencepiece.bpe.model", "vocab.json"),),
            tok.label_prefix_targets,
            languages=tok.lang_code_languages,
            sentencepiece=SentencePiece("M2M100Tokenizer", "sentencepiece.bpe.model", unknown_to_model_size=True),
        ),
        Nllb=Tokenization("nllb", tok.SPM_OR_JSON, tok.label_prefix_targets, languages=tok.nllb_languages),
    ),
    _t5("t5"),
    _t5("mt5"),
    _classifier(
        "bert", ClassifierLayout(classifiers.bert, "BertForSequenceClassification", segments=True), _WORDPIECE_FILES
    ),
    _classifier(
        "distilbert",
        ClassifierLayout(classifiers.distilbert, "DistilBertForSequenceClassification"),
        _WORDPIECE_FILES,
    ),
    _classifier(
        "roberta",
        ClassifierLayout(classifiers.roberta, "RobertaForSequenceClassification", positions_from_pad=True),
        _BPE_FILES,
    ),
    _classifier(
        "xlm-roberta",
        ClassifierLayout(classifiers.roberta, "XLMRobertaForSequenceClassification", positions_from_pad=True),
        tok.SPM_OR_JSON,
    ),
    _classifier(
        "bart",
        ClassifierLayout(bart_classifier.bart, "BartForSequenceClassification", pool_eos=True),
        _BPE_FILES,
    ),
    _classifier(  # DeBERTa-v2 and v3: disentangled attention over log-bucketed relative positions
        "deberta-v2",
        ClassifierLayout(
            deberta_classifier.deberta,
            "DebertaV2ForSequenceClassification",
            segments=True,  # where type_vocab_size > 1 (v2); v3 has no token type table
            check=deberta_classifier.problems,
        ),
        (("tokenizer.json",), ("spm.model",)),
    ),
)


def family_of(config: Config) -> Family:
    """The family of a checkpoint's config, or ImportProblem naming those served: the entry of its
    `model_type`; where one model type has entries for both tasks, the one its `architectures` name
    (`*ForSequenceClassification`: the classifier). A sequence classifier of a family served only as
    a translator is refused, never published as a translator with its head dropped."""
    kind = getattr(config, "model_type", None)
    found = [f for f in FAMILIES if f.model_type == kind]
    if not found:
        supported = sorted({f.model_type for f in FAMILIES})
        raise ImportProblem(f"unsupported model family {kind!r} (supported: {', '.join(supported)})")
    architectures = getattr(config, "architectures", None) or []
    classifies = bool(architectures) and all(a.endswith("ForSequenceClassification") for a in architectures)
    if not classifies:
        return next((f for f in found if f.task == "translation"), found[0])
    chosen = next((f for f in found if f.task == "classification"), None)
    if chosen is None:  # e.g. a BartForSequenceClassification: never published as a translator
        raise ImportProblem(
            f"{kind}: {', '.join(architectures)} is a sequence classifier, and {kind} classifiers are not "
            "supported (its classification head would be dropped)"
        )
    return chosen


def import_tokenizer(folder: Path, config: Config) -> ImportedTokenizer:
    """The serving tokenizer of the checkpoint in `folder`, converted and framed as its family states."""
    return tok.convert_tokenizer(folder, config, family_of(config).tokenization_for(folder))
