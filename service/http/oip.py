"""Open Inference Protocol v2 (KServe) endpoints over the same tasks.

Input: one BYTES tensor named ``text`` of shape ``[N]`` (``[N, 1]`` accepted). Outputs and their
`parameters` are the task's (`Task.outputs`, `Task.infer`). Errors: ``{"error": ...}``.
"""

from __future__ import annotations

from importlib.metadata import PackageNotFoundError, version
from typing import Any

from fastapi import APIRouter, Request

from service.errors import InvalidInput, NotReady
from service.http import schemas
from service.http.state import admit, get_state, set_model

router = APIRouter(prefix="/v2")

PLATFORM = "onnxruntime_onnx"
INPUT = schemas.OipTensorMeta(name="text", datatype="BYTES", shape=[-1])


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


@router.get("/models/{name}", response_model=schemas.OipModelMetadata)
async def model_metadata(name: str, request: Request) -> schemas.OipModelMetadata:
    model = get_state(request).models.get(name)
    outputs = (
        [schemas.OipTensorMeta(name=t.name, datatype=t.datatype, shape=t.shape) for t in model.task.outputs()]
        if model.task
        else []
    )
    return schemas.OipModelMetadata(
        name=model.name, versions=[str(model.version)], platform=PLATFORM, inputs=[INPUT], outputs=outputs
    )


@router.get("/models/{name}/ready")
async def model_ready(name: str, request: Request) -> dict[str, object]:
    state = get_state(request)
    model = state.models.get(name)
    if state.draining or model.status != "ready":
        raise NotReady(f"model {name} is {'shutting down' if state.draining else model.status}")
    return {"name": model.name, "ready": True}


@router.post("/models/{name}/infer", response_model=schemas.OipInferResponse, response_model_exclude_none=True)
async def infer(name: str, body: schemas.OipInferRequest, request: Request) -> schemas.OipInferResponse:
    state, deadline = admit(request)
    model = state.models.get(name)
    task = model.ready_task()
    set_model(request, model.name)
    texts = _texts(body.inputs[0])
    schemas.check_texts(texts, state.settings.max_texts, state.settings.max_text_chars, "inputs[0].data")
    available = [t.name for t in task.outputs()]
    wanted = {o.name for o in body.outputs} if body.outputs else set(available)
    unknown = wanted - set(available)
    if unknown:
        raise InvalidInput(f"unknown output(s) {sorted(unknown)}; this model has {available}")
    results = await task.infer(texts, body.parameters or {}, deadline)
    outputs = [
        schemas.OipOutput(name=t.name, datatype=t.datatype, shape=t.shape, data=t.data)
        for t in results
        if t.name in wanted
    ]
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
