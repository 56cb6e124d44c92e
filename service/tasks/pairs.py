"""What a pair classifier answers besides `/predict`: reranking (TEI's `/rerank`) and zero-shot
classification (transformers' `ZeroShotClassificationPipeline`): their bodies and their scores,
pure numpy over the classification task's logits. Each turns a request into pairs of texts that
share the classifier's batcher with every other request."""

from __future__ import annotations

from collections.abc import Sequence

import numpy as np
from pydantic import Field, RootModel, model_validator

from service.engine.classifier import softmax
from service.errors import InvalidInput
from service.tasks.base import ModelName, ResponseModel, StrictModel

MAX_LABELS = 64  # candidate labels per zero-shot request (each text is run once per label)
TEMPLATE = "This example is {}."  # transformers' default hypothesis


class RerankRequest(StrictModel):
    """TEI's `/rerank` body: a query and the texts to order by their relevance to it."""

    model: ModelName | None = Field(default=None, description="model name; default: the only (or default) classifier")
    query: str = Field(description="the query every text is scored against (the pair's first text)")
    texts: list[str] = Field(min_length=1, description="the texts to rank (each the second text of a pair)")
    raw_scores: bool = Field(default=False, description="the logit instead of its sigmoid")
    return_text: bool = Field(default=False, description="each text beside its index")
    truncate: bool = Field(default=False, description="cut a pair past the model's token limit (longest_first)")


class Rank(ResponseModel):
    index: int = Field(description="the text's place in the request's `texts`")
    score: float = Field(
        description="a single-logit model's sigmoid (its logit with raw_scores); a model of several labels: its "
        "last label's probability (its logit with raw_scores)"
    )
    text: str | None = None


class RerankResponse(RootModel[list[Rank]]):
    """The texts by score, highest first (equal scores: in the request's order)."""


class ZeroShotRequest(StrictModel):
    """transformers' zero-shot pipeline's inputs: each text against each label's hypothesis."""

    model: ModelName | None = Field(default=None, description="model name; default: the only (or default) classifier")
    texts: list[str] = Field(min_length=1, description="the texts to classify (each the premise of a pair)")
    candidate_labels: list[str] = Field(
        min_length=1, max_length=MAX_LABELS, description="the labels; each becomes a hypothesis"
    )
    hypothesis_template: str = Field(
        default=TEMPLATE, pattern=r"\{\}", description="the hypothesis of a label: `{}` is replaced by the label"
    )
    multi_label: bool = Field(
        default=False, description="each label scored alone (entailment against contradiction); else one softmax"
    )

    @model_validator(mode="after")
    def _template_formats(self) -> ZeroShotRequest:
        try:
            self.hypothesis_template.format("label")
        except (IndexError, KeyError, ValueError):
            raise ValueError("hypothesis_template takes one `{}` and no other braces ({{ }}: a brace)") from None
        return self

    def pairs(self) -> list[tuple[str, str]]:
        """Every (text, hypothesis) pair, text by text: a text's labels are adjacent."""
        hypotheses = [self.hypothesis_template.format(label) for label in self.candidate_labels]
        return [(text, h) for text in self.texts for h in hypotheses]


class ZeroShotResult(ResponseModel):
    labels: list[str] = Field(description="the candidate labels, highest score first")
    scores: list[float]


class ZeroShotResponse(ResponseModel):
    model: str
    version: int
    results: list[ZeroShotResult]


def rerank(rows: Sequence[Sequence[float]], texts: Sequence[str], raw: bool, with_text: bool) -> list[Rank]:
    """Ranks of (N, C) logits: the last label's (a scorer's only one) sigmoid, softmax probability or
    logit, highest first; a stable sort keeps equal scores in the request's order."""
    logits = np.asarray(rows, dtype=np.float64)  # (N, C)
    last = logits[:, -1]
    if raw:
        scores = last
    elif logits.shape[1] == 1:
        scores = 1.0 / (1.0 + np.exp(-last))
    else:
        scores = softmax(logits)[:, -1]
    order = np.argsort(-scores, kind="stable")
    return [Rank(index=int(i), score=float(scores[i]), text=texts[i] if with_text else None) for i in order]


def nli_ids(labels: Sequence[str]) -> tuple[int, int]:
    """The entailment and contradiction columns, as transformers' pipeline finds them: the first
    label starting with "entail" (any case); contradiction is column 0, or -1 when entailment is 0.
    A model without an entailment label is no NLI model (transformers would guess the last column)."""
    entail = next((i for i, name in enumerate(labels) if name.lower().startswith("entail")), None)
    if entail is None or len(labels) < 2:
        raise InvalidInput(f"zero-shot classification needs an NLI model with an entailment label; labels: {labels}")
    return entail, -1 if entail == 0 else 0


def zero_shot(
    rows: Sequence[Sequence[float]], labels: Sequence[str], model_labels: Sequence[str], multi: bool
) -> list[ZeroShotResult]:
    """Per text, the candidate labels by score as transformers' pipeline computes them from the
    (texts x labels, C) logits: one label or `multi`: softmax over (contradiction, entailment) per
    label; else a softmax of the entailment logits over the labels."""
    entail, contra = nli_ids(model_labels)
    logits = np.asarray(rows, dtype=np.float64)  # (T x L, C)
    per_text = logits.reshape(-1, len(labels), logits.shape[1])  # (T, L, C)
    if multi or len(labels) == 1:
        scores = softmax(per_text[..., [contra, entail]])[..., 1]  # (T, L)
    else:
        scores = softmax(per_text[..., entail])  # (T, L)
    out = []
    for row in scores:
        top = np.argsort(row)[::-1]
        out.append(ZeroShotResult(labels=[labels[i] for i in top], scores=[float(row[i]) for i in top]))
    return out
