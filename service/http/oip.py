"""Open Inference Protocol v2 (KServe, Triton) endpoints over the same tasks, as its clients use them.

Input: one BYTES tensor named ``text`` of shape ``[N]`` (``[N, 1]`` accepted), as JSON strings or
in the binary tensor data extension (`service.http.binary`). Outputs are the task's
(`Task.outputs`), as JSON or binary (request `parameters.binary_data_output`, or per output
`parameters.binary_data`). Versioned routes answer for one loaded version. The model
repository extension lists, loads and unloads models. Errors: ``{"error": ...}``.
"""

from __future__ import annotations

import asyncio
import copy
import json
from collections.abc import Iterator, Mapping, Sequence
from contextlib import contextmanager
from dataclasses import dataclass
from importlib import metadata
from typing import Any

from pydantic import ValidationError
from starlette.responses import Response
from starlette.types import ASGIApp

from service.errors import InvalidInput, InvalidJson, LoadRefused, ModelNotFound, NotReady, ServiceError
from service.http import binary, schemas
from service.http.auth import audit
from service.http.dispatch import json_answer
from service.http.errors import AsciiJSONResponse
from service.http.pipeline import Codec, Decoded, Run
from service.http.scope import Call
from service.http.state import scope_state
from service.http.table import Auth, Protocol, Route, ServedModel
from service.serving import ModelSet, Snapshot, VersionState, VersionView
from service.settings import Settings
from service.store import StoreEntry
from service.tasks.base import OutputTensor, Task, Work
from service.validation import describe_validation, field_rules

PLATFORM = "onnxruntime_onnx"
EXTENSIONS = ["binary_tensor_data", "model_repository"]
INPUT = schemas.OipTensorMeta(name="text", datatype="BYTES", shape=[-1])
PAIR_INPUT = schemas.OipTensorMeta(name="text_pair", datatype="BYTES", shape=[-1])  # a pair classifier's second
RULES = field_rules(schemas.OipInferRequest, schemas.OipTensor)
INFER_METRIC = "/v2/models/{name}/infer"  # the versioned route counts under the same label
INFER_DOC = (
    "JSON, or the binary tensor data extension: the JSON header (its length in the "
    "Inference-Header-Content-Length header), then the tensors' bytes."
)


def _version() -> str:
    try:
        return metadata.version("transformer-serve")
    except metadata.PackageNotFoundError:
        return "0"


async def server_metadata(call: Call) -> ASGIApp:
    return json_answer({"name": "transformer-serve", "version": _version(), "extensions": EXTENSIONS})


async def live(call: Call) -> ASGIApp:
    return json_answer({"live": True})


async def ready(call: Call) -> ASGIApp:
    state = scope_state(call.scope)
    if not state.ready:
        raise NotReady(state.not_ready_reason())
    return json_answer({"ready": True})


# -- model metadata and readiness, with and without a version ------------------------------------


def _loaded(call: Call) -> list[VersionView]:
    """The model's versions that were loaded (or tried), oldest first; 404 for an unknown model."""
    name = call.params["name"]
    models = scope_state(call.scope).models
    models.get(name)  # ModelNotFound with the served names
    return [v for v in models.snapshot().model(name) if v.held]


def _metadata(call: Call, version: int | None) -> ASGIApp:
    loaded = _loaded(call)
    name = call.params["name"]
    if version is not None and version not in {v.version for v in loaded}:
        raise ModelNotFound(f"model {name} has no loaded version {version}")
    chosen = next((v for v in loaded if (v.version == version if version is not None else v.current)), None)
    task = chosen.task if chosen is not None else None
    outputs = (
        [schemas.OipTensorMeta(name=t.name, datatype=t.datatype, shape=t.shape) for t in task.outputs()] if task else []
    )
    versions = [str(version)] if version is not None else [str(v.version) for v in loaded]
    inputs = [INPUT, PAIR_INPUT] if task is not None and task.describe().get("pairs") else [INPUT]
    return json_answer(
        schemas.OipModelMetadata(name=name, versions=versions, platform=PLATFORM, inputs=inputs, outputs=outputs)
    )


async def model_metadata(call: Call) -> ASGIApp:
    return _metadata(call, None)


async def version_metadata(call: Call) -> ASGIApp:
    return _metadata(call, call.version())


async def _ready(call: Call, version: int | None) -> ASGIApp:
    name = call.params["name"]
    state = scope_state(call.scope)
    model = state.models.get(name)
    if state.draining:
        raise NotReady(f"model {name} is shutting down")
    model.ready_task(version)
    return json_answer({"name": model.name, "ready": True})


