"""Real third-party clients against a real server process: NVIDIA's tritonclient (JSON and binary
tensor data, with and without a model version), libretranslatepy and deep-translator's
LibreTranslator, with API keys unset and set."""

from __future__ import annotations

import json
import urllib.error
from collections.abc import Iterator
from pathlib import Path

import httpx
import numpy as np
import pytest
import tritonclient.http as triton
from deep_translator import LibreTranslator
from libretranslatepy import LibreTranslateAPI
from tritonclient.utils import InferenceServerException

from bench.engines import newest
from service.engine.classifier import load_classifier
from service.store import scan
from tests.helpers import Server, run_server
from tests.tiny import expected_label, expected_translation

pytestmark = pytest.mark.slow  # real server processes, a few seconds each: left out of `make test-fast`

TEXTS = ["The red cat sees a dog.", "Open the blue window."]  # positive and negative, mapped word by word
KEY = "k-9f2c1e"


@pytest.fixture(scope="module")
def open_server(tiny_store: Path, tmp_path_factory: pytest.TempPathFactory) -> Iterator[Server]:
    with run_server(tiny_store, tmp_path_factory.mktemp("open") / "server.log") as s:
        yield s


@pytest.fixture(scope="module")
def keyed_server(tiny_store: Path, tmp_path_factory: pytest.TempPathFactory) -> Iterator[Server]:
    log = tmp_path_factory.mktemp("keyed") / "server.log"
    with run_server(tiny_store, log, api_keys=f"other-key,{KEY}") as s:
        yield s


@pytest.fixture(scope="module")
def expected(tiny_store: Path) -> dict[str, object]:
    """The known answers (`tests.tiny`), and the classifier engine's probabilities."""
    clf = load_classifier(newest(scan(tiny_store))["tiny-clf"])
    translations = [expected_translation(t) for t in TEXTS]
    assert len(set(translations)) == len(TEXTS)  # a swap between texts shows
    return {
        "labels": [expected_label(t) for t in TEXTS],
        "probs": clf.classify_ids(clf.encode(TEXTS)),
        "translations": translations,
    }


def strings(values: np.ndarray) -> list[str]:
    """BYTES outputs come back as bytes (binary) or str (JSON)."""
    return [v.decode() if isinstance(v, bytes) else str(v) for v in values]


def triton_client(server: Server) -> triton.InferenceServerClient:
    return triton.InferenceServerClient(server.url.removeprefix("http://"))


def text_input(binary: bool) -> triton.InferInput:
    tensor = triton.InferInput("text", [len(TEXTS)], "BYTES")
    tensor.set_data_from_numpy(np.array([t.encode() for t in TEXTS], dtype=np.object_), binary_data=binary)
    return tensor


@pytest.mark.parametrize("binary", [True, False])
@pytest.mark.parametrize("version", ["", "1"])
def test_tritonclient_infers_on_both_models(
    open_server: Server, expected: dict[str, object], binary: bool, version: str
) -> None:
    client = triton_client(open_server)
    assert client.is_server_live() and client.is_server_ready()
    assert client.is_model_ready("tiny-mt", version)
    meta = client.get_model_metadata("tiny-clf", version)
    assert meta["inputs"][0]["name"] == "text"
    outputs = [triton.InferRequestedOutput(name, binary_data=binary) for name in ("label", "probabilities")]
    result = client.infer("tiny-clf", [text_input(binary)], model_version=version, outputs=outputs)
    assert strings(result.as_numpy("label")) == expected["labels"]
    assert np.abs(result.as_numpy("probabilities").reshape(len(TEXTS), -1) - expected["probs"]).max() < 1e-5
    result = client.infer("tiny-mt", [text_input(binary)], model_version=version)  # no outputs named: binary
    assert strings(result.as_numpy("translation")) == expected["translations"]
    out = [triton.InferRequestedOutput("translation", binary_data=binary)]
    result = client.infer(
        "tiny-mt", [text_input(binary)], model_version=version, outputs=out, parameters={"beam_size": 4}
    )
    assert strings(result.as_numpy("translation")) == expected["translations"]


@pytest.mark.parametrize("algorithm", ["gzip", "deflate"])
def test_tritonclient_compresses_its_requests(open_server: Server, expected: dict[str, object], algorithm: str) -> None:
    client = triton_client(open_server)
    result = client.infer("tiny-clf", [text_input(True)], request_compression_algorithm=algorithm)
    assert strings(result.as_numpy("label")) == expected["labels"]


def test_tritonclient_errors(open_server: Server) -> None:
    client = triton_client(open_server)
    with pytest.raises(InferenceServerException, match="no loaded version 7"):
        client.infer("tiny-mt", [text_input(True)], model_version="7")
    with pytest.raises(InferenceServerException, match="beam_size"):
        client.infer("tiny-mt", [text_input(True)], parameters={"beam_size": 99})
    assert client.get_server_metadata()["extensions"] == ["binary_tensor_data", "model_repository"]
    index = {(m["name"], m["version"]): m["state"] for m in client.get_model_repository_index()}
    assert index == {("tiny-clf", "1"): "READY", ("tiny-mt", "1"): "READY"}


