"""The model-version manifest: the schema both the exporter writes and the service checks at load.

A version folder is self-describing: everything the runtime needs (graph IO names, special ids,
labels, limits) comes from here, and every file is pinned by size and sha256.
"""

from __future__ import annotations

import hashlib
import json
import re
from pathlib import Path
from typing import Annotated, Literal

from pydantic import BaseModel, ConfigDict, Field

MANIFEST = "manifest.json"
SCHEMA_VERSION = 1
MODEL_NAME_PATTERN = r"^[a-z0-9][a-z0-9._-]*$"  # a store folder and a URL path segment as it is
MAX_MODEL_NAME = 128
# BCP 47 ("de", "zh-Hans") or as a checkpoint names it ("fr_XX", "fra_Latn"; "__fr__" is not one)
LANGUAGE_CODE_PATTERN = r"^[A-Za-z]{2,3}([_-][A-Za-z0-9]{2,8})*$"
# Bounds no model of this service comes near: a manifest beyond them is refused, not served until
# a request asks for terabytes (a version's own limits are checked by running them at load).
MAX_SOURCE_TOKENS = 16384
MAX_NEW_TOKENS = 4096

FIGURE_NAME = re.compile(r"^[a-z0-9][a-z0-9_-]{0,63}$")  # a figure's name: a URL path segment as it is
FigureName = Annotated[str, Field(pattern=FIGURE_NAME.pattern)]
PngFile = Annotated[str, Field(pattern=r"^[A-Za-z0-9][A-Za-z0-9._-]*\.png$", max_length=128)]


class ManifestError(Exception):
    """A model version that must not be served: missing, altered or inconsistent files."""


class FileEntry(BaseModel):
    model_config = ConfigDict(extra="forbid")
    sha256: str = Field(pattern=r"^[0-9a-f]{64}$")
    size: int = Field(ge=0)


class TensorSpec(BaseModel):
    model_config = ConfigDict(extra="forbid")
    name: str
    dtype: str
    shape: list[str | int]


class GraphSpec(BaseModel):
    model_config = ConfigDict(extra="forbid")
    inputs: list[TensorSpec]
    outputs: list[TensorSpec]


class Framing(BaseModel):
    """The ids around a source's own ids: `prefix + text ids + suffix` (a BERT's [CLS] and [SEP], an
    NLLB source's language token and EOS, a bundled translator's EOS)."""

    model_config = ConfigDict(extra="forbid")
    prefix: list[int] = Field(default_factory=list)
    suffix: list[int] = Field(default_factory=list)


class PairFraming(BaseModel):
    """How a classifier joins two texts (IO contract 7): `prefix + a + middle + b + suffix` (BERT's
    `[CLS] a [SEP] b [SEP]`, RoBERTa's `<s> a </s></s> b </s>`); where the graph takes token types,
    `prefix + a + middle` is segment 0 and `b + suffix` segment 1."""

    model_config = ConfigDict(extra="forbid")
    prefix: list[int] = Field(default_factory=list)
    middle: list[int] = Field(default_factory=list)
    suffix: list[int] = Field(default_factory=list)

    @property
    def length(self) -> int:
        """The framing's own ids, around the two texts'."""
        return len(self.prefix) + len(self.middle) + len(self.suffix)


class Generation(BaseModel):
    """A translator's decoding defaults (an imported checkpoint's `generation_config.json`): what a
    request gets for every option it leaves out."""

    model_config = ConfigDict(extra="forbid")
    beam_size: int = Field(default=4, ge=1, le=8)
    length_penalty: float = Field(default=1.0, ge=0.0, le=2.0)
    early_stopping: bool | Literal["never"] = True
    no_repeat_ngram_size: int = Field(default=0, ge=0)
    forced_eos: bool = False  # the last token a length limit allows is EOS
    min_new_tokens: int = Field(default=0, ge=0)  # no EOS before this many tokens (a summarizer's min_length - 1)