async def model_ready(call: Call) -> ASGIApp:
    return await _ready(call, None)


async def version_ready(call: Call) -> ASGIApp:
    return await _ready(call, call.version())


# -- inference: the codec around a task's `run` --------------------------------------------------


@dataclass(frozen=True, slots=True)
class InferRequest:
    """An inference request as decoded: the model it names, and its texts and parameters."""

    name: str
    version: int | None
    body: schemas.OipInferRequest
    texts: list[str]
    pairs: list[str] | None = None  # the second BYTES input `text_pair`: each text's second text

    @property
    def parameters(self) -> Mapping[str, Any]:
        return self.body.parameters or {}


class InferCodec(Codec[InferRequest, Any, Any]):
    """`infer`: the input tensor's texts in, every output the task has (or those asked for) out, as
    JSON or binary; `parameters` are the task's options and `timeout` (microseconds, as Triton)."""

    async def decode(self, call: Call, settings: Settings) -> Decoded[InferRequest]:
        version = call.version() if "version" in call.params else None
        head, blob = binary.split(call.body, call.header(binary.HEADER_LENGTH))
        body = _parse(head)
        texts, used = _texts(body.inputs[0], blob)
        schemas.check_texts(texts, settings.max_texts, settings.max_text_chars, "inputs[0].data")
        second = _pair_texts(body.inputs[1:], blob[used:], len(texts))
        if second is not None:
            schemas.check_texts(second, settings.max_texts, settings.max_text_chars, "inputs[1].data")
        request = InferRequest(call.params["name"], version, body, texts, second)
        return Decoded(request, [*texts, *(second or [])], _timeout_s(request.parameters))

    def resolve(self, request: InferRequest, models: ModelSet) -> Task:
        return models.get(request.name).ready_task(request.version)

    def work(self, request: InferRequest, task: Task, deadline: float) -> Work:
        _wanted(request, task)  # an output the model does not have: 422 before any work
        work = decode_work(task, request.texts, request.parameters, deadline)  # checked even for no texts
        if request.pairs is None:
            return work
        if not task.describe().get("pairs"):
            raise InvalidInput(f"inputs[1]: model {task.entry.name!r} takes single texts, not a text_pair")
        return Work((), work.options, deadline, pairs=list(zip(request.texts, request.pairs, strict=True)))

    async def execute(self, request: InferRequest, run: Run[Any], work: Work) -> Any:
        return await run(work) if work.texts or work.pairs else None  # none: a zero-size batch, nothing to run

    async def encode(self, request: InferRequest, task: Task, done: Any) -> ASGIApp:
        wanted = _wanted(request, task)
        tensors = task.tensors(done) if done is not None else empty_tensors(task)
        results = [t for t in tensors if t.name in wanted]
        default = request.parameters.get("binary_data_output", False)
        as_binary = [_flag(wanted[t.name].get("binary_data", default)) for t in results]
        return _respond(task.entry.name, str(task.entry.version), request.body.id, results, as_binary)


def _wanted(request: InferRequest, task: Task) -> Mapping[str, Mapping[str, Any]]:
    """The outputs asked for, each with its parameters (none asked: all of the task's)."""
    available = [t.name for t in task.outputs()]
    outputs = request.body.outputs
    wanted: Mapping[str, Mapping[str, Any]]
    wanted = {o.name: o.parameters or {} for o in outputs} if outputs else dict.fromkeys(available, {})
    if set(wanted) - set(available):
        raise InvalidInput(f"outputs: this model has only {available}")
    return wanted


def empty_tensors(task: Task) -> list[OutputTensor]:
    """The outputs of a zero-size batch (`shape: [0]`), which a tensor protocol allows: each of the
    task's outputs with its batch axis 0 and no data, answered without submitting work to the model."""
    return [OutputTensor(t.name, t.datatype, [0 if d == -1 else d for d in t.shape], []) for t in task.outputs()]


def decode_work(task: Task, texts: list[str], parameters: Mapping[str, Any], deadline: float) -> Work:
    """The request's `parameters` as the task's options (others, such as `binary_data_output`, are
    the protocol's own or ignored)."""
    options_type = task.Options
    chosen = {k: v for k, v in parameters.items() if k in options_type.model_fields}
    try:
        options = options_type.model_validate(chosen)
    except ValidationError as exc:
        raise InvalidInput(describe_validation(exc.errors(), field_rules(options_type), prefix="parameters.")) from None
    return Work(texts, options, deadline)


