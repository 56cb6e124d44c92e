"""The pair classifier's protocols beside `/predict`: `POST /rerank` (TEI's shape) and `POST
/zero-shot-classification` (transformers' pipeline's numbers). Each is a codec over the one
pipeline (`service.http.pipeline`): its body becomes pairs of texts, run as the classification
task's work (`Work.pairs`), and its answer is scored from the task's logits (`service.tasks.pairs`)."""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

from starlette.types import ASGIApp

from service.errors import PayloadTooLarge
from service.http import schemas
from service.http.dispatch import json_answer
from service.http.pipeline import Codec, Decoded
from service.http.rest import TASK_ERRORS
from service.http.scope import Call
from service.http.table import Auth, Route
from service.serving import ModelSet
from service.settings import Settings
from service.tasks.base import Task, Work
from service.tasks.classification import ClassificationTask, Classified, ClassifyOptions
from service.tasks.pairs import (
    RerankRequest,
    RerankResponse,
    ZeroShotRequest,
    ZeroShotResponse,
    nli_ids,
    rerank,
    zero_shot,
)

TASK = ClassificationTask.name


class RerankCodec(Codec[RerankRequest, Classified, Classified]):
    """`/rerank`: (query, text) per text; the texts by score, highest first."""

    def __init__(self, rules: Mapping[str, str]) -> None:
        self.rules = rules

    async def decode(self, call: Call, settings: Settings) -> Decoded[RerankRequest]:
        body = schemas.parse_json(call.body, RerankRequest.model_validate, self.rules)
        schemas.check_texts(body.texts, settings.max_texts, settings.max_text_chars)
        schemas.check_texts([body.query], 1, settings.max_text_chars, "query")
        return Decoded(body, [t for text in body.texts for t in (body.query, text)])

    def resolve(self, request: RerankRequest, models: ModelSet) -> Task[Any, Classified]:
        return models.resolve(request.model, TASK)

    def work(self, request: RerankRequest, task: Task[Any, Classified], deadline: float) -> Work:
        pairs = [(request.query, text) for text in request.texts]
        return Work((), ClassifyOptions(truncate=request.truncate), deadline, pairs=pairs)

    async def encode(self, request: RerankRequest, task: Task[Any, Classified], done: Classified) -> ASGIApp:
        ranks = rerank(done.logits or [], request.texts, request.raw_scores, request.return_text)
        return json_answer(RerankResponse(ranks))


class ZeroShotCodec(Codec[ZeroShotRequest, Classified, Classified]):
    """`/zero-shot-classification`: (text, hypothesis) per text and label of an NLI model."""

    def __init__(self, rules: Mapping[str, str]) -> None:
        self.rules = rules

    async def decode(self, call: Call, settings: Settings) -> Decoded[ZeroShotRequest]:
        body = schemas.parse_json(call.body, ZeroShotRequest.model_validate, self.rules)
        schemas.check_texts(body.texts, settings.max_texts, settings.max_text_chars)
        labels = body.candidate_labels
        schemas.check_texts(labels, len(labels), settings.max_text_chars, "candidate_labels")
        pairs = len(body.texts) * len(body.candidate_labels)
        if pairs > settings.max_queue:  # what one request may hold in the batcher's queue
            raise PayloadTooLarge(
                f"texts x candidate_labels is {pairs} pairs; at most {settings.max_queue} per request"
            )
        return Decoded(body, [t for pair in body.pairs() for t in pair])

    def resolve(self, request: ZeroShotRequest, models: ModelSet) -> Task[Any, Classified]:
        return models.resolve(request.model, TASK)

    def work(self, request: ZeroShotRequest, task: Task[Any, Classified], deadline: float) -> Work:
        nli_ids(task.manifest.labels)  # an NLI model, or 422 before any work
        return Work((), ClassifyOptions(), deadline, pairs=request.pairs())

    async def encode(self, request: ZeroShotRequest, task: Task[Any, Classified], done: Classified) -> ASGIApp:
        results = zero_shot(done.logits or [], request.candidate_labels, task.manifest.labels, request.multi_label)
        return json_answer(ZeroShotResponse(model=task.entry.name, version=task.entry.version, results=results))


def routes(rules: Mapping[str, str]) -> list[Route]:
    common: dict[str, Any] = {"auth": Auth.BEARER, "errors": TASK_ERRORS}
    return [
        Route(
            "/rerank",
            ("POST",),
            RerankCodec(rules),
            "rerank",
            summary="Rank texts by their relevance to a query (a pair classifier: a cross-encoder)",
            body=RerankRequest,
            response=RerankResponse,
            metric="/rerank",
            **common,
        ),
        Route(
            "/zero-shot-classification",
            ("POST",),
            ZeroShotCodec(rules),
            "zero_shot_classification",
            summary="Classify texts into any labels (a pair classifier trained on NLI)",
            body=ZeroShotRequest,
            response=ZeroShotResponse,
            metric="/zero-shot-classification",
            **common,
        ),
    ]