class Manifest(BaseModel):
    model_config = ConfigDict(extra="forbid")
    schema_version: int = SCHEMA_VERSION
    name: str = Field(pattern=MODEL_NAME_PATTERN)
    version: int = Field(ge=1)
    task: str = Field(pattern=r"^[a-z][a-z0-9_]*$")  # the service's task registry knows which it serves
    io_contract: int = Field(default=1, ge=1)  # graphs.IO_CONTRACT_VERSION at export; absent: 1
    created: str
    architecture: dict[str, int | float | str]
    opset: int
    # role ("model" | "encoder" | "decoder") -> IO description, shared by every variant
    graphs: dict[str, GraphSpec]
    # variant ("fp32" | "int8" | "fp16") -> role -> file name
    variants: dict[str, dict[str, str]]
    default_variant: str
    output: Literal["logits", "logprobs", "none"]
    tokenizer: str
    special_tokens: dict[str, int]
    labels: list[str] = Field(default_factory=list)
    max_source_tokens: int = Field(ge=1, le=MAX_SOURCE_TOKENS)
    max_new_tokens: int = Field(ge=0, le=MAX_NEW_TOKENS)
    source_language: str | None = None  # BCP 47 ("en"); translators only; a multilingual model's default
    target_language: str | None = None
    # text2text: prepended to every input before it is tokenized (T5's "summarize: ")
    prefix: str = Field(default="", max_length=1000)
    # IO contract 4. Source language ("": any) -> framing; none: a translator source ends with EOS.
    sources: dict[str, Framing] = Field(default_factory=dict)
    # Target language ("": the only one) -> the tokens a translation starts with (forced, score 0).
    targets: dict[str, list[int]] = Field(default_factory=dict)
    pair: PairFraming | None = None  # IO contract 7: a classifier that takes pairs of texts; none: single texts
    generation: Generation = Field(default_factory=Generation)
    skip_ids: list[int] = Field(default_factory=list)  # ids left out of decoded text; none: the special ids
    span_rules: int = Field(default=1, ge=1, le=2)  # the masking rules it was trained with (spans.SPAN_RULES)
    # A file of words its training text writes in lower case, one a line: never masked as names
    # (verbatim.common_words); none: the tokenizer's whole words decide alone.
    common_words: str | None = None
    origin: dict[str, object] = Field(default_factory=dict)  # an imported checkpoint: family, config, licence
    metrics: dict[str, object] = Field(default_factory=dict)
    data_sources: list[dict[str, str]] = Field(default_factory=list)
    # figure name ("curves", "positions") -> PNG file: pictures of the training run kept with the version
    figures: dict[FigureName, PngFile] = Field(default_factory=dict)
    files: dict[str, FileEntry]

    def variant_files(self, variant: str) -> dict[str, str]:
        if variant not in self.variants:
            raise ManifestError(f"{self.name}/{self.version}: no variant {variant!r} (has {sorted(self.variants)})")
        return self.variants[variant]


def sha256_file(path: Path) -> str:
    h = hashlib.sha256()
    with path.open("rb") as f:
        for chunk in iter(lambda: f.read(1 << 20), b""):
            h.update(chunk)
    return h.hexdigest()


def file_entry(path: Path) -> FileEntry:
    return FileEntry(sha256=sha256_file(path), size=path.stat().st_size)


def read_manifest(folder: Path) -> Manifest:
    path = folder / MANIFEST
    if not path.is_file():
        raise ManifestError(f"{folder}: no {MANIFEST} (an unfinished or foreign folder)")
    try:
        return Manifest.model_validate(json.loads(path.read_text()))
    except (ValueError, json.JSONDecodeError) as exc:
        raise ManifestError(f"{path}: invalid manifest: {exc}") from exc
    except (OSError, RecursionError) as exc:  # unreadable; nested deeper than the JSON reader goes
        raise ManifestError(f"{path}: cannot be read: {type(exc).__name__}") from exc


def verify_folder(folder: Path) -> Manifest:
    """Check that every listed file exists with its size and sha256, and that nothing refers outside.

    File names must be plain names inside the folder: the store never follows paths out of it.
    Every problem is reported at once (a copied folder may have the wrong number and a missing file).
    """
    manifest = read_manifest(folder)
    problems = []
    if manifest.version != _folder_version(folder):
        problems.append(
            f"manifest says version {manifest.version} (a copied version? `python -m export.promote` "
            "ships a version under a new number)"
        )
    referenced = {manifest.tokenizer} | {f for v in manifest.variants.values() for f in v.values()}
    referenced |= set(manifest.figures.values()) | ({manifest.common_words} if manifest.common_words else set())
    if unlisted := referenced - set(manifest.files):
        problems.append(f"files used but not pinned in the manifest: {sorted(unlisted)}")
    for name, entry in manifest.files.items():
        if problem := _file_problem(folder, name, entry):
            problems.append(problem)
    if problems:
        raise ManifestError(f"{folder}: {'; '.join(problems)}")
    return manifest


def _file_problem(folder: Path, name: str, entry: FileEntry) -> str | None:
    if "/" in name or "\\" in name or name in ("", ".", ".."):
        return f"file name {name!r} is not a plain name"
    path = folder / name
    if not path.is_file():
        return f"missing file {name}"
    size = path.stat().st_size
    if size != entry.size:
        return f"{name} has {size} bytes, manifest says {entry.size} (truncated or replaced)"
    digest = sha256_file(path)
    if digest != entry.sha256:
        return f"{name} sha256 {digest[:12]}… does not match the manifest ({entry.sha256[:12]}…)"
    return None


def is_version_folder(name: str) -> bool:
    """A version folder's name: ASCII digits only (`str.isdigit` takes "²", which `int` refuses)."""
    return name.isascii() and name.isdigit()


def _folder_version(folder: Path) -> int:
    try:
        return int(folder.name)
    except ValueError as exc:
        raise ManifestError(f"{folder}: version folders are integers") from exc
