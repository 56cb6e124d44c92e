"""Open Inference Protocol v2 (KServe, Triton) endpoints over the same tasks, as its clients use them.

Input: one BYTES tensor named ``text`` of shape ``[N]`` (``[N, 1]`` accepted), as JSON strings or
in the binary tensor data extension (`service.http.binary`). Outputs are the task's
(`Task.outputs`), as JSON or binary (request `parameters.binary_data_output`, or per output
`parameters.binary_data`). Versioned routes answer for one loaded version. The model
repository extension lists, loads and unloads models. Errors: ``{"error": ...}``.
"""

from __future__ import annotations

import json
import re
from importlib import metadata
from typing import Any

from fastapi import APIRouter, Request
from pydantic import ValidationError
from starlette.responses import Response
from starlette.types import Scope

from service.errors import InvalidInput, InvalidJson, ModelNotFound, NotReady
from service.http import binary, schemas
from service.http.errors import AsciiJSONResponse
from service.http.middleware import header, request_info
from service.http.state import admit_scope, get_state
from service.serving import ModelSet, VersionState
from service.tasks.base import OutputTensor
from service.validation import describe_validation, field_rules

router = APIRouter(prefix="/v2")

PLATFORM = "onnxruntime_onnx"
EXTENSIONS = ["binary_tensor_data", "model_repository"]
OIP_STATES = {VersionState.READY: "READY", VersionState.LOADING: "LOADING"}  # the rest: UNAVAILABLE
INPUT = schemas.OipTensorMeta(name="text", datatype="BYTES", shape=[-1])
RULES = field_rules(schemas.OipInferRequest, schemas.OipTensor)
INFER_DOC: dict[str, Any] = {
    "description": "JSON, or the binary tensor data extension: the JSON header (its length in the "
    "Inference-Header-Content-Length header), then the tensors' bytes.",
    "requestBody": {
        "required": True,
        "content": {"application/json": {"schema": {"$ref": "#/components/schemas/OipInferRequest"}}},
    },
}


def _version() -> str:
    try:
        return metadata.version("transformer-serve")
    except metadata.PackageNotFoundError:
        return "0"


@router.get("")
async def server_metadata() -> dict[str, object]:
    return {"name": "transformer-serve", "version": _version(), "extensions": EXTENSIONS}


@router.get("/health/live")
async def live() -> dict[str, bool]:
    return {"live": True}


@router.get("/health/ready")
async def ready(request: Request) -> dict[str, bool]:
    state = get_state(request)
    if not state.ready:
        raise NotReady(state.not_ready_reason())
    return {"ready": True}


# -- model metadata and readiness, with and without a version ------------------------------------


def _metadata(models: ModelSet, name: str, version: int | None) -> schemas.OipModelMetadata:
    models.get(name)  # 404 for a model the store does not have
    held = [v for v in models.snapshot().model(name) if v.held]
    if version is not None and version not in [v.version for v in held]:
        raise ModelNotFound(f"model {name} has no loaded version {version}")
    v = next((v for v in held if (v.version == version if version is not None else v.current)), None)
    task = v.task if v is not None else None
    outputs = (
        [schemas.OipTensorMeta(name=t.name, datatype=t.datatype, shape=t.shape) for t in task.outputs()] if task else []
    )
    versions = [str(version)] if version is not None else [str(v.version) for v in held]
    return schemas.OipModelMetadata(name=name, versions=versions, platform=PLATFORM, inputs=[INPUT], outputs=outputs)


@router.get("/models/{name}", response_model=schemas.OipModelMetadata)
async def model_metadata(name: str, request: Request) -> schemas.OipModelMetadata:
    return _metadata(get_state(request).models, name, None)


@router.get("/models/{name}/versions/{version}", response_model=schemas.OipModelMetadata)
async def version_metadata(name: str, version: int, request: Request) -> schemas.OipModelMetadata:
    return _metadata(get_state(request).models, name, version)


async def _ready(request: Request, name: str, version: int | None) -> dict[str, object]:
    state = get_state(request)
    model = state.models.get(name)
    if state.draining:
        raise NotReady(f"model {name} is shutting down")
    model.ready_task(version)
    return {"name": model.name, "ready": True}


@router.get("/models/{name}/ready")
async def model_ready(name: str, request: Request) -> dict[str, object]:
    return await _ready(request, name, None)


@router.get("/models/{name}/versions/{version}/ready")
async def version_ready(name: str, version: int, request: Request) -> dict[str, object]:
    return await _ready(request, name, version)


# -- inference -----------------------------------------------------------------------------------


# Under a server, `service.http.direct` answers these POSTs before FastAPI's routing, through the
# same `answer_infer`; the routes give the API document its operations. A version of more digits
# than an int64 holds goes on to FastAPI, which answers it as it always did (404, or 422 beyond
# what Python converts).
INFER_PATH = re.compile(r"/v2/models/(?P<name>[^/]+)(?:/versions/(?P<version>[0-9]{1,18}))?/infer")


@router.post("/models/{name}/infer", response_model=schemas.OipInferResponse, openapi_extra=INFER_DOC)
async def infer(name: str, request: Request) -> Response:
    return await answer_infer(request.scope, await request.body(), name, None)


@router.post(
    "/models/{name}/versions/{version}/infer", response_model=schemas.OipInferResponse, openapi_extra=INFER_DOC
)
async def version_infer(name: str, version: int, request: Request) -> Response:
    return await answer_infer(request.scope, await request.body(), name, version)