def _timeout_s(parameters: Mapping[str, Any]) -> float | None:
    """`parameters.timeout`: microseconds, as Triton takes it; it only shortens the deadline."""
    timeout = parameters.get("timeout")
    if timeout is None:
        return None
    if isinstance(timeout, bool) or not isinstance(timeout, int) or timeout < 1:
        raise InvalidInput("parameters.timeout must be a positive integer (microseconds)")
    return timeout / 1e6


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


def _pair_texts(rest: Sequence[schemas.OipTensor], blob: bytes, n: int) -> list[str] | None:
    """The second input `text_pair` of a pair classifier, one text per text of `text`; none: single texts."""
    if not rest:
        return None
    second, _ = _texts(rest[0], blob, "inputs[1]", "text_pair")
    if len(second) != n:
        raise InvalidInput(f"inputs[1] (text_pair) holds {len(second)} texts for the {n} of inputs[0]")
    return second


def _texts(tensor: schemas.OipTensor, blob: bytes, at: str = "inputs[0]", name: str = "text") -> tuple[list[str], int]:
    """The tensor's texts and the bytes of the binary tail they took."""
    if tensor.name != name:
        raise InvalidInput(f"{at}.name must be {name!r}")
    if tensor.datatype != "BYTES":
        raise InvalidInput(f"{at}.datatype must be BYTES")
    shape = tensor.shape
    if not (len(shape) == 1 or (len(shape) == 2 and shape[1] == 1)):
        raise InvalidInput(f"{at}.shape must be [N] or [N, 1]")
    size = (tensor.parameters or {}).get("binary_data_size")
    used = 0
    if size is not None:
        if tensor.data is not None:
            raise InvalidInput(f"{at} has both data and binary_data_size")
        raw, used = binary.take(blob, 0, size)
        try:
            data: list[Any] = [b.decode("utf-8") for b in binary.decode_bytes(raw)]
        except UnicodeDecodeError:
            raise InvalidInput(f"{at} holds bytes that are not UTF-8 text") from None
    elif tensor.data is None:
        raise InvalidInput(f"{at} needs data (JSON) or parameters.binary_data_size (binary)")
    else:
        data = tensor.data
        if data and all(isinstance(d, list) for d in data):  # nested row-major form
            data = [x for row in data for x in row]
        if not all(isinstance(d, str) for d in data):
            raise InvalidInput(f"{at}.data must hold strings (BYTES as JSON strings)")
    if len(data) != shape[0]:  # shape [0] with no data is a zero-size batch (`empty_tensors`)
        raise InvalidInput(f"{at}.shape says {shape[0]} texts but data holds {len(data)}")
    return data, used


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


INDEX_STATES = {VersionState.READY: "READY", VersionState.LOADING: "LOADING"}  # the rest: UNAVAILABLE


async def repository_index(call: Call) -> ASGIApp:
    """Every version of every model, in the service or on disk: READY, LOADING, UNAVAILABLE (with the reason)."""
    models = scope_state(call.scope).models
    snapshot = models.snapshot()
    rows: dict[tuple[str, int], dict[str, str]] = {}
    for v in snapshot.versions:
        if v.state is VersionState.UNLOADED and not v.held:
            continue  # an unloaded model with no version left lists none (its folders are listed below)
        state = INDEX_STATES.get(v.state, "UNAVAILABLE")
        unloaded = v.state is VersionState.UNLOADED
        reason = "unloaded" if unloaded else v.error or ("" if state == "READY" else v.state.value)
        rows[(v.name, v.version)] = {"name": v.name, "version": str(v.version), "state": state, "reason": reason}
    entries = await asyncio.get_running_loop().run_in_executor(models.executor, models.on_disk)
    for e in entries:
        if (e.name, e.version) not in rows:
            rows[(e.name, e.version)] = {
                "name": e.name,
                "version": str(e.version),
                "state": "UNAVAILABLE",
                "reason": _not_served(e, snapshot),
            }
    return json_answer([rows[k] for k in sorted(rows)])


def _not_served(entry: StoreEntry, snapshot: Snapshot) -> str:
    if entry.error is not None:
        return entry.error
    serving = [v.version for v in snapshot.serving() if v.name == entry.name]
    if serving:
        return f"not loaded: version {serving[0]} serves"
    return "not loaded: the model is unloaded" if snapshot.model(entry.name) else "not loaded"


async def repository_load(call: Call) -> ASGIApp:
    """Loads the version the model's policy picks (the newest intact one, or the pinned one); 409
    with the reason when the store holds nothing it can serve."""
    name = call.params["name"]
    models = scope_state(call.scope).models
    with _audited(call, "load", name):
        await models.refresh(only=name)  # runs to its end if the client leaves
        models.get(name)
        views = models.snapshot().model(name)
        if not any(v.current for v in views):
            reasons = [v.error for v in views if v.state in (VersionState.REFUSED, VersionState.FAILED) and v.error]
            raise LoadRefused(f"model {name} could not be loaded: {'; '.join(reasons) or 'no intact version'}")
    return json_answer({})


