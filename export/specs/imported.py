"""Imported Hugging Face checkpoints as specs: a Bart-family translator, a BERT-family classifier.

The graphs are checked against transformers itself (`export.hf`), on synthetic inputs: an import
needs no data. The manifest states what the checkpoint says of itself: its framing of a source per
language and the tokens a translation starts with per target language (`export.hf.tokenizer`),
its special ids, its decoding defaults (`generation_config.json`, refused where the engine would
decode otherwise), its labels, its position limit, its origin. What differs between families
(graph builder and quirks, config mapping, tokenizer and framing) is their registry entry's
(`export.hf.families`); `spec_for` picks the spec by the family's task.
"""

from __future__ import annotations

import json
import re
from collections.abc import Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import ClassVar

import numpy as np
import torch
import transformers
from torch import nn

from export import validate
from export.graphs import translator_io
from export.hf import ImportProblem, classifiers, steps
from export.hf.classifiers import ClassifierLayout
from export.hf.families import Family
from export.hf.tokenizer import ImportedTokenizer
from export.quantize import MAKERS
from export.specs import CALIBRATION_SENTENCES, MAX_NEW_TOKENS, Description, Feeds, ModelSpec
from export.validate import ExportError
from service.contract.manifest import Framing, Generation

TEXT2TEXT_MAX_NEW_TOKENS = 256  # a text-to-text model's limit where its own allows that many (the request bound)
MIN_SOURCE_TOKENS = 8  # a position table with room for fewer source ids is refused
PROBE_STEPS = 16  # decoder steps of the batch-invariance gate's probes (fewer where the positions end)
# generation_config.json options the engine does not implement, with the values that mean "off"
_OFF: dict[str, tuple[object, ...]] = {
    "do_sample": (False, None),
    "num_beam_groups": (1, None),
    "diversity_penalty": (0.0, None),
    "repetition_penalty": (1.0, None),
    "encoder_no_repeat_ngram_size": (0, None),
    "forced_decoder_ids": (None,),
    "begin_suppress_tokens": (None,),
    "exponential_decay_length_penalty": (None,),
    "sequence_bias": (None,),
    "constraints": (None,),
    "force_words_ids": (None,),
}


@dataclass(frozen=True)
class ImportOptions:
    """How one checkpoint is imported: where it goes, its variants, what it cannot say of itself."""

    name: str
    version: int | None = None
    force: bool = False
    variants: tuple[str, ...] = ("fp32",)
    default_variant: str = "fp32"
    calibration: tuple[str, ...] = ()  # texts whose activations set the int8 scales
    languages: tuple[str, str] | None = None  # a monolingual translator's source and target (BCP 47)
    task: str | None = None  # an encoder-decoder's task: translation or text2text; None: its family's default
    prefix: str = ""  # text2text: prepended to every input (T5's "summarize: ")


