"""Open Inference Protocol v2 (KServe) endpoints over the same models and batchers.

Input: one BYTES tensor named ``text`` of shape ``[N]`` (``[N, 1]`` accepted). Classifier
outputs ``label`` (BYTES ``[N]``) and ``probabilities`` (FP32 ``[N, C]``, row-major); translator
output ``translation`` (BYTES ``[N]``), decoding options from the request's ``parameters``
(``decode``, ``beam_size``, ``max_new_tokens``, ``length_penalty``). Errors: ``{"error": ...}``.
"""

from __future__ import annotations

from importlib.metadata import PackageNotFoundError, version
from typing import Any

import numpy as np
from fastapi import APIRouter, Request
from pydantic import ValidationError

from service import schemas
from service.engine import ClassifierEngine, TranslatorEngine
from service.errors import InvalidInput, ModelNotFound, NotReady
from service.handlers import describe_validation
from service.serving import ServedModel
from service.state import admit, get_state, set_model

router = APIRouter(prefix="/v2")

PLATFORM = "onnxruntime_onnx"
INPUT = schemas.OipTensorMeta(name="text", datatype="BYTES", shape=[-1])
OUTPUTS = {
    "classification": ("label", "probabilities"),
    "translation": ("translation",),
}
DECODE_KEYS = set(schemas.DecodeOptions.model_fields)


def _version() -> str:
    try:
        return version("transformer-serve")
    except PackageNotFoundError:
        return "0"


@router.get("")
async def server_metadata() -> dict[str, object]:
    return {"name": "transformer-serve", "version": _version(), "extensions": []}


@router.get("/health/live")
async def live() -> dict[str, bool]:
    return {"live": True}


@router.get("/health/ready")
async def ready(request: Request) -> dict[str, bool]:
    state = get_state(request)
    if not state.ready:
        raise NotReady(state.not_ready_reason())
    return {"ready": True}


def _model(request: Request, name: str) -> ServedModel:
    model = get_state(request).models.models.get(name)
    if model is None:
        raise ModelNotFound(f"no model named {name!r}")
    return model


@router.get("/models/{name}", response_model=schemas.OipModelMetadata)
async def model_metadata(name: str, request: Request) -> schemas.OipModelMetadata:
    model = _model(request, name)
    outputs = []
    man = model.manifest
    if man is not None and man.task == "classification":
        outputs = [
            schemas.OipTensorMeta(name="label", datatype="BYTES", shape=[-1]),
            schemas.OipTensorMeta(name="probabilities", datatype="FP32", shape=[-1, len(man.labels)]),
        ]
    elif man is not None:
        outputs = [schemas.OipTensorMeta(name="translation", datatype="BYTES", shape=[-1])]
    return schemas.OipModelMetadata(
        name=model.name, versions=[str(model.version)], platform=PLATFORM, inputs=[INPUT], outputs=outputs
    )


@router.get("/models/{name}/ready")
async def model_ready(name: str, request: Request) -> dict[str, object]:
    model = _model(request, name)
    if get_state(request).draining or model.status != "ready":
        raise NotReady(f"model {name} is {'shutting down' if get_state(request).draining else model.status}")
    return {"name": model.name, "ready": True}


@router.post("/models/{name}/infer", response_model=schemas.OipInferResponse, response_model_exclude_none=True)
async def infer(name: str, body: schemas.OipInferRequest, request: Request) -> schemas.OipInferResponse:
    state, deadline = admit(request)
    model = _model(request, name)
    if model.manifest is None:
        raise NotReady(f"model {name} is not available: it failed to load")
    task = model.manifest.task
    model = state.models.resolve(name, task)
    set_model(request, model.name)
    texts = _texts(body.inputs[0])
    schemas.check_texts(texts, state.settings.max_texts, state.settings.max_text_chars, "inputs[0].data")
    wanted = _requested_outputs(body, OUTPUTS[task])
    n = len(texts)
    outputs: list[schemas.OipOutput] = []
    if isinstance(model.engine, ClassifierEngine):
        probs = await state.models.classify(model, texts, deadline)  # (N, C)
        labels = [model.engine.labels[i] for i in probs.argmax(axis=1)]
        c = probs.shape[1]
        if "label" in wanted:
            outputs.append(schemas.OipOutput(name="label", datatype="BYTES", shape=[n], data=labels))
        if "probabilities" in wanted:
            flat = probs.astype(np.float32).reshape(-1).tolist()
            outputs.append(schemas.OipOutput(name="probabilities", datatype="FP32", shape=[n, c], data=flat))
    else:
        engine = model.engine
        assert isinstance(engine, TranslatorEngine)
        params = _decode_options(body.parameters).params(engine.max_new_tokens)
        hyps = await state.models.translate(model, texts, params, deadline)
        best = [row[0].text for row in engine.to_translations(hyps)]
        outputs.append(schemas.OipOutput(name="translation", datatype="BYTES", shape=[n], data=best))
    return schemas.OipInferResponse(
        model_name=model.name, model_version=str(model.version), id=body.id, outputs=outputs
    )


def _texts(tensor: schemas.OipTensor) -> list[str]:
    if tensor.name != "text":
        raise InvalidInput(f"inputs[0].name must be 'text', got {tensor.name!r}")
    if tensor.datatype != "BYTES":
        raise InvalidInput(f"inputs[0].datatype must be BYTES, got {tensor.datatype!r}")
    shape = tensor.shape
    if not (len(shape) == 1 or (len(shape) == 2 and shape[1] == 1)):
        raise InvalidInput(f"inputs[0].shape must be [N] or [N, 1], got {shape}")
    data: list[Any] = tensor.data
    if data and all(isinstance(d, list) for d in data):  # nested row-major form
        data = [x for row in data for x in row]
    if not all(isinstance(d, str) for d in data):
        raise InvalidInput("inputs[0].data must hold strings (BYTES as JSON strings)")
    if len(data) != shape[0] or shape[0] == 0:
        raise InvalidInput(f"inputs[0].shape says {shape[0]} texts but data holds {len(data)} (at least 1)")
    return data


def _requested_outputs(body: schemas.OipInferRequest, available: tuple[str, ...]) -> set[str]:
    if not body.outputs:
        return set(available)
    names = {o.name for o in body.outputs}
    unknown = names - set(available)
    if unknown:
        raise InvalidInput(f"unknown output(s) {sorted(unknown)}; this model has {list(available)}")
    return names


def _decode_options(parameters: dict[str, Any] | None) -> schemas.DecodeOptions:
    """Decoding options from the request's parameters; other parameters are ignored."""
    chosen = {k: v for k, v in (parameters or {}).items() if k in DECODE_KEYS}
    try:
        return schemas.DecodeOptions.model_validate(chosen)
    except ValidationError as exc:
        raise InvalidInput(describe_validation(exc.errors(), prefix="parameters.")) from None
