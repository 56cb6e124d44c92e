"""Who may call what, through a real server: model control closed by default, admin, inference and
metrics keys apart, audit lines with key ids and never a key."""

from __future__ import annotations

import json
from pathlib import Path

import httpx
import pytest

from service.http.auth import Auth, KeyRing, Role, key_id, parse_keys
from service.settings import Settings
from tests.helpers import metric, run_server

ADMIN, INFER, METRICS = "adm-7c1d9e0f", "inf-2b8a4c6d", "met-5e3f1a9b"
PREDICT = {"texts": ["The red cat."]}


def bearer(key: str) -> dict[str, str]:
    return {"Authorization": f"Bearer {key}"}


def test_the_key_ring_decides_by_role(tmp_path: Path) -> None:
    keys = KeyRing.of(
        Settings(model_store=tmp_path, api_keys=f"web:{INFER}", admin_keys=ADMIN, metrics_keys=f"prom:{METRICS}")
    )
    assert keys.model_control  # admin keys turn model control on unless told otherwise
    assert [(k.id, k.role) for k in keys.keys] == [
        ("web", Role.INFERENCE),
        (key_id(ADMIN), Role.ADMIN),
        ("prom", Role.METRICS),
    ]
    allowed = {
        (auth, given): keys.check(auth, given)[1] is None
        for auth in (Auth.BEARER, Auth.ADMIN, Auth.METRICS)
        for given in ("", "nope", INFER, ADMIN, METRICS)
    }
    assert {k for k, ok in allowed.items() if ok} == {
        (Auth.BEARER, INFER),
        (Auth.BEARER, ADMIN),
        (Auth.ADMIN, ADMIN),
        (Auth.METRICS, METRICS),
        (Auth.METRICS, ADMIN),
    }
    assert keys.check(Auth.ADMIN, INFER)[1].kind == "forbidden"  # type: ignore[union-attr]
    assert keys.check(Auth.ADMIN, "")[1].kind == "unauthorized"  # type: ignore[union-attr]
    closed = KeyRing.of(Settings(model_store=tmp_path, api_keys=INFER, admin_keys=ADMIN, model_control="none"))
    assert closed.check(Auth.ADMIN, ADMIN)[1].reason == "model_control_off"  # type: ignore[union-attr]
    # inference keys and control on, but no admin key: an inference key never opens it
    no_admin = KeyRing.of(Settings(model_store=tmp_path, api_keys=INFER, model_control="explicit"))
    assert no_admin.check(Auth.ADMIN, INFER)[1].reason == "no_admin_keys"  # type: ignore[union-attr]
    assert parse_keys(" a:b , c ,", Role.ADMIN)[1].id == key_id("c")


@pytest.mark.slow
def test_model_control_is_closed_by_default(tiny_store: Path, tmp_path: Path) -> None:
    with run_server(tiny_store, tmp_path / "server.log") as server, httpx.Client(base_url=server.url) as c:
        for action in ("unload", "load"):
            r = c.post(f"/v2/repository/models/tiny-clf/{action}")
            assert r.status_code == 403 and "SERVE_MODEL_CONTROL=explicit" in r.json()["error"]
        assert c.post("/v2/repository/index").status_code == 200  # the index stays readable
        assert c.post("/predict", json=PREDICT).status_code == 200  # still served
        assert c.get("/metrics").status_code == 200
        refusals = 'inference_auth_refusals_total{reason="model_control_off"}'
        assert metric(c.get("/metrics").text, refusals) == 2


