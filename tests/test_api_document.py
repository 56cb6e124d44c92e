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
from service.http.libretranslate import translate_body
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


def test_text_limits_are_in_the_document_with_their_status(tmp_path: Path) -> None:
    doc = create_app(Settings(model_store=tmp_path, max_texts=3, max_text_chars=10)).openapi()
    schemas = doc["components"]["schemas"]
    assert schemas["PredictRequest"]["properties"]["pairs"]["maxItems"] == 3  # a pair counts as one text
    for texts in (schemas["PredictRequest"]["properties"]["texts"], schemas["OipTensor"]["properties"]["data"]):
        assert texts["maxItems"] == 3 and texts["items"]["maxLength"] == 10
        # the document's limits are a 422, as any field out of range; the model's tokens a 413
        assert "10 characters: 422" in texts["description"] and "tokens: 413" in texts["description"]


def test_libretranslate_languages_say_which_pairs_are_served() -> None:
    """Several translators: each source with the targets it takes, `auto` for a target only one
    source translates into; the schema accepts exactly the pairs the handler serves."""
    pairs = [("en", "de"), ("en", "fr"), ("de", "en"), ("fr", "en"), ("es", "en")]
    body = translate_body(pairs, 4, 100)
    assert body["properties"]["source"]["enum"] == ["auto", "de", "en", "es", "fr"]
    assert body["properties"]["target"]["enum"] == ["de", "en", "fr"]
    validator = jsonschema.Draft202012Validator(body)
    served = set(pairs) | {("auto", "de"), ("auto", "fr")}  # en is read from three sources: no auto
    for source in ("auto", "de", "en", "es", "fr"):
        for target in ("de", "en", "fr"):
            ok = validator.is_valid({"q": "x", "source": source, "target": target})
            assert ok == ((source, target) in served), (source, target)
    assert not validator.is_valid({"q": ["x"] * 5, "source": "en", "target": "de"})
    assert not validator.is_valid({"q": "x" * 101, "source": "en", "target": "de"})
    assert translate_body([], 4, 100)["properties"]["source"].get("enum") is None  # nothing served


def test_a_streaming_route_states_its_event_stream(tmp_path: Path) -> None:
    paths = create_app(Settings(model_store=tmp_path)).openapi()["paths"]
    answers = paths["/translate"]["post"]["responses"]["200"]["content"]
    assert set(answers) == {"application/json", "text/event-stream"}
    event = answers["text/event-stream"]["schema"]  # one event, as schemathesis validates each
    assert event["required"] == ["data"] and event["properties"]["data"]["type"] == "string"
    assert "[DONE]" in event["properties"]["data"]["description"]
    assert "text/event-stream" not in paths["/predict"]["post"]["responses"]["200"]["content"]
    files = paths["/translate_file"]["post"]["responses"]["200"]["content"]
    assert '"done"' in files["text/event-stream"]["schema"]["properties"]["data"]["description"]


@pytest.mark.parametrize("extra", [{"num_hypotheses": 2}, {"return_attention": True}, {"beam_size": 4}])
def test_the_document_refuses_what_a_stream_cannot_carry(components: dict[str, Any], extra: dict[str, Any]) -> None:
    """What the server answers 400 with stream (the codec's rule, not the validator's) the schema refuses too."""
    body = {"texts": ["Open the file."], "stream": True, **extra}
    assert schema_accepts(components, "TranslateRequest", body) == ("beam_size" in extra)
    assert schema_accepts(components, "TranslateRequest", body | {"stream": False})