class ImportedSpec(ModelSpec):
    """A local save_pretrained folder: its config, its serving tokenizer, its weights."""

    seconds_metric = "import_seconds"
    auto_class: ClassVar[type]  # the transformers class that loads the family's weights
    made_variants: ClassVar[tuple[str, ...]] = ("fp32", *MAKERS)  # the variants this kind is published in

    def __init__(
        self,
        folder: Path,
        config: transformers.PretrainedConfig,
        family: Family,
        tok: ImportedTokenizer,
        hf: nn.Module,
        options: ImportOptions,
    ) -> None:
        self.folder, self.config, self.family, self.tok, self.hf = folder, config, family, tok, hf
        self.calibration = options.calibration
        self.raw_generation: dict[str, object] = {}
        self.options = options
        self.setup()

    def setup(self) -> None:
        """What the kind derives from the checkpoint once it is loaded (a translator's graph module)."""

    @classmethod
    def load(
        cls,
        folder: Path,
        config: transformers.PretrainedConfig,
        family: Family,
        tok: ImportedTokenizer,
        options: ImportOptions,
    ) -> ImportedSpec:
        """The checkpoint's weights (safetensors only, fp32) under this spec."""
        try:
            hf = cls.auto_class.from_pretrained(  # type: ignore[attr-defined]
                folder, local_files_only=True, use_safetensors=True, dtype=torch.float32
            ).eval()
        except (ValueError, OSError, RuntimeError) as exc:
            raise ImportProblem(f"{folder}: weights do not load: {exc}") from exc
        return cls(folder, config, family, tok, hf, options)

    def framed(self, ids: Sequence[Sequence[int]]) -> list[list[int]]:
        """Text ids as a source of the first source language (any language, for a multilingual model)."""
        frame = self.tok.sources[next(iter(self.tok.sources))]
        return [[*frame.prefix, *i, *frame.suffix] for i in ids]

    def write_tokenizer(self, folder: Path) -> str:
        self.tok.tokenizer.save(str(folder / "tokenizer.json"))
        return "tokenizer.json"

    def origin(self) -> dict[str, object]:
        return {
            "family": self.config.model_type,
            "architectures": list(self.config.architectures or []),
            "licence": _licence(self.folder),
            "config": self.config.to_diff_dict(),
            "generation_config": self.raw_generation,
        }

    def write_extras(self, folder: Path, name: str, version: int, metrics: dict[str, object]) -> dict[str, str]:
        (folder / "CARD.md").write_text(_card(name, version, self.origin(), metrics))
        return {}

    def _description(self, **fields: object) -> Description:
        sources = self.tok.sources
        return Description(
            sources={code: Framing(prefix=list(f.prefix), suffix=list(f.suffix)) for code, f in sources.items()},
            skip_ids=list(self.tok.special_ids),
            origin=self.origin(),
            **fields,  # type: ignore[arg-type]
        )


class ImportedTranslator(ImportedSpec):
    """An encoder-decoder (Marian, BART, mBART, M2M100/NLLB): its family's step model (`export.hf.steps`)
    as the bundled translator's graphs, with the checkpoint's decoder start, suppressed ids, framing
    and decoding defaults."""

    task = "translation"  # or text2text (`served_as`), per checkpoint
    output = "logprobs"
    auto_class = transformers.AutoModelForSeq2SeqLM
    model: steps.ImportedStep

    def setup(self) -> None:
        hf, config, tok, folder, options = self.hf, self.config, self.tok, self.folder, self.options
        self.task = served_as(self.family, options)
        self.generation, self.raw_generation = generation_of(hf.generation_config)
        start = hf.generation_config.decoder_start_token_id
        if start is None:
            start = config.decoder_start_token_id
        if start is None:
            raise ImportProblem("no decoder_start_token_id in generation_config.json or config.json")
        self.start = int(start)
        self.eos = end_token(hf.generation_config, config)
        build = self.family.graph
        if isinstance(build, ClassifierLayout):
            raise ImportProblem(f"{config.model_type}: a classifier family, not a translator")
        self.model = build(hf, self.start, _suppressed(self.raw_generation), self.eos)
        room = self.model.config.max_len - max(len(f.prefix) + len(f.suffix) for f in tok.sources.values())
        if room < MIN_SOURCE_TOKENS:
            limit = next(o for o in ("max_position_embeddings", "n_positions") if hasattr(config, o))  # T5's
            raise ImportProblem(
                f"{limit}={getattr(config, limit)} leaves {room} source tokens: "
                f"too few to translate (at least {MIN_SOURCE_TOKENS})"
            )
        self.probes = self.framed(_probe_sources(self.model.config.vocab_size, set(tok.special_ids), 8, room))
        self.probe_steps = min(PROBE_STEPS, self.model.config.max_len - 1)
        self.languages = {
            "source_language": _default_language(folder, "src_lang", tok.sources),
            "target_language": default_target(self.raw_generation, tok.targets),
        } | _named_pair(options.languages, tok.sources)

    @property
    def new_tokens_cap(self) -> int:
        """A translation's sentences are short; a summary may be longer (bart-large-cnn asks for up
        to 141 tokens): the request's bound."""
        return TEXT2TEXT_MAX_NEW_TOKENS if self.task == "text2text" else MAX_NEW_TOKENS

    def write_graphs(self, folder: Path) -> dict[str, str]:
        return steps.export_translator(self.model, folder)

    def check_reference(self, folder: Path, roles: dict[str, str]) -> dict[str, object]:
        """Teacher-forced log-probabilities against transformers, rows at different positions."""
        tol = validate.TOLERANCES["fp32"]
        return steps.check_against_transformers(self.hf, self.model, folder, roles, self.probes, tol)

    def check_variant(self, variant: str, folder: Path, files: dict[str, dict[str, str]]) -> dict[str, object]:
        """A family that asks for it (T5) has its fp16 and int8 graphs checked against fp32, whole
        (`steps.check_variant_against_fp32`): one that overflows or drifts is refused. For the others
        no tolerance is measured: the gate they pass is batch invariance (`check_batches`)."""
        if not self.family.variants_checked:
            return {}
        tol = validate.TOLERANCES[variant]
        return steps.check_variant_against_fp32(self.hf, self.model, folder, files, variant, self.probes, tol)

    def check_batches(self, variant: str, folder: Path, roles: dict[str, str]) -> dict[str, object]:
        return validate.require_batch_invariance(variant, folder, roles, self.model, self.probes[:8], self.probe_steps)

    def calibration_feeds(self, folder: Path, roles: dict[str, str]) -> Feeds:
        texts = list(self.calibration[:CALIBRATION_SENTENCES])
        seqs = self.framed([e.ids for e in self.tok.tokenizer.encode_batch(texts)])
        return validate.translator_feeds(self.model, folder, roles, seqs)

    def describe(self) -> Description:
        c, tok, raw = self.config, self.tok, self.raw_generation
        positions = self.model.config.max_len
        framing = max(len(f.prefix) + len(f.suffix) for f in tok.sources.values())
        return self._description(
            architecture=self.family.architecture(c),
            graphs=translator_io(self.model),
            special_tokens={
                "pad_id": tok.pad_id,
                "unk_id": tok.unk_id,
                "bos_id": self.start,
                "eos_id": self.eos,
                "decoder_start_id": self.start,
            },
            max_source_tokens=positions - framing,
            max_new_tokens=min(self.new_tokens_cap, positions - 1, _length_limit(raw)),
            targets={code: list(ids) for code, ids in _targets(raw, tok.targets).items()},
            generation=self.generation,
            prefix=self.options.prefix,
            **(self.languages if self.task == "translation" else {}),
        )


