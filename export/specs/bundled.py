"""The project's own checkpoints (`export.model.Classifier`, `export.model.Translator`) as specs.

Their graphs are checked against the PyTorch model on real sentences of the validation split:
every output within the variant's tolerance, and for a translator cached ONNX greedy decoding
against uncached PyTorch greedy decoding, token for token; every variant is measured on the test
split, which nothing else has seen. `spec_for` picks the spec by the model's class.
"""

from __future__ import annotations

from abc import abstractmethod
from collections.abc import Callable, Mapping, Sequence
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import ClassVar

from tokenizers import Tokenizer
from torch import nn

from export import figures as figures_lib
from export import validate
from export.data import SENTIMENT_LABELS, spread
from export.graphs import classifier_io, translator_io, write_classifier, write_translator
from export.model import Classifier, Translator
from export.specs import CALIBRATION_SENTENCES, MAX_NEW_TOKENS, Description, Feeds, ModelSpec, PublishOptions
from export.tokenizer import encode_sources, encode_texts
from export.validate import ExportError
from service.contract.graphs import SPECIAL_IDS
from service.contract.manifest import Generation

COMMON_WORDS = "common_words.txt"  # a translator's words never masked as names (verbatim.common_words)


@dataclass(frozen=True)
class ExportOptions(PublishOptions):
    """How one of the project's own checkpoints is exported, validated and published."""

    labels: tuple[str, ...] = ()  # classifiers
    source_language: str | None = None  # translators (BCP 47)
    target_language: str | None = None
    generation: Generation = field(default_factory=Generation)  # translators: the decoding a request gets by default
    min_parity_sentences: int = 100
    # test-split rows each variant's figures are measured on, spread over the split; 0: all of them.
    # The gates (parity, batch invariance) run on the validation split and do not depend on it.
    test_rows: int = 500
    train_metrics: Mapping[str, object] = field(default_factory=dict)
    data_sources: tuple[Mapping[str, str], ...] = ()
    figures: tuple[Path, ...] = ()  # PNGs kept in the version, named by their stem (the run's curves.png)
    span_rules: int = 1  # translators: the masking rules of its training (the run's report says)
    common_words: frozenset[str] = frozenset()  # translators: never masked as names (verbatim.common_words)


class BundledSpec(ModelSpec):
    """A checkpoint of `export.train`: its tokenizer, its run's figures and metrics, the data build's
    validation sentences (parity, batch invariance, calibration) and test rows (the figures)."""

    seconds_metric = "export_seconds"
    dataset: ClassVar[str]  # the data build's folder of its validation and test splits
    text_field: ClassVar[str]  # the field of a row that holds its input text
    dataset_labels: ClassVar[tuple[str, ...]] = ()  # the labels of its dataset, in id order
    model: Classifier | Translator

    def __init__(
        self,
        model: nn.Module,
        tok: Tokenizer,
        options: ExportOptions,
        validation_texts: Sequence[str] = (),
        test_rows: Sequence[dict] = (),
    ) -> None:
        figures_lib.check_extra(options.figures)
        self.model = model.eval().cpu()  # type: ignore[assignment]  # of the class the spec is registered for
        self.tok, self.options = tok, options
        self.split_rows = len(test_rows)
        self.test_rows = spread(test_rows, options.test_rows)
        self.seqs = self.encode(validation_texts) if validation_texts else []

    @abstractmethod
    def encode(self, texts: Sequence[str]) -> list[list[int]]:
        """Validation texts as the model's inputs."""

    def calibration_sentences(self) -> list[list[int]]:
        return self.seqs[:CALIBRATION_SENTENCES]

    def first_metrics(self) -> dict[str, object]:
        evaluated = {"test_rows": {"evaluated": len(self.test_rows), "split": self.split_rows}}
        return {"train": dict(self.options.train_metrics)} | (evaluated if self.test_rows else {})

    def write_tokenizer(self, folder: Path) -> str:
        self.tok.save(str(folder / "tokenizer.json"))
        return "tokenizer.json"

    def write_extras(self, folder: Path, name: str, version: int, metrics: dict[str, object]) -> dict[str, str]:
        c = self.model.config
        return figures_lib.write_figures(folder, c.max_len, c.d_model, self.options.figures)

    def _description(self, **fields: object) -> Description:
        return Description(
            architecture=asdict(self.model.config),
            special_tokens=SPECIAL_IDS,
            data_sources=[dict(s) for s in self.options.data_sources],
            **fields,  # type: ignore[arg-type]
        )


