"""REST endpoints: HTTP in, HTTP out. Models, batching and errors live elsewhere."""

from __future__ import annotations

import math

from fastapi import APIRouter, Request
from starlette.responses import Response

from service import schemas
from service.engine import ClassifierEngine, TranslatorEngine
from service.errors import NotReady, ShuttingDown
from service.metrics import CONTENT_TYPE
from service.state import admit, get_state, set_model

ERRORS: dict[int | str, dict[str, object]] = {
    code: {"model": schemas.ErrorResponse, "description": what}
    for code, what in (
        (404, "unknown model"),
        (413, "body, text or token count above its limit"),
        (422, "invalid field (the message names it and its allowed range)"),
        (429, "queue full (see Retry-After)"),
        (503, "not ready or shutting down"),
        (504, "deadline passed"),
    )
}

router = APIRouter()


@router.get("/healthz")
async def healthz() -> dict[str, str]:
    """Alive: the process answers (models may still be loading)."""
    return {"status": "ok"}


@router.get("/readyz", responses={503: {"model": schemas.ErrorResponse}})
async def readyz(request: Request) -> dict[str, object]:
    """200 only when every model is loaded and warmed up and the service is not shutting down."""
    state = get_state(request)
    if state.draining:
        raise ShuttingDown(state.not_ready_reason())
    if not state.ready:
        raise NotReady(state.not_ready_reason())
    return {"status": "ready", "models": sorted(state.models.models)}


@router.get("/metrics", response_class=Response)
async def metrics(request: Request) -> Response:
    return Response(get_state(request).metrics.render(), media_type=CONTENT_TYPE)


@router.get("/v1/models", response_model=schemas.ModelsResponse, response_model_exclude_none=True)
async def list_models(request: Request) -> schemas.ModelsResponse:
    state = get_state(request)
    out = []
    for m in state.models.models.values():
        man = m.manifest
        out.append(
            schemas.ModelInfo(
                name=m.name,
                version=m.version,
                task=m.task,
                status=m.status,
                variant=m.engine.variant if m.engine else None,
                labels=list(man.labels) if man and man.task == "classification" else None,
                max_source_tokens=man.max_source_tokens if man else None,
                max_new_tokens=man.max_new_tokens if man and man.task == "translation" else None,
                error=m.error,
            )
        )
    return schemas.ModelsResponse(models=out)


@router.post("/predict", response_model=schemas.PredictResponse, responses=ERRORS)
async def predict(body: schemas.PredictRequest, request: Request) -> schemas.PredictResponse:
    state, deadline = admit(request)
    s = state.settings
    schemas.check_texts(body.texts, s.max_texts, s.max_text_chars)
    model = state.models.resolve(body.model, "classification")
    set_model(request, model.name)
    probs = await state.models.classify(model, body.texts, deadline)
    assert isinstance(model.engine, ClassifierEngine)
    predictions = [
        schemas.Prediction(label=p.label, score=p.score, scores=p.scores) for p in model.engine.to_predictions(probs)
    ]
    return schemas.PredictResponse(model=model.name, version=model.version, predictions=predictions)


@router.post("/translate", response_model=schemas.TranslateResponse, response_model_exclude_none=True, responses=ERRORS)
async def translate(body: schemas.TranslateRequest, request: Request) -> schemas.TranslateResponse:
    state, deadline = admit(request)
    s = state.settings
    schemas.check_texts(body.texts, s.max_texts, s.max_text_chars)
    model = state.models.resolve(body.model, "translation")
    set_model(request, model.name)
    engine = model.engine
    assert isinstance(engine, TranslatorEngine)
    params = body.params(engine.max_new_tokens)
    hyps = await state.models.translate(model, body.texts, params, deadline)
    translations = []
    for row in engine.to_translations(hyps):
        best = row[0]
        translations.append(
            schemas.Translation(
                text=best.text,
                score=finite(best.score) if body.return_scores else None,
                hypotheses=[schemas.Hypothesis(text=t.text, score=finite(t.score)) for t in row]
                if params.num_hypotheses > 1
                else None,
            )
        )
    return schemas.TranslateResponse(model=model.name, version=model.version, translations=translations)


def finite(x: float) -> float:
    """JSON has no -inf: a hypothesis with an impossible token gets the lowest finite score."""
    return x if math.isfinite(x) else -1e30