class ImportedClassifier(ImportedSpec):
    """A BERT-family sequence classifier (BERT, DistilBERT, RoBERTa, XLM-R; `export.hf.classifiers`):
    the graph is checked against transformers as it is written. Published in fp32 only: no fp16 or
    int8 graph of an imported classifier is made or checked (`--variants` asking for them is refused)."""

    task = "classification"
    output = "logits"
    auto_class = transformers.AutoModelForSequenceClassification
    made_variants = ("fp32",)

    def setup(self) -> None:
        if not isinstance(self.family.graph, ClassifierLayout):
            raise ImportProblem(f"{self.config.model_type}: a translator family, not a classifier")
        self.layout = self.family.graph
        self.labels = classifiers.labels(self.config)

    def write_graphs(self, folder: Path) -> dict[str, str]:
        classifiers.export_classifier(self.hf, self.layout, folder / "model.onnx")  # type: ignore[arg-type]
        return {"model": "model.onnx"}

    def check_reference(self, folder: Path, roles: dict[str, str]) -> dict[str, object]:
        # export_classifier writes the file only once it matches transformers and the graph module
        return {"transformers_checked": "logits and attentions on 5 padded batches, max abs diff <= 1e-4"}

    def check_variant(self, variant: str, folder: Path, files: dict[str, dict[str, str]]) -> dict[str, object]:
        raise ExportError(f"{variant}: an imported classifier is published in fp32 only")

    def calibration_feeds(self, folder: Path, roles: dict[str, str]) -> Feeds:
        raise ExportError("an imported classifier is published in fp32 only: nothing to calibrate")

    def describe(self) -> Description:
        frame = self.tok.sources[""]
        return self._description(
            architecture=self.family.architecture(self.config),
            graphs={"model": classifiers.graph_spec(self.config, self.layout)},
            special_tokens={"pad_id": self.tok.pad_id, "unk_id": self.tok.unk_id},
            labels=self.labels,
            pair=self.tok.pair,
            max_source_tokens=classifiers.max_sequence_length(self.config, self.layout)
            - len(frame.prefix)
            - len(frame.suffix),
        )