SPECS: dict[type[nn.Module], type[BundledSpec]] = {}


def register(model_class: type[nn.Module]) -> Callable[[type[BundledSpec]], type[BundledSpec]]:
    def add(spec: type[BundledSpec]) -> type[BundledSpec]:
        SPECS[model_class] = spec
        return spec

    return add


def spec_for(model: nn.Module) -> type[BundledSpec]:
    """The spec of a bundled model, by its class: the one place the kind of a checkpoint is chosen."""
    try:
        return SPECS[type(model)]
    except KeyError:
        known = ", ".join(sorted(c.__name__ for c in SPECS))
        raise ExportError(f"no export spec for a {type(model).__name__} (known: {known})") from None


@register(Classifier)
class BundledClassifier(BundledSpec):
    """One graph, `model.onnx`: logits and the last layer's attention weights."""

    task = "classification"
    output = "logits"
    dataset = "sentiment"
    text_field = "text"
    dataset_labels = SENTIMENT_LABELS
    model: Classifier

    def encode(self, texts: Sequence[str]) -> list[list[int]]:
        return encode_texts(self.tok, texts, self.model.config.max_len)

    def write_graphs(self, folder: Path) -> dict[str, str]:
        return write_classifier(self.model, folder)

    def check_reference(self, folder: Path, roles: dict[str, str]) -> dict[str, object]:
        return self.check_variant("fp32", folder, {"fp32": roles})

    def check_variant(self, variant: str, folder: Path, files: dict[str, dict[str, str]]) -> dict[str, object]:
        """Logits and attention against PyTorch; a quantized graph's probabilities only."""
        tol, probs = validate.TOLERANCES[variant], variant in validate.PROBABILITIES_ONLY
        worst = validate.check_classifier(self.model, folder / files[variant]["model"], self.seqs, tol, probs)
        return {f"{variant}_max_abs_diff": worst}

    def calibration_feeds(self, folder: Path, roles: dict[str, str]) -> Feeds:
        return {"model": validate.source_feeds(self.calibration_sentences())}

    def evaluate(self, variant: str, folder: Path, roles: dict[str, str]) -> dict[str, object]:
        if not self.test_rows:
            return {}
        labels, max_len = self.options.labels, self.model.config.max_len
        result = validate.eval_classifier_variant(folder / roles["model"], self.tok, self.test_rows, labels, max_len)
        return {f"test_{variant}": result}

    def describe(self) -> Description:
        return self._description(
            graphs=classifier_io(self.model),
            labels=list(self.options.labels),
            max_source_tokens=self.model.config.max_len,
        )