async def repository_unload(call: Call) -> ASGIApp:
    """Stops serving the model; its versions finish their admitted work first."""
    name = call.params["name"]
    with _audited(call, "unload", name):
        await scope_state(call.scope).models.unload(name)
    return json_answer({})


@contextmanager
def _audited(call: Call, action: str, model: str) -> Iterator[None]:
    """One audit line per model-control action, with its outcome."""
    try:
        yield
    except ServiceError as exc:
        audit(call.scope, f"model control: {action} {model}: {exc.kind}", action=action, model=model, outcome=exc.kind)
        raise
    except asyncio.CancelledError:
        audit(
            call.scope, f"model control: {action} {model}: the client left", action=action, model=model, outcome="left"
        )
        raise
    audit(call.scope, f"model control: {action} {model}", action=action, model=model, outcome="done")


INFER = InferCodec()


def infer_doc(components: Mapping[str, Any], model: ServedModel) -> dict[str, Any]:
    """One model's infer body in the document: `outputs` names only that model's outputs (another
    name is a 422), which the body every model shares cannot say."""
    body = copy.deepcopy(components[schemas.OipInferRequest.__name__])
    requested = copy.deepcopy(components[schemas.OipRequestedOutput.__name__])
    requested["properties"]["name"] = {"type": "string", "enum": list(dict(model[3]).get("outputs", ()))}
    body["properties"]["outputs"] = {"anyOf": [{"type": "array", "items": requested}, {"type": "null"}]}
    return {"requestBody": {"required": True, "content": {"application/json": {"schema": body}}}}


def routes() -> list[Route]:
    meta, infer_errors = schemas.OipModelMetadata, (404, 413, 422, 429, 503, 504)
    oip = Protocol.OIP
    return [
        Route("/v2", ("GET",), server_metadata, "server_metadata", oip, summary="Server Metadata"),
        Route("/v2/health/live", ("GET",), live, "live", oip, summary="Live", probe=True),
        Route("/v2/health/ready", ("GET",), ready, "ready", oip, summary="Ready", probe=True, errors=(503,)),
        Route(
            "/v2/models/{name}",
            ("GET",),
            model_metadata,
            "model_metadata",
            oip,
            response=meta,
            errors=(404,),
            names_served_model=True,
        ),
        Route(
            "/v2/models/{name}/versions/{version}",
            ("GET",),
            version_metadata,
            "version_metadata",
            oip,
            response=meta,
            errors=(404, 422),
            names_served_model=True,
        ),
        Route(
            "/v2/models/{name}/ready",
            ("GET",),
            model_ready,
            "model_ready",
            oip,
            errors=(404, 503),
            names_served_model=True,
        ),
        Route(
            "/v2/models/{name}/versions/{version}/ready",
            ("GET",),
            version_ready,
            "version_ready",
            oip,
            errors=(404, 422, 503),
            names_served_model=True,
        ),
        *(
            Route(
                path,
                ("POST",),
                INFER,
                name,
                oip,
                summary="Infer",
                description=INFER_DOC,
                body=schemas.OipInferRequest,
                response=schemas.OipInferResponse,
                auth=Auth.BEARER,
                errors=infer_errors,
                metric=INFER_METRIC,
                binary=True,
                names_served_model=True,
                doc_model=infer_doc,
            )
            for path, name in (
                ("/v2/models/{name}/infer", "infer"),
                ("/v2/models/{name}/versions/{version}/infer", "version_infer"),
            )
        ),
        Route(
            "/v2/repository/index",
            ("POST",),
            repository_index,
            "repository_index",
            oip,
            summary=(repository_index.__doc__ or "").split(":")[0],
            auth=Auth.BEARER,
        ),
        Route(
            "/v2/repository/models/{name}/load",
            ("POST",),
            repository_load,
            "repository_load",
            oip,
            summary="Load a model",
            description=repository_load.__doc__ or "",
            auth=Auth.ADMIN,
            errors=(404, 409),
        ),
        Route(
            "/v2/repository/models/{name}/unload",
            ("POST",),
            repository_unload,
            "repository_unload",
            oip,
            summary="Unload a model",
            description=repository_unload.__doc__ or "",
            auth=Auth.ADMIN,
            errors=(404,),
        ),
    ]
