"""Random JSON and odd strings at /predict, /translate and OIP infer: never a 5xx, always the error shape."""

from __future__ import annotations

import json
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
from fastapi.testclient import TestClient
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from service.app import create_app
from service.settings import Settings

pytestmark = pytest.mark.fuzz  # fuzzing: left out of `make test-fast`

ENDPOINTS = ["/predict", "/translate", "/v2/models/tiny-clf/infer", "/v2/models/tiny-mt/infer"]
ODD = ["", " ", "\x00", "\u202e\u200f", "🙂" * 3, "\ud800", "\udfff x", "a\r\nb", "\ufeff", "ß" * 50, "𝔘𝔫𝔦"]

json_values = st.recursive(
    st.none()
    | st.booleans()
    | st.integers(-(2**70), 2**70)
    | st.floats(allow_nan=False, allow_infinity=False)
    | st.sampled_from(ODD)
    | st.text(max_size=20),
    lambda inner: st.lists(inner, max_size=4) | st.dictionaries(st.text(max_size=8), inner, max_size=4),
    max_leaves=12,
)
field_values = st.one_of(
    json_values,
    st.integers(-3, 300),
    st.floats(-1, 3, allow_nan=False),
    st.sampled_from(["beam", "greedy", "tiny-clf", "tiny-mt", "nope"]),
)
texts = st.lists(st.sampled_from(ODD) | st.text(max_size=30), min_size=0, max_size=5)
fields = [
    "texts",
    "model",
    "decode",
    "beam_size",
    "max_new_tokens",
    "length_penalty",
    "num_hypotheses",
    "return_scores",
]
requests = st.one_of(
    json_values,
    st.fixed_dictionaries({"texts": texts}, optional={f: field_values for f in fields[1:]}),
    st.builds(
        lambda data, shape, params: {
            "inputs": [{"name": "text", "datatype": "BYTES", "shape": shape, "data": data}],
            "parameters": params,
        },
        texts,
        st.lists(st.integers(-1, 6), max_size=3),
        st.dictionaries(st.sampled_from(fields[2:]), field_values, max_size=3),
    ),
)


@pytest.fixture(scope="module")
def client(tiny_store: Path) -> Iterator[TestClient]:
    app = create_app(Settings(model_store=tiny_store, threads=1, max_wait_ms=0, model_thread_priority="nice"))
    with TestClient(app, raise_server_exceptions=False) as c:
        end = time.monotonic() + 120  # generous: a busy machine is slow, not wrong
        while c.get("/readyz").status_code != 200:
            assert time.monotonic() < end
            time.sleep(0.02)
        yield c


def check(client: TestClient, path: str, body: bytes) -> None:
    r = client.post(path, content=body, headers={"content-type": "application/json"})
    assert r.status_code < 500, (path, body[:300], r.text)
    if r.status_code >= 400:
        payload = r.json()
        assert isinstance(payload["error"], str) and payload["error"]
        assert ("type" in payload) != path.startswith("/v2"), payload


@settings(max_examples=150, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(path=st.sampled_from(ENDPOINTS), body=requests)
def test_random_json_never_gets_a_5xx(client: TestClient, path: str, body: Any) -> None:
    check(client, path, json.dumps(body).encode())


@settings(max_examples=60, deadline=None)
@given(path=st.sampled_from(ENDPOINTS), raw=st.binary(max_size=60) | st.sampled_from([b"NaN", b"[]", b'"x"', b"1e999"]))
def test_random_bytes_never_get_a_5xx(client: TestClient, path: str, raw: bytes) -> None:
    check(client, path, raw)


def test_escaped_surrogates_and_non_finite_numbers(client: TestClient) -> None:
    for body in (
        b'{"texts": ["\\ud800"]}',
        b'{"texts": ["ok"], "model": "\\udfff"}',
        b'{"texts": ["a"], "length_penalty": -Infinity}',
        b'{"texts": ["a"], "beam_size": 1e999}',
        b'{"inputs": [{"name": "text", "datatype": "BYTES", "shape": [1], "data": ["\\ud83d"]}]}',
        b'{"id": "\\ud800", "inputs": [{"name": "text", "datatype": "BYTES", "shape": [1], "data": ["a"]}]}',
        b'{"inputs": [{"name": "\\ud800", "datatype": "BYTES", "shape": [1], "data": ["a"]}]}',
    ):
        for path in ENDPOINTS:
            check(client, path, body)