def test_libretranslate_clients(open_server: Server, expected: dict[str, object]) -> None:
    base = open_server.url + "/libretranslate/"
    lt = LibreTranslateAPI(base)
    assert lt.translate(TEXTS[0], "en", "de") == expected["translations"][0]  # type: ignore[index]
    assert lt.languages() == [
        {"code": "de", "name": "German", "targets": []},
        {"code": "en", "name": "English", "targets": ["de"]},
    ]
    deep = LibreTranslator(source="en", target="de", api_key="unused", custom_url=base)
    assert deep.translate(TEXTS[1]) == expected["translations"][1]  # type: ignore[index]
    with httpx.Client(base_url=base, timeout=30) as c:
        r = c.post("translate", json={"q": TEXTS, "source": "en", "target": "de", "alternatives": 2})
        assert r.status_code == 200 and r.json()["translatedText"] == expected["translations"]
        rest = httpx.post(
            open_server.url + "/translate", json={"texts": TEXTS, "num_hypotheses": 3, "return_scores": True}
        ).json()["translations"]
        assert r.json()["alternatives"] == [[h["text"] for h in t["hypotheses"][1:]] for t in rest]
        r = c.post(
            "translate",
            json={"q": "<p>The <b>cat</b> sees a dog.</p>", "source": "en", "target": "de", "format": "html"},
        )
        assert r.json()["translatedText"] == "<p>Window <b>save</b> tree close open.</p>"
        for body, status, fragment in (
            ({"source": "en", "target": "de"}, 400, "missing q"),
            ({"q": "x", "source": "fr", "target": "de"}, 400, "fr is not supported"),
            ({"q": "x", "source": "en", "target": "it"}, 400, "it is not supported"),
            ({"q": "x", "source": "en", "target": "de", "format": "pdf"}, 400, "format"),
            *(
                ({"q": "x", "source": "en", "target": "de", "alternatives": n}, 400, "alternatives must be an integer")
                for n in (False, 1.5, "1", None)
            ),
            ({"q": "x", "source": "en", "target": "de", "alternatives": 4}, 400, "between 0 and 3"),
        ):
            r = c.post("translate", json=body)
            assert r.status_code == status and fragment in r.json()["error"], r.text
        r = c.post("translate", data={"q": TEXTS[0], "source": "en", "target": "de", "alternatives": "1"})
        assert r.status_code == 200 and len(r.json()["alternatives"]) == 1, r.text  # a form's number is text
        r = c.post("detect", data={"q": "Hallo"})
        assert r.status_code == 403 and "disabled" in r.json()["error"]
        settings = c.get("frontend/settings").json()
        assert settings["keyRequired"] is False and settings["language"]["source"]["code"] == "en"


def test_keys_are_required_where_they_must_be(keyed_server: Server, expected: dict[str, object]) -> None:
    with httpx.Client(base_url=keyed_server.url, timeout=30) as c:
        for path in ("/predict", "/translate"):
            r = c.post(path, json={"texts": TEXTS})
            assert r.status_code == 401 and r.json()["type"] == "unauthorized"
            r = c.post(path, json={"texts": TEXTS}, headers={"Authorization": "Bearer wrong"})
            assert r.status_code == 401
            assert c.post(path, json={"texts": TEXTS}, headers={"Authorization": f"Bearer {KEY}"}).status_code == 200
        r = c.post("/v2/repository/index")
        assert r.status_code == 401 and set(r.json()) == {"error"}
        for path in ("/healthz", "/readyz", "/metrics", "/v2/health/ready", "/v1/models"):
            assert c.get(path).status_code == 200, path
    assert KEY not in keyed_server.log.read_text()
    client = triton_client(keyed_server)
    with pytest.raises(InferenceServerException, match="API key"):
        client.infer("tiny-mt", [text_input(True)])
    result = client.infer("tiny-mt", [text_input(True)], headers={"Authorization": f"Bearer {KEY}"})
    assert strings(result.as_numpy("translation")) == expected["translations"]
    base = keyed_server.url + "/libretranslate/"
    with pytest.raises(urllib.error.HTTPError) as refused:
        LibreTranslateAPI(base, api_key="wrong").translate(TEXTS[0], "en", "de")
    assert refused.value.code == 403 and json.loads(refused.value.read())["error"] == "Invalid API key"
    assert LibreTranslateAPI(base, api_key=KEY).translate(TEXTS[0], "en", "de") == expected["translations"][0]  # type: ignore[index]
    assert (
        LibreTranslator(source="en", target="de", api_key=KEY, custom_url=base).translate(TEXTS[1])
        == expected["translations"][1]
    )  # type: ignore[index]
    assert httpx.get(base + "frontend/settings").json()["keyRequired"] is True
