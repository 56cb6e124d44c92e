"""Real third-party clients against a real server process: NVIDIA's tritonclient (JSON and binary
tensor data, with and without a model version), libretranslatepy and deep-translator's
LibreTranslator, each with API keys unset and set. (The `openai` client waits for a completions API.)"""

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
from deep_translator.exceptions import AuthorizationException
from libretranslatepy import LibreTranslateAPI
from tritonclient.utils import InferenceServerException

from bench.engines import newest
from service.engine.classifier import load_classifier
from service.http.libretranslate import NO_KEY, undetected
from service.store import scan
from tests.helpers import Server, run_server
from tests.tiny import expected_label, expected_translation

pytestmark = pytest.mark.slow  # real server processes, a few seconds each: left out of `make test-fast`

TEXTS = ["The red cat sees a dog.", "Open the blue window."]  # positive and negative, mapped word by word
KEY = "k-9f2c1e"
FORM = "application/x-www-form-urlencoded"


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


def mode(request: pytest.FixtureRequest, keyed: bool) -> tuple[Server, str | None]:
    """The server of a mode and the key its clients give (None: the server has no keys)."""
    return (request.getfixturevalue("keyed_server"), KEY) if keyed else (request.getfixturevalue("open_server"), None)


@pytest.mark.parametrize("keyed", [False, True], ids=["open", "keyed"])
@pytest.mark.parametrize("binary", [True, False])
@pytest.mark.parametrize("version", ["", "1"])
def test_tritonclient_infers_on_both_models(
    request: pytest.FixtureRequest, expected: dict[str, object], binary: bool, version: str, keyed: bool
) -> None:
    server, key = mode(request, keyed)
    client = triton_client(server)
    auth = {"Authorization": f"Bearer {key}"} if key else None
    assert client.is_server_live() and client.is_server_ready()
    assert client.is_model_ready("tiny-mt", version)
    meta = client.get_model_metadata("tiny-clf", version)
    assert meta["inputs"][0]["name"] == "text"
    outputs = [triton.InferRequestedOutput(name, binary_data=binary) for name in ("label", "probabilities")]
    result = client.infer("tiny-clf", [text_input(binary)], model_version=version, outputs=outputs, headers=auth)
    assert strings(result.as_numpy("label")) == expected["labels"]
    assert np.abs(result.as_numpy("probabilities").reshape(len(TEXTS), -1) - expected["probs"]).max() < 1e-5
    result = client.infer("tiny-mt", [text_input(binary)], model_version=version, headers=auth)  # binary answer
    assert strings(result.as_numpy("translation")) == expected["translations"]
    out = [triton.InferRequestedOutput("translation", binary_data=binary)]
    result = client.infer(
        "tiny-mt", [text_input(binary)], model_version=version, outputs=out, parameters={"beam_size": 4}, headers=auth
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


@pytest.mark.parametrize("keyed", [False, True], ids=["open", "keyed"])
def test_libretranslate_clients(request: pytest.FixtureRequest, expected: dict[str, object], keyed: bool) -> None:
    """libretranslatepy's three calls and deep-translator's translator, each with its key when the
    server has keys: as against LibreTranslate, the languages are listed whatever the key."""
    server, key = mode(request, keyed)
    translations: list[str] = expected["translations"]  # type: ignore[assignment]
    base = server.url + "/libretranslate/"
    for lt in (LibreTranslateAPI(base, api_key=key), LibreTranslateAPI(base)):  # its GET's form body is never read
        assert lt.languages() == [
            {"code": "de", "name": "German", "targets": []},
            {"code": "en", "name": "English", "targets": ["de"]},
        ]
    lt = LibreTranslateAPI(base, api_key=key)
    assert lt.translate(TEXTS[0], "en", "de") == translations[0]
    assert lt.translate(TEXTS[1], "auto", "de") == translations[1]
    assert lt.detect(TEXTS[0]) == [{"confidence": 0.0, "language": "en"}]  # LibreTranslate's "could not detect"
    for source in ("en", "auto"):
        deep = LibreTranslator(source=source, target="de", api_key=key or "unused", custom_url=base)
        assert deep.translate(TEXTS[1]) == translations[1]
        assert deep.translate_batch(TEXTS) == translations
    with httpx.Client(base_url=base, timeout=30) as c:
        settings = c.get("frontend/settings").json()
        assert settings["keyRequired"] is settings["apiKeys"] is keyed and settings["suggestions"] is False
        assert settings["language"]["source"]["code"] == "en" and ".po" in settings["supportedFilesFormat"]
        assert c.get("health").json() == {"status": "ok"}
        r = c.post("suggest", data={"q": "a", "s": "b", "source": "en", "target": "de"})
        assert r.status_code == 403 and r.json() == {"error": "Suggestions are disabled on this server."}
        if keyed:
            r = c.post("translate", data={"q": TEXTS[0], "source": "en", "target": "de"})
            assert r.status_code == 400 and r.json() == {"error": NO_KEY}  # LibreTranslate's words
            for path in ("translate", "detect"):
                r = c.post(path, data={"q": TEXTS[0], "source": "en", "target": "de", "api_key": "wrong"})
                assert r.status_code == 403 and r.json() == {"error": "Invalid API key"}, path
    if keyed:
        with pytest.raises(urllib.error.HTTPError) as refused:
            LibreTranslateAPI(base, api_key="wrong").translate(TEXTS[0], "en", "de")
        assert refused.value.code == 403 and json.loads(refused.value.read())["error"] == "Invalid API key"
        with pytest.raises(AuthorizationException):
            LibreTranslator(source="en", target="de", api_key="wrong", custom_url=base).translate(TEXTS[0])


def test_libretranslate_answers_as_libretranslate(open_server: Server, expected: dict[str, object]) -> None:
    """The shapes and refusals of LibreTranslate's `app.py` (docs/protocols.md has the table)."""
    translations: list[str] = expected["translations"]  # type: ignore[assignment]
    with httpx.Client(base_url=open_server.url + "/libretranslate/", timeout=30) as c:
        r = c.post("translate", json={"q": TEXTS, "source": "en", "target": "de", "alternatives": 2})
        assert r.status_code == 200 and r.json()["translatedText"] == translations
        assert "detectedLanguage" not in r.json()  # only for source: auto
        rest = httpx.post(
            open_server.url + "/translate", json={"texts": TEXTS, "num_hypotheses": 3, "return_scores": True}
        ).json()["translations"]
        assert r.json()["alternatives"] == [[h["text"] for h in t["hypotheses"][1:]] for t in rest]
        r = c.post("translate", json={"q": TEXTS[0], "source": "auto", "target": "de"})
        undetected = {"confidence": 0.0, "language": "en"}  # chosen (en is the one source), not detected
        assert r.json() == {"translatedText": translations[0], "detectedLanguage": undetected}
        r = c.post("translate", json={"q": TEXTS, "source": "auto", "target": "de"})
        assert r.json()["detectedLanguage"] == [undetected] * 2
        r = c.post("translate", json={"q": TEXTS[0], "source": "en", "target": "de", "alternatives": -1})
        assert r.json() == {"translatedText": translations[0]}  # a negative number is 0, as LibreTranslate reads it
        r = c.post(
            "translate",
            json={"q": "<p>The <b>cat</b> sees a dog.</p>", "source": "en", "target": "de", "format": "html"},
        )
        assert r.json()["translatedText"] == "<p>Window <b>save</b> tree close open.</p>"
        for body, fragment in (
            ({"source": "en", "target": "de"}, "Invalid request: missing q parameter"),
            ({"q": "", "source": "en", "target": "de"}, "Invalid request: missing q parameter"),
            ({"q": "x", "target": "de"}, "Invalid request: missing source parameter"),
            ({"q": "x", "source": "en"}, "Invalid request: missing target parameter"),
            ({"q": "x", "source": "fr", "target": "de"}, "fr is not supported"),
            ({"q": "x", "source": "en", "target": "it"}, "it is not supported"),
            ({"q": "x", "source": "de", "target": "en"}, "de is not supported"),  # read by no translator
            ({"q": "x", "source": "en", "target": "de", "format": "pdf"}, "format"),
            *(
                (
                    {"q": "x", "source": "en", "target": "de", "alternatives": n},
                    "alternatives parameter is not a number",
                )
                for n in (False, 1.5, "1", None)
            ),
            ({"q": "x", "source": "en", "target": "de", "alternatives": 4}, "alternatives parameter must be <= 3"),
        ):
            r = c.post("translate", json=body)
            assert r.status_code == 400 and fragment in r.json()["error"], r.text
        r = c.post("translate", data={"q": TEXTS[0], "source": "en", "target": "de", "alternatives": "1"})
        assert r.status_code == 200 and len(r.json()["alternatives"]) == 1, r.text  # a form's number is text
        r = c.post("translate", content=b"q=a&q=&source=en&target=de", headers={"content-type": FORM})
        assert r.status_code == 400 and "missing q" in r.json()["error"]  # an empty form field is a missing one
        r = c.post("detect", json={})
        assert r.status_code == 400 and r.json() == {"error": "Invalid request: missing q parameter"}
        assert c.post("languages").status_code == 405  # GET only, as LibreTranslate's
        files = {"file": ("a.po", b'msgid "a"\nmsgstr ""\n')}
        for fields, fragment in (({"target": "de"}, "missing source"), ({"source": "en"}, "missing target")):
            r = c.post("translate_file", files=files, data=fields)
            assert r.status_code == 400 and fragment in r.json()["error"], r.text


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


def test_undetected_names_the_one_source_else_english() -> None:
    assert undetected({"en": {"de"}, "de": set()}) == {"confidence": 0.0, "language": "en"}
    assert undetected({"fr": {"de"}, "de": set()})["language"] == "fr"
    assert undetected({"fr": {"de"}, "es": {"de"}, "en": {"de"}})["language"] == "en"
    assert undetected({"fr": {"de"}, "es": {"de"}})["language"] == "es"
    assert undetected({})["language"] == "en"  # nothing served (every translator unloaded): no 500
