"""What the publisher needs to know of one kind of model, stated once per kind (`ModelSpec`).

`export.publish.publish` runs the same steps for every model: write the fp32 graphs, check them
against the model they come from, make and check each other variant, check batch invariance,
evaluate on the test split, describe the version in its manifest. What differs between a bundled
classifier, a bundled translator, an imported translator and an imported classifier (the graphs,
the special ids and framing, the limits, which checks apply and how) is each spec's own, as
CTranslate2's converter gives every model family one loader that states its quirks in one place.
The kind of a model is chosen once: `export.specs.bundled.spec_for` by the model's class,
`export.specs.imported.spec_for` by the checkpoint's `config.model_type`.
"""

from __future__ import annotations

from abc import ABC, abstractmethod
from dataclasses import dataclass, field, fields
from pathlib import Path
from typing import ClassVar, Literal

import numpy as np

from export.quantize import MAKERS
from export.validate import ExportError
from service.contract.manifest import Framing, Generation, GraphSpec, PairFraming

MAX_NEW_TOKENS = 128  # a translator's limit on generated tokens, where the model allows that many
# Real sentences whose activations set the int8 scales. With 64, one step of one held-out sentence of the
# verbatim-masked translator fell outside the calibrated range (probability 0.43 -> 0.28, gate 0.1); with
# 128 the worst held-out step moved 0.03, as the earlier model's did with 64.
CALIBRATION_SENTENCES = 128

Feeds = dict[str, list[dict[str, np.ndarray]]]  # graph role -> inputs of that graph

VARIANTS = ("fp32", *MAKERS)


@dataclass(frozen=True)
class PublishOptions:
    """Where one model version goes and which variants it is validated and shipped in."""

    name: str
    version: int | None = None  # None: the next free version
    force: bool = False  # overwrite an existing version
    variants: tuple[str, ...] = ("fp32", "int8")  # validated and measured; fp32 is the reference
    default_variant: str = "fp32"
    ship: tuple[str, ...] | None = None  # variants whose files are written; None: all

    def shipped(self) -> tuple[str, ...]:
        ship = self.ship or self.variants
        if "fp32" not in self.variants:
            raise ExportError("the fp32 variant is the reference for every other and must be exported")
        if unknown := set(self.variants) - set(VARIANTS):
            raise ExportError(f"unknown variant(s) {sorted(unknown)} (choose from {', '.join(VARIANTS)})")
        if not set(ship) <= set(self.variants) or self.default_variant not in ship:
            raise ExportError(
                f"shipped variants {list(ship)} must be exported ({list(self.variants)}) and include "
                f"{self.default_variant!r}"
            )
        return ship


@dataclass(frozen=True)
class Description:
    """What a version's manifest says of its model (the manifest fields of the same names): besides
    it the publisher writes only what every version has (files, variants, metrics, figures)."""

    architecture: dict[str, int | float | str]
    graphs: dict[str, GraphSpec]  # role -> IO, shared by every variant
    special_tokens: dict[str, int]
    max_source_tokens: int
    max_new_tokens: int = 0
    labels: list[str] = field(default_factory=list)
    source_language: str | None = None
    target_language: str | None = None
    prefix: str = ""
    sources: dict[str, Framing] = field(default_factory=dict)
    targets: dict[str, list[int]] = field(default_factory=dict)
    pair: PairFraming | None = None
    generation: Generation = field(default_factory=Generation)
    skip_ids: list[int] = field(default_factory=list)
    span_rules: int = 1
    common_words: str | None = None
    origin: dict[str, object] = field(default_factory=dict)
    data_sources: list[dict[str, str]] = field(default_factory=list)

    def fields(self) -> dict[str, object]:
        return {f.name: getattr(self, f.name) for f in fields(self)}


class ModelSpec(ABC):
    """One model to publish, with everything about it that depends on its kind."""

    task: ClassVar[str]  # the service's task for it (the manifest's `task`)
    output: ClassVar[Literal["logits", "logprobs"]]  # what its graphs give
    seconds_metric: ClassVar[str]  # the metric that records how long publishing took

    @abstractmethod
    def write_graphs(self, folder: Path) -> dict[str, str]:
        """Writes the fp32 graphs; returns role -> file name."""

    @abstractmethod
    def check_reference(self, folder: Path, roles: dict[str, str]) -> dict[str, object]:
        """Checks the fp32 graphs against the model they were made from; returns the figures,
        raises ExportError."""

    @abstractmethod
    def calibration_feeds(self, folder: Path, roles: dict[str, str]) -> Feeds:
        """Per role, inputs of real sentences through the fp32 graphs: they set the int8 scales."""

    @abstractmethod
    def check_variant(self, variant: str, folder: Path, files: dict[str, dict[str, str]]) -> dict[str, object]:
        """Checks a variant made from the fp32 graphs (`files[variant]`) within its tolerance."""

    def check_batches(self, variant: str, folder: Path, roles: dict[str, str]) -> dict[str, object]:
        """Checks that a shipped variant answers each input alike alone and in a batch; where the
        serving path cannot mix rows (a classifier's rows never meet), nothing to check."""
        return {}

    def evaluate(self, variant: str, folder: Path, roles: dict[str, str]) -> dict[str, object]:
        """A variant's figures on the test split, by metric name; none without test rows."""
        return {}

    def first_metrics(self) -> dict[str, object]:
        """Metrics known before the export (the training run's)."""
        return {}

    @abstractmethod
    def write_tokenizer(self, folder: Path) -> str:
        """Writes the serving tokenizer; returns its file name."""

    def write_extras(self, folder: Path, name: str, version: int, metrics: dict[str, object]) -> dict[str, str]:
        """Writes the files kept beside the graphs; returns the figures (name -> PNG file)."""
        return {}

    @abstractmethod
    def describe(self) -> Description:
        """The model as the manifest states it."""
