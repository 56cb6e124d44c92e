"""Bodies shared by every task: model listing, errors, the Open Inference Protocol tensors, and the
request-size limits from the settings. Each task's own REST bodies live in its task module."""

from __future__ import annotations

import json
from collections.abc import Callable, Mapping, Sequence
from typing import Annotated, Any, Literal, TypeVar

from pydantic import AfterValidator, Field, ValidationError

from service.errors import InvalidInput, InvalidJson, UnreadableBody
from service.tasks.base import INTEGRAL, ResponseModel, StrictModel
from service.validation import describe_validation

T = TypeVar("T")
UNREADABLE = "There was an error parsing the body"
MISSING = {"type": "missing", "loc": (), "msg": "Field required"}  # an empty body


def load_json(body: bytes) -> Any:
    """A request body's JSON. Whatever makes a body unreadable raises ValueError: malformed JSON
    (json.JSONDecodeError), bytes that are not UTF-8 (UnicodeDecodeError), and nesting deeper
    than the parser's recursion limit (RecursionError otherwise: a 500 for a 4xx input)."""
    try:
        return json.loads(body)
    except RecursionError:
        raise ValueError("JSON nested too deeply") from None


def parse_json(body: bytes, validate: Callable[[Any], T], rules: Mapping[str, str]) -> T:
    """A JSON body, validated (`validate` raises pydantic's ValidationError): InvalidJson or
    UnreadableBody (400), InvalidInput (422, described with the field `rules`)."""
    if not body:
        raise InvalidInput(describe_validation([MISSING], rules))
    try:
        data = load_json(body)
    except json.JSONDecodeError as exc:
        raise InvalidJson(f"invalid JSON at position {exc.pos}: {exc.msg}") from None
    except ValueError:
        raise UnreadableBody(UNREADABLE) from None
    try:
        return validate(data)
    except ValidationError as exc:
        raise InvalidInput(describe_validation(exc.errors(), rules)) from None


def check_texts(
    texts: Sequence[str], max_texts: int, max_chars: int, field: str = "texts", listed: tuple[str, int] | None = None
) -> None:
    """The settings' text limits, and text the tokenizer cannot take (lone surrogates): 422, as
    any field out of the range the API document states (`text_limits`; LibreTranslate: 400).
    `listed`: the field and count against `max_texts` where `texts` are not one per item (pairs)."""
    name, items = listed or (field, len(texts))
    if items > max_texts:
        raise InvalidInput(f"{name} has {items} items; at most {max_texts} per request")
    for i, text in enumerate(texts):
        if len(text) > max_chars:
            raise InvalidInput(f"{field}[{i}] has {len(text)} characters; at most {max_chars} per text")
        try:
            text.encode("utf-8")
        except UnicodeEncodeError as exc:
            raise InvalidInput(
                f"{field}[{i}] is not valid Unicode (a lone surrogate at position {exc.start})"
            ) from None


def text_limits(schema: dict[str, Any], max_texts: int, max_chars: int, invalid: int = 422, big: int = 413) -> None:
    """The API document's form of `check_texts`' limits, on the JSON Schema of a list of texts.

    What the document states is checked as it states it: more texts or characters than it allows
    is a 422 (LibreTranslate: 400), as any other field out of range, so a client that validates
    against the document is never refused for size. What no schema can state, a text over the
    model's tokens, is a 413 (docs/serving.md, "Errors"); the description says both."""
    schema["maxItems"] = max_texts
    schema.setdefault("items", {})["maxLength"] = max_chars
    said = f"more than {max_texts} texts or a text over {max_chars} characters: {invalid}"
    said += f"; a text over the model's tokens: {big}"
    schema["description"] = "; ".join(x for x in (schema.get("description", ""), said) if x)


class ModelInfo(ResponseModel):
    """One version of a model: OpenAI's model object (`id`, `object`, `created`, `owned_by`) with the
    project's fields."""

    id: str = Field(description="the model's name, as `model` takes it (one entry per version)")
    object: Literal["model"] = "model"
    created: int = Field(default=0, description="Unix time the version was published; 0: not known")
    owned_by: str = "transformer-serve"
    name: str
    version: int
    task: str | None = None
    status: Literal["loading", "ready", "failed", "draining", "unloaded", "refused"]
    current: bool | None = None
    variant: str | None = None
    labels: list[str] | None = None
    pairs: bool | None = Field(default=None, description="a classifier that takes pairs of texts (/rerank, zero-shot)")
    max_source_tokens: int | None = None
    max_new_tokens: int | None = None
    source_language: str | None = None
    target_language: str | None = None
    source_languages: list[str] | None = Field(default=None, description="translators: the `source_language` values")
    target_languages: list[str] | None = Field(default=None, description="translators: the `target_language` values")
    prefix: str | None = Field(default=None, description="text-to-text models: what every input is read after")
    figures: list[str] | None = Field(default=None, description="pictures at /v1/models/{name}/figures/{figure}")
    error: str | None = None


class ModelsResponse(ResponseModel):
    """OpenAI's list shape (`client.models.list()` reads it)."""

    object: Literal["list"] = "list"
    data: list[ModelInfo]


# -- Open Inference Protocol v2 (KServe) ---------------------------------------------------------


def _json_tensor(schema: dict[str, Any]) -> None:
    """The document describes JSON bodies, where a tensor carries its data (binary: docs/protocols.md)."""
    schema["required"] = [*schema.get("required", []), "data"]
    schema["properties"]["data"] = {"type": "array", "items": {"type": "string"}, "description": "one text per row"}
    # [N] or [N, 1]; that N is the number of texts in `data` no schema can say (bench/schemathesis.toml)
    schema["properties"]["shape"]["prefixItems"] = [{"type": "integer", "minimum": 0}, {"const": 1}]


class OipTensor(StrictModel):
    model_config = StrictModel.model_config | {"json_schema_extra": _json_tensor}

    name: Literal["text", "text_pair"] = Field(
        description="`text`, every model's input; `text_pair`: a pair classifier's second text of each"
    )
    datatype: Literal["BYTES"]
    shape: list[Annotated[int, Field(ge=0), INTEGRAL]] = Field(min_length=1, max_length=2, description="[N] or [N, 1]")
    data: list[Any] | None = Field(default=None, description="absent when parameters.binary_data_size is given")
    parameters: dict[str, Any] | None = None


class OipRequestedOutput(StrictModel):
    name: str = Field(min_length=1, description="one of the model's outputs (its metadata lists them)")
    parameters: dict[str, Any] | None = None


def _valid_unicode(value: str) -> str:
    try:
        value.encode("utf-8")
    except UnicodeEncodeError:
        raise ValueError("not valid Unicode (a lone surrogate)") from None
    return value


class OipInferRequest(StrictModel):
    id: Annotated[str, AfterValidator(_valid_unicode)] | None = Field(default=None, max_length=256)  # echoed back
    parameters: dict[str, Any] | None = None
    # `text`; a pair classifier's second input `text_pair`, one text per text of `text`
    inputs: list[OipTensor] = Field(min_length=1, max_length=2)
    outputs: list[OipRequestedOutput] | None = None


class OipOutput(ResponseModel):
    name: str
    datatype: str
    shape: list[int]
    data: list[Any]


class OipInferResponse(ResponseModel):
    model_name: str
    model_version: str
    id: str | None = None
    outputs: list[OipOutput]


class OipTensorMeta(ResponseModel):
    name: str
    datatype: str
    shape: list[int]


class OipModelMetadata(ResponseModel):
    name: str
    versions: list[str]
    platform: str
    inputs: list[OipTensorMeta]
    outputs: list[OipTensorMeta]
