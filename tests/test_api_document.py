"""The API document states the request rules the validators apply: a client generating requests
from it never meets a 422 it did not announce, and never has a request refused that it allows."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import jsonschema
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st
from pydantic import ValidationError

from service.app import create_app
from service.settings import Settings
from service.tasks.classification import PredictRequest
from service.tasks.translation import TranslateRequest


@pytest.fixture(scope="module")
def components(tmp_path_factory: pytest.TempPathFactory) -> dict[str, Any]:
    doc = create_app(Settings(model_store=Path(tmp_path_factory.mktemp("empty")))).openapi()
    return {"components": doc["components"]}


def schema_accepts(components: dict[str, Any], name: str, body: dict[str, Any]) -> bool:
    schema = {"$ref": f"#/components/schemas/{name}", **components}
    return jsonschema.Draft202012Validator(schema).is_valid(body)


def model_accepts(model: Any, body: dict[str, Any]) -> bool:
    try:
        model.model_validate(body)
    except ValidationError:
        return False
    return True


def optional(values: st.SearchStrategy[Any]) -> st.SearchStrategy[Any]:
    return st.one_of(st.just(None), values)


@settings(max_examples=400, deadline=None)
@given(
    decode=optional(st.sampled_from(["beam", "greedy", "sample"])),
    beam_size=optional(st.integers(1, 8)),
    num_hypotheses=optional(st.integers(1, 8)),
    attention=optional(st.booleans()),
    n_texts=st.integers(1, 2),
)
def test_translate_cross_field_rules_agree(
    components: dict[str, Any],
    decode: str | None,
    beam_size: int | None,
    num_hypotheses: int | None,
    attention: bool | None,
    n_texts: int,
) -> None:
    fields = {"decode": decode, "beam_size": beam_size, "num_hypotheses": num_hypotheses, "return_attention": attention}
    body = {"texts": ["Open the file."] * n_texts, **{k: v for k, v in fields.items() if v is not None}}
    assert schema_accepts(components, "TranslateRequest", body) == model_accepts(TranslateRequest, body), body


@pytest.mark.parametrize("attention", [True, False])
@pytest.mark.parametrize("n_texts", [1, 2])
def test_predict_attention_rule_agrees(components: dict[str, Any], attention: bool, n_texts: int) -> None:
    body = {"texts": ["fine"] * n_texts, "return_attention": attention}
    assert schema_accepts(components, "PredictRequest", body) == model_accepts(PredictRequest, body)