@pytest.mark.slow
def test_admin_inference_and_metrics_keys_apart(tiny_store: Path, tmp_path: Path) -> None:
    log = tmp_path / "server.log"
    keys = {"api_keys": f"web:{INFER}", "admin_keys": f"ops:{ADMIN}", "metrics_keys": METRICS}
    with run_server(tiny_store, log, **keys) as server, httpx.Client(base_url=server.url) as c:
        unload = "/v2/repository/models/tiny-clf/unload"
        assert c.post(unload).status_code == 401
        assert c.post(unload, headers=bearer("wrong")).status_code == 401
        r = c.post(unload, headers=bearer(INFER))
        assert r.status_code == 403 and "admin" in r.json()["error"]
        assert c.post(unload, headers=bearer(METRICS)).status_code == 403
        assert c.post(unload, headers=bearer(ADMIN) | {"X-Request-ID": "audit-1"}).status_code == 200
        assert c.post("/v2/repository/models/tiny-clf/load", headers=bearer(ADMIN)).status_code == 200
        # inference: either an inference or an admin key; a metrics key is of another role
        assert c.post("/predict", json=PREDICT).status_code == 401
        assert c.post("/predict", json=PREDICT, headers=bearer(INFER)).status_code == 200
        assert c.post("/predict", json=PREDICT, headers=bearer(ADMIN)).status_code == 200
        assert c.post("/predict", json=PREDICT, headers=bearer(METRICS)).status_code == 403
        assert c.post("/translate", json={"texts": ["a"]}, headers=bearer(INFER)).status_code == 200
        # probes open; /metrics wants its own key (or an admin one)
        assert c.get("/healthz").status_code == 200 and c.get("/readyz").status_code == 200
        assert c.get("/v2/health/ready").status_code == 200
        assert c.get("/metrics").status_code == 401
        assert c.get("/metrics", headers=bearer(INFER)).status_code == 403
        text = c.get("/metrics", headers=bearer(METRICS)).text
        assert c.get("/metrics", headers=bearer(ADMIN)).status_code == 200
        reasons = ("missing_key", "invalid_key", "role")
        refusals = {r: metric(text, f'inference_auth_refusals_total{{reason="{r}"}}') for r in reasons}
        assert refusals == {"missing_key": 3, "invalid_key": 1, "role": 4}
    lines = [json.loads(line) for line in log.read_text().splitlines() if line.startswith("{")]
    audit = [x for x in lines if x.get("logger") == "service.audit"]
    done = [x for x in audit if x.get("outcome") == "done"]
    assert [(x["action"], x["key_id"]) for x in done] == [("unload", "ops"), ("load", "ops")]
    assert done[0]["request_id"] == "audit-1" and done[0]["client"].startswith("127.0.0.1:")
    assert {x["key_id"] for x in audit if x.get("reason") == "role"} == {"web", key_id(METRICS)}
    text = log.read_text()
    assert not [k for k in (ADMIN, INFER, METRICS, "wrong") if k in text]  # no key is ever logged


@pytest.mark.slow
@pytest.mark.parametrize("given", ["param", "header"])
def test_libretranslate_takes_either_key_and_refuses_as_it_does(tiny_store: Path, tmp_path: Path, given: str) -> None:
    """LibreTranslate's refusals: a wrong key 403, none where one is needed 400; its listing is open."""
    with (
        run_server(tiny_store, tmp_path / "server.log", api_keys=INFER, admin_keys=ADMIN) as server,
        httpx.Client(base_url=server.url) as c,
    ):
        body = {"q": "The red cat.", "source": "en", "target": "de"}

        def translate(key: str) -> httpx.Response:
            if given == "param":
                return c.post("/libretranslate/translate", data=body | {"api_key": key})
            return c.post("/libretranslate/translate", data=body, headers=bearer(key))

        assert c.get("/libretranslate/frontend/settings").json()["keyRequired"] is True
        assert translate(ADMIN).status_code == 200 and translate(INFER).status_code == 200
        r = translate("wrong")
        assert r.status_code == 403 and r.json() == {"error": "Invalid API key"}
        r = c.post("/libretranslate/translate", data=body)
        assert r.status_code == 400 and r.json() == {"error": "Please contact the server operator to get an API key"}
        assert c.get("/libretranslate/languages").status_code == 200