SPECS: dict[str, type[ImportedSpec]] = {spec.task: spec for spec in (ImportedTranslator, ImportedClassifier)}


def spec_for(family: Family) -> type[ImportedSpec]:
    """The spec that publishes a family's checkpoints, by its task: the one place an import's kind is chosen."""
    return SPECS[family.task]


def served_as(family: Family, options: ImportOptions) -> str:
    """The task an encoder-decoder is published for: `--task`, else text2text for the families
    that are (T5, BART summarizers) unless languages are named, else translation. A prefix is a
    text-to-text model's; languages a translator's."""
    task = options.task or ("text2text" if family.text2text and options.languages is None else "translation")
    if task not in TEXT_TASKS:
        raise ImportProblem(f"--task {task!r}: an encoder-decoder is published for {' or '.join(TEXT_TASKS)}")
    if task == "translation" and options.prefix:
        raise ImportProblem("--prefix is for text2text models; a translator's input is its sentences as written")
    if task == "text2text" and options.languages is not None:
        raise ImportProblem(
            "--languages is for translators; a text2text model has none (drop it or --task translation)"
        )
    return task


TEXT_TASKS = ("translation", "text2text")


def generation_of(gen: object) -> tuple[Generation, dict[str, object]]:
    """The decoding defaults of the model's generation config (what `generate` uses: its
    generation_config.json, else its config.json) and the raw options kept."""
    for option, off in _OFF.items():
        value = getattr(gen, option, None)
        if value not in off:
            raise ImportProblem(f"generation_config: {option}={value!r} is not supported by the engine")
    for words in gen.bad_words_ids or []:
        if len(words) != 1:
            raise ImportProblem(f"generation_config: bad_words_ids {words} of several tokens are not supported")
    stopping = False if gen.early_stopping is None else gen.early_stopping  # None: transformers' default
    if stopping not in (True, False, "never"):
        raise ImportProblem(f"generation_config: early_stopping={gen.early_stopping!r} is not supported")
    if (gen.num_beams or 1) > 8:
        raise ImportProblem(f"generation_config: num_beams={gen.num_beams} (the engine's beams are at most 8)")
    # transformers' min_length counts the decoder start token; min_new_tokens only generated ones
    least = max(int(gen.min_new_tokens or 0), int(gen.min_length or 0) - 1)  # type: ignore[attr-defined]
    defaults = Generation(
        beam_size=int(gen.num_beams or 1),
        min_new_tokens=least,
        length_penalty=float(gen.length_penalty if gen.length_penalty is not None else 1.0),
        early_stopping=stopping,
        no_repeat_ngram_size=int(gen.no_repeat_ngram_size or 0),
        forced_eos=gen.forced_eos_token_id is not None,
    )
    return defaults, gen.to_diff_dict()  # type: ignore[attr-defined]


def end_token(gen: object, config: transformers.PretrainedConfig) -> int:
    """The id that ends a translation: generation_config's eos_token_id, which `generate` stops on,
    else config.json's. The engine ends on one id: a list of several is refused, not cut to one;
    so is a forced_eos_token_id (the id forced at the length limit) other than that one."""
    value = getattr(gen, "eos_token_id", None)
    ids = _ids(config.eos_token_id if value is None else value)
    if len(ids) != 1:
        raise ImportProblem(
            f"generation_config: eos_token_id={value!r}: the engine ends a translation on exactly one id "
            "(set one in generation_config.json if the others never end a translation)"
        )
    forced = getattr(gen, "forced_eos_token_id", None)
    if forced is not None and _ids(forced) != ids:
        raise ImportProblem(f"generation_config: forced_eos_token_id={forced!r} is not the end id {ids[0]}")
    return ids[0]


def _ids(value: object) -> list[int]:
    if value is None:
        return []
    return sorted({int(i) for i in value}) if isinstance(value, list | tuple) else [int(value)]  # type: ignore[call-overload]