@register(Translator)
class BundledTranslator(BundledSpec):
    """`encoder.onnx` and one `decoder.onnx` for every step; sources end with EOS, the special ids
    are the contract's."""

    task = "translation"
    output = "logprobs"
    dataset = "translation"
    text_field = "en"
    model: Translator

    @property
    def max_new_tokens(self) -> int:
        return min(MAX_NEW_TOKENS, self.model.config.max_len)

    def encode(self, texts: Sequence[str]) -> list[list[int]]:
        c, o = self.model.config, self.options
        return encode_sources(self.tok, texts, c.max_len, o.span_rules >= 2, o.common_words)[0]

    def write_graphs(self, folder: Path) -> dict[str, str]:
        return write_translator(self.model, folder)

    def check_reference(self, folder: Path, roles: dict[str, str]) -> dict[str, object]:
        """Every output against PyTorch, then cached ONNX greedy against uncached PyTorch greedy on
        at least `min_parity_sentences` sentences, every one token for token."""
        report = self.check_variant("fp32", folder, {"fp32": roles})
        minimum = self.options.min_parity_sentences
        parity = list(self.seqs[: max(minimum, 100)])
        if len(parity) < minimum:
            raise ExportError(f"token parity needs at least {minimum} validation sentences, got {len(parity)}")
        enc, dec = folder / roles["encoder"], folder / roles["decoder"]
        rate = validate.check_greedy_tokens(self.model, enc, dec, parity, self.max_new_tokens)
        if rate < 1.0:
            raise ExportError(f"cached ONNX greedy differs from PyTorch on {1 - rate:.1%} of {len(parity)} sentences")
        return report | {"greedy_identical_rate": rate, "greedy_parity_sentences": len(parity)}

    def check_variant(self, variant: str, folder: Path, files: dict[str, dict[str, str]]) -> dict[str, object]:
        """Every output against PyTorch; a quantized graph's decoder probabilities against the fp32
        decoder's at every step of greedy decoding of sentences that did not set its scales."""
        tol, roles = validate.TOLERANCES[variant], files[variant]
        enc, dec = folder / roles["encoder"], folder / roles["decoder"]
        if variant in validate.PROBABILITIES_ONLY:
            ref = (folder / files["fp32"]["encoder"], folder / files["fp32"]["decoder"])
            held_out = self.seqs[CALIBRATION_SENTENCES:] or self.seqs
            worst = validate.check_quantized_translator(self.model, ref, (enc, dec), held_out[:32], tol)
        else:
            probs = variant in validate.NEXT_TOKEN_AS_PROBABILITIES
            worst = validate.check_translator(self.model, enc, dec, self.seqs[:16], tol, probs)
        return {f"{variant}_max_abs_diff": worst}

    def check_batches(self, variant: str, folder: Path, roles: dict[str, str]) -> dict[str, object]:
        need = min(64, self.options.min_parity_sentences)
        sample = self.seqs[:64]
        if len(sample) < need:
            raise ExportError(f"batch invariance needs at least {need} validation sentences, got {len(sample)}")
        return validate.require_batch_invariance(variant, folder, roles, self.model, sample, self.max_new_tokens)

    def calibration_feeds(self, folder: Path, roles: dict[str, str]) -> Feeds:
        return validate.translator_feeds(self.model, folder, roles, self.calibration_sentences())

    def evaluate(self, variant: str, folder: Path, roles: dict[str, str]) -> dict[str, object]:
        if not self.test_rows:
            return {}
        enc, dec = folder / roles["encoder"], folder / roles["decoder"]
        verbatim = self.options.span_rules >= 2
        result = validate.eval_translator_variant(
            enc, dec, self.model, self.tok, self.test_rows, verbatim, self.options.common_words
        )
        return {f"test_{variant}_greedy": result}

    def describe(self) -> Description:
        return self._description(
            graphs=translator_io(self.model),
            max_source_tokens=self.model.config.max_len - 1,  # text tokens; the EOS every source ends with on top
            max_new_tokens=self.max_new_tokens,
            source_language=self.options.source_language,
            target_language=self.options.target_language,
            span_rules=self.options.span_rules,
            common_words=COMMON_WORDS if self.options.common_words else None,
            generation=self.options.generation,
        )

    def write_tokenizer(self, folder: Path) -> str:
        """The tokenizer, and beside it the words never masked as names, one a line."""
        if self.options.common_words:
            (folder / COMMON_WORDS).write_text("".join(w + "\n" for w in sorted(self.options.common_words)))
        return super().write_tokenizer(folder)