async def answer_infer(scope: Scope, raw: bytes, name: str, version: int | None) -> Response:
    """An inference request's answer (JSON or binary), from its body as received."""
    state, deadline = admit_scope(scope)
    head, blob = binary.split(raw, header(scope, binary.HEADER_LENGTH))
    body = _parse(head)
    model = state.models.get(name)
    task = model.ready_task(version)
    request_info(scope).model = model.name
    texts = _texts(body.inputs[0], blob)
    schemas.check_texts(texts, state.settings.max_texts, state.settings.max_text_chars, "inputs[0].data")
    available = [t.name for t in task.outputs()]
    wanted = {o.name: o.parameters or {} for o in body.outputs} if body.outputs else dict.fromkeys(available, {})
    unknown = set(wanted) - set(available)
    if unknown:
        raise InvalidInput(f"unknown output(s) {sorted(unknown)}; this model has {available}")
    parameters = body.parameters or {}
    results = [t for t in await task.infer(texts, parameters, deadline) if t.name in wanted]
    as_binary = [_flag(wanted[t.name].get("binary_data", parameters.get("binary_data_output", False))) for t in results]
    return _respond(task.entry.name, str(task.entry.version), body.id, results, as_binary)


def _parse(head: bytes) -> schemas.OipInferRequest:
    try:
        raw = schemas.load_json(head or b"null")
    except ValueError as exc:
        raise InvalidJson(f"invalid JSON in the inference request header: {exc}") from None
    try:
        return schemas.OipInferRequest.model_validate(raw)
    except ValidationError as exc:
        raise InvalidInput(describe_validation(exc.errors(), RULES)) from None


def _flag(value: object) -> bool:
    if not isinstance(value, bool):
        raise InvalidInput("binary_data and binary_data_output must be true or false")
    return value


def _texts(tensor: schemas.OipTensor, blob: bytes) -> list[str]:
    if tensor.name != "text":
        raise InvalidInput(f"inputs[0].name must be 'text', got {tensor.name!r}")
    if tensor.datatype != "BYTES":
        raise InvalidInput(f"inputs[0].datatype must be BYTES, got {tensor.datatype!r}")
    shape = tensor.shape
    if not (len(shape) == 1 or (len(shape) == 2 and shape[1] == 1)):
        raise InvalidInput(f"inputs[0].shape must be [N] or [N, 1], got {shape}")
    size = (tensor.parameters or {}).get("binary_data_size")
    if size is not None:
        if tensor.data is not None:
            raise InvalidInput("inputs[0] has both data and binary_data_size")
        raw, _ = binary.take(blob, 0, size)
        try:
            data: list[Any] = [b.decode("utf-8") for b in binary.decode_bytes(raw)]
        except UnicodeDecodeError:
            raise InvalidInput("inputs[0] holds bytes that are not UTF-8 text") from None
    elif tensor.data is None:
        raise InvalidInput("inputs[0] needs data (JSON) or parameters.binary_data_size (binary)")
    else:
        data = tensor.data
        if data and all(isinstance(d, list) for d in data):  # nested row-major form
            data = [x for row in data for x in row]
        if not all(isinstance(d, str) for d in data):
            raise InvalidInput("inputs[0].data must hold strings (BYTES as JSON strings)")
    if len(data) != shape[0] or shape[0] == 0:
        raise InvalidInput(f"inputs[0].shape says {shape[0]} texts but data holds {len(data)} (at least 1)")
    return data


def _respond(
    name: str, version: str, request_id: str | None, results: list[OutputTensor], as_binary: list[bool]
) -> Response:
    outputs, blobs = [], []
    for t, raw in zip(results, as_binary, strict=True):
        out: dict[str, Any] = {"name": t.name, "datatype": t.datatype, "shape": t.shape}
        if raw:
            blob = binary.encode(t.datatype, t.data)
            out["parameters"] = {"binary_data_size": len(blob)}
            blobs.append(blob)
        else:
            out["data"] = t.data
        outputs.append(out)
    body: dict[str, Any] = {"model_name": name, "model_version": version, "outputs": outputs}
    if request_id is not None:
        body["id"] = request_id
    if not blobs:
        return AsciiJSONResponse(body)
    head = json.dumps(body, ensure_ascii=True, separators=(",", ":")).encode("ascii")
    return Response(
        head + b"".join(blobs),
        media_type="application/octet-stream",
        headers={"Inference-Header-Content-Length": str(len(head))},
    )


# -- model repository extension ------------------------------------------------------------------


@router.post("/repository/index")
async def repository_index(request: Request) -> list[dict[str, str]]:
    """Every version of every model: READY, LOADING, UNAVAILABLE (with the reason)."""
    out = []
    for v in get_state(request).models.snapshot().versions:
        if v.state is VersionState.UNLOADED and not v.held:
            continue  # an unloaded model with no version left lists none
        state = OIP_STATES.get(v.state, "UNAVAILABLE")
        reason = (
            "unloaded" if v.state is VersionState.UNLOADED else v.error or ("" if state == "READY" else v.state.value)
        )
        out.append({"name": v.name, "version": str(v.version), "state": state, "reason": reason})
    return out


@router.post("/repository/models/{name}/load")
async def repository_load(name: str, request: Request) -> dict[str, object]:
    """Loads the version the model's policy picks (the newest intact one, or the pinned one)."""
    models = get_state(request).models
    await models.refresh(only=name)
    models.get(name)
    versions = models.snapshot().model(name)
    if not any(v.current for v in versions):
        reasons = [v.error for v in versions if v.state in (VersionState.REFUSED, VersionState.FAILED) and v.error]
        raise InvalidInput(f"model {name} could not be loaded: {'; '.join(reasons) or 'no intact version'}")
    return {}


@router.post("/repository/models/{name}/unload")
async def repository_unload(name: str, request: Request) -> dict[str, object]:
    """Stops serving the model; its versions finish their admitted work first."""
    await get_state(request).models.unload(name)
    return {}
