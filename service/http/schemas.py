"""Request and response bodies with their bounds: the service's edge, where input is validated.

Requests are strict (no type coercion, no unknown fields, no NaN/Infinity). Limits that depend
on settings (texts per request, characters per text) are checked by `check_texts`; limits that
depend on the model (source tokens, max_new_tokens) by the model layer.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Annotated, Any, Literal

from pydantic import AfterValidator, BaseModel, ConfigDict, Field, model_validator

from service.decoding import MAX_BEAM_SIZE, DecodeParams
from service.errors import InputTooLong, InvalidInput, PayloadTooLarge

MAX_NEW_TOKENS = 256  # the request bound; each model's own limit (manifest) may be lower

ModelName = Annotated[str, Field(min_length=1, max_length=128, pattern=r"^[a-z0-9][a-z0-9._-]*$")]


class Request(BaseModel):
    model_config = ConfigDict(strict=True, extra="forbid", allow_inf_nan=False)


class Response(BaseModel):
    model_config = ConfigDict(extra="forbid")


class DecodeOptions(Request):
    decode: Literal["beam", "greedy"] = Field(default="beam", description="greedy is beam_size 1")
    beam_size: int = Field(default=4, ge=1, le=MAX_BEAM_SIZE)
    max_new_tokens: int | None = Field(
        default=None, ge=1, le=MAX_NEW_TOKENS, description="generated tokens incl. EOS; default: the model's limit"
    )
    length_penalty: float = Field(default=1.0, ge=0.0, le=2.0)
    num_hypotheses: int = Field(default=1, ge=1, le=MAX_BEAM_SIZE, description="1..beam_size, returned best first")

    @model_validator(mode="after")
    def _consistent(self) -> DecodeOptions:
        if self.decode == "greedy":
            if "beam_size" in self.model_fields_set and self.beam_size != 1:
                raise ValueError(f"decode 'greedy' means beam_size 1, got beam_size {self.beam_size}")
            self.beam_size = 1
        if self.num_hypotheses > self.beam_size:
            raise ValueError(f"num_hypotheses must be between 1 and beam_size ({self.beam_size})")
        return self

    def params(self, model_limit: int) -> DecodeParams:
        """Decode parameters for a model whose manifest allows `model_limit` new tokens."""
        wanted = self.max_new_tokens if self.max_new_tokens is not None else model_limit
        if wanted > model_limit:
            raise InvalidInput(f"max_new_tokens must be between 1 and {model_limit} for this model, got {wanted}")
        return DecodeParams(self.beam_size, wanted, self.length_penalty, self.num_hypotheses)


class PredictRequest(Request):
    texts: list[str] = Field(min_length=1, description="texts to classify")
    model: ModelName | None = Field(default=None, description="model name; default: the only (or default) classifier")


class TranslateRequest(DecodeOptions):
    texts: list[str] = Field(min_length=1, description="texts to translate")
    model: ModelName | None = Field(default=None, description="model name; default: the only (or default) translator")
    return_scores: bool = False


def check_texts(texts: Sequence[str], max_texts: int, max_chars: int, field: str = "texts") -> None:
    """Request-size limits from the settings, and text the tokenizer cannot take (lone surrogates)."""
    if len(texts) > max_texts:
        raise PayloadTooLarge(f"{field} has {len(texts)} items; at most {max_texts} per request")
    for i, text in enumerate(texts):
        if len(text) > max_chars:
            raise InputTooLong(f"{field}[{i}] has {len(text)} characters; at most {max_chars} per text")
        try:
            text.encode("utf-8")
        except UnicodeEncodeError as exc:
            raise InvalidInput(
                f"{field}[{i}] is not valid Unicode (a lone surrogate at position {exc.start})"
            ) from None


# -- responses ---------------------------------------------------------------------------------


class Prediction(Response):
    label: str
    score: float
    scores: dict[str, float]


class PredictResponse(Response):
    model: str
    version: int
    predictions: list[Prediction]


class Hypothesis(Response):
    text: str
    score: float


class Translation(Response):
    text: str
    score: float | None = None
    hypotheses: list[Hypothesis] | None = None


class TranslateResponse(Response):
    model: str
    version: int
    translations: list[Translation]


class ModelInfo(Response):
    name: str
    version: int
    task: str | None
    status: Literal["loading", "ready", "failed"]
    variant: str | None = None
    labels: list[str] | None = None
    max_source_tokens: int | None = None
    max_new_tokens: int | None = None
    error: str | None = None


class ModelsResponse(Response):
    models: list[ModelInfo]


class ErrorResponse(Response):
    error: str
    type: str


# -- Open Inference Protocol v2 (KServe) ---------------------------------------------------------


class OipTensor(Request):
    name: str = Field(min_length=1, max_length=64)
    datatype: str
    shape: list[Annotated[int, Field(ge=0)]] = Field(max_length=4)
    data: list[Any]
    parameters: dict[str, Any] | None = None


class OipRequestedOutput(Request):
    name: str
    parameters: dict[str, Any] | None = None


def _valid_unicode(value: str) -> str:
    try:
        value.encode("utf-8")
    except UnicodeEncodeError:
        raise ValueError("not valid Unicode (a lone surrogate)") from None
    return value


class OipInferRequest(Request):
    id: Annotated[str, AfterValidator(_valid_unicode)] | None = Field(default=None, max_length=256)  # echoed back
    parameters: dict[str, Any] | None = None
    inputs: list[OipTensor] = Field(min_length=1, max_length=1)
    outputs: list[OipRequestedOutput] | None = None


class OipOutput(Response):
    name: str
    datatype: str
    shape: list[int]
    data: list[Any]


class OipInferResponse(Response):
    model_name: str
    model_version: str
    id: str | None = None
    outputs: list[OipOutput]


class OipTensorMeta(Response):
    name: str
    datatype: str
    shape: list[int]


class OipModelMetadata(Response):
    name: str
    versions: list[str]
    platform: str
    inputs: list[OipTensorMeta]
    outputs: list[OipTensorMeta]


def field_rules(*models: type[BaseModel]) -> dict[str, str]:
    """Allowed values of each request field, from the JSON schema, for validation messages."""
    rules: dict[str, str] = {}
    for model in models:
        for name, prop in model.model_json_schema().get("properties", {}).items():
            rule = _rule(prop)
            if rule:
                rules.setdefault(name, rule)
    return rules


def _rule(prop: dict[str, Any]) -> str:
    if "anyOf" in prop:
        parts = [_rule(p) for p in prop["anyOf"] if p.get("type") != "null"]
        return " or ".join(p for p in parts if p)
    kind = prop.get("type")
    if "enum" in prop or "const" in prop:
        values = prop.get("enum", [prop.get("const")])
        return "one of " + ", ".join(repr(v) for v in values)
    if kind in ("integer", "number"):
        noun = "an integer" if kind == "integer" else "a number"
        lo, hi = prop.get("minimum"), prop.get("maximum")
        if lo is not None and hi is not None:
            return f"{noun} from {lo} to {hi}"
        return noun + (f" >= {lo}" if lo is not None else "") + (f" <= {hi}" if hi is not None else "")
    if kind == "array":
        return "a list" + (f" of at least {prop['minItems']} item(s)" if "minItems" in prop else "")
    if kind == "string":
        return "a string" + (f" matching {prop['pattern']}" if "pattern" in prop else "")
    if kind == "boolean":
        return "true or false"
    return ""