def _suppressed(gen: dict[str, object]) -> tuple[int, ...]:
    ids = [w[0] for w in gen.get("bad_words_ids") or []]  # type: ignore[union-attr]
    ids += list(gen.get("suppress_tokens") or [])  # type: ignore[arg-type]
    return tuple(sorted(set(ids)))


def _length_limit(gen: dict[str, object]) -> int:
    """generation_config's limit on new tokens, as `generate` reads it: max_new_tokens, else
    max_length less the decoder start. Without either, none: transformers' model-agnostic default
    of 20 (which it warns about) would cut translations short, so the model's positions bound it."""
    if gen.get("max_new_tokens") is not None:
        return int(gen["max_new_tokens"])  # type: ignore[call-overload]
    if gen.get("max_length") is not None:
        return int(gen["max_length"]) - 1  # type: ignore[call-overload]
    return 10**6


def _probe_sources(vocab: int, skip: set[int], count: int, room: int, seed: int = 0) -> list[list[int]]:
    """Synthetic sources of mixed lengths (3 to 23 ids, at most `room`) from the vocabulary's
    ordinary ids (no data is needed)."""
    rng = np.random.default_rng(seed)
    pool = np.array([i for i in range(vocab) if i not in skip])
    return [rng.choice(pool, size=min(int(n), room)).tolist() for n in rng.integers(3, 24, size=count)]


def _named_pair(languages: tuple[str, str] | None, sources: dict[str, object]) -> dict[str, str]:
    """--languages for a model that does not name its languages (Marian, BART)."""
    if languages is None:
        return {}
    if [k for k in sources if k]:
        raise ImportProblem("--languages is for models of one language pair; this one names its own languages")
    return {"source_language": languages[0], "target_language": languages[1]}


def _targets(raw: dict[str, object], targets: dict[str, tuple[int, ...]]) -> dict[str, tuple[int, ...]]:
    """Per target language the forced first tokens, as `generate` forces them: a multilingual model's
    language token; a monolingual model's `forced_bos_token_id` when its generation config sets one."""
    if [k for k in targets if k]:
        return targets
    forced = raw.get("forced_bos_token_id")
    return {"": (int(forced),) if forced is not None else ()}  # type: ignore[call-overload]


def default_target(raw: dict[str, object], targets: dict[str, tuple[int, ...]]) -> str | None:
    """The language whose token the generation config forces, else the only one the model names
    (mBART-cc25 fine-tuned to one pair starts its decoder with it): a request may leave it out."""
    forced = raw.get("forced_bos_token_id")
    named = [k for k in targets if k]
    found = next((k for k in named if targets[k] and targets[k][0] == forced), None)
    return found if found is not None or len(named) != 1 else named[0]


def _default_language(folder: Path, attribute: str, sources: dict[str, object]) -> str | None:
    cfg = folder / "tokenizer_config.json"
    value = json.loads(cfg.read_text()).get(attribute) if cfg.is_file() else None
    return value if value in sources else None


def _licence(folder: Path) -> str | None:
    """The model card's `license:` front-matter field, when the folder has a README.md."""
    card = folder / "README.md"
    if not card.is_file():
        return None
    match = re.search(r"^---\n(.*?)\n---", card.read_text(errors="replace"), re.S)
    field = re.search(r"^license:\s*(\S+)", match.group(1), re.M) if match else None
    return field.group(1) if field else None


def _card(name: str, version: int, origin: dict[str, object], report: dict[str, object]) -> str:
    lines = [
        f"# {name} version {version}",
        "",
        f"Imported from a `{origin['family']}` checkpoint ({', '.join(origin['architectures']) or '-'}) "  # type: ignore[arg-type]
        "by `python -m export.import_hf`.",
        f"Licence: {origin['licence'] or 'not stated in the source model card'}.",
        "",
        "## Validation against transformers",
        "",
        *[f"- {k}: {v}" for k, v in report.items()],
        "",
        "## Source config.json (as it differs from the defaults)",
        "",
        "```json",
        json.dumps(origin["config"], indent=2, sort_keys=True, default=str),
        "```",
        "",
    ]
    return "\n".join(lines)
