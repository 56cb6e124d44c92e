"""Per-client limits: the buckets and the limits file on a fake clock, who a client is, and a real
server where one key over its limit gets 429 in each protocol's shape while another key is served."""

from __future__ import annotations

import json
import logging
import os
import time
from pathlib import Path

import httpx
import pytest

from service.app import create_app
from service.errors import InputTooLong, RateLimited
from service.http.auth import KEY_ID, key_id
from service.http.limits import Bucket, Buckets, ClientLimits, Limits, PolicySource, client_of, retry_after, take
from service.http.table import Access, Protocol
from service.settings import Settings
from tests.helpers import run_server


class Clock:
    def __init__(self) -> None:
        self.now = 1000.0

    def __call__(self) -> float:
        return self.now


def scope(address: str = "10.0.0.1", key: str | None = None, **headers: str) -> dict[str, object]:
    out: dict[str, object] = {
        "type": "http",
        "client": (address, 5555),
        "headers": [(k.replace("_", "-").encode(), v.encode()) for k, v in headers.items()],
    }
    if key is not None:
        out[KEY_ID] = key
    return out


# -- the bucket -----------------------------------------------------------------------------------


def test_bucket_refills_at_the_figure_per_minute_and_says_when_a_request_fits() -> None:
    b = Bucket(60.0, 0.0)  # 60 a minute: one a second
    assert all(take(b, 60, 1, 0.0) == 0.0 for _ in range(60))
    assert take(b, 60, 1, 0.0) == pytest.approx(1.0)
    assert take(b, 60, 1, 0.25) == pytest.approx(0.75)  # a refusal takes nothing
    assert take(b, 60, 1, 1.0) == 0.0
    assert take(b, 60, 1, 1.0) == pytest.approx(1.0)
    assert take(b, 60, 30, 31.0) == 0.0  # 30 s refilled 30
    assert take(b, 60, 60, 1000.0) == 0.0  # never more than the capacity
    assert take(b, 60, 1, 1000.0) == pytest.approx(1.0)


def test_retry_after_is_whole_seconds_rounded_up_at_least_one() -> None:
    assert [retry_after(s) for s in (0.001, 0.999, 1.0, 1.01, 11.5)] == [1, 1, 1, 2, 12]


def limiter(base: Limits, path: Path | None = None) -> tuple[ClientLimits, Clock, list[str]]:
    clock, refused = Clock(), []
    return ClientLimits(PolicySource(base, path, clock), refused=refused.append), clock, refused


def test_requests_over_the_limit_are_refused_per_client_with_retry_after() -> None:
    limits, clock, refused = limiter(Limits(requests_per_minute=6))  # one each 10 s
    for _ in range(6):
        limits.request(scope("10.0.0.1"))
    with pytest.raises(RateLimited) as err:
        limits.request(scope("10.0.0.1"))
    assert err.value.retry_after == 10 and err.value.limit == "requests" and err.value.kind == "rate_limited"
    assert "6 a minute" in str(err.value)
    limits.request(scope("10.0.0.2"))  # another client: its own bucket
    limits.request(scope("10.0.0.1", key="key-1a2b3c4d"))  # a key is its own client, wherever from
    clock.now += 4
    with pytest.raises(RateLimited) as err:
        limits.request(scope("10.0.0.1"))
    assert err.value.retry_after == 6
    clock.now += 6
    limits.request(scope("10.0.0.1"))
    assert refused == ["requests", "requests"]


def test_characters_per_minute_and_per_request() -> None:
    limits, clock, refused = limiter(Limits(chars_per_minute=600, max_request_chars=500))  # 10 a second
    limits.texts(scope(), ["a" * 300, "b" * 200])  # 500: the whole request counts
    with pytest.raises(InputTooLong, match="501 characters of text; at most 500 per request"):
        limits.texts(scope(), ["a" * 501])
    with pytest.raises(RateLimited) as err:
        limits.texts(scope(), ["a" * 125])  # 100 left: 25 more take 2.5 s
    assert err.value.retry_after == 3 and err.value.limit == "chars"
    clock.now += 2.5
    limits.texts(scope(), ["a" * 125])
    limits.texts(scope(), [""])  # no text, no charge
    assert refused == ["request_chars", "chars"]
    big, _, refused = limiter(Limits(chars_per_minute=100))
    with pytest.raises(InputTooLong, match="at most 100 a minute"):  # would never fit: no point retrying
        big.texts(scope(), ["a" * 101])
    assert refused == ["request_chars"]


def test_no_limits_set_checks_nothing() -> None:
    limits, _, _ = limiter(Limits())
    assert not limits.active
    for _ in range(1000):
        limits.request(scope())
        limits.texts(scope(), ["a" * 10_000])
    assert len(limits.buckets) == 0


def test_idle_clients_are_dropped_so_sprayed_addresses_cannot_grow_memory() -> None:
    clock = Clock()
    buckets = Buckets(clock)
    for i in range(5000):
        buckets.take(f"addr:10.{i // 256}.{i % 256}.1", "requests", 5, 1)
    assert len(buckets) == 5000
    clock.now += 59
    buckets.take("addr:kept", "requests", 5, 1)
    assert len(buckets) == 5001  # not idle for a minute yet
    clock.now += 1
    buckets.take("addr:other", "requests", 5, 1)
    assert len(buckets) == 2  # a minute idle: refilled, the same as no bucket
    capped = Buckets(clock, max_buckets=100)
    for i in range(1000):
        capped.take(f"addr:{i}", "requests", 5, 1)
    assert len(capped) == 100


def test_a_dropped_bucket_is_a_full_one() -> None:
    """Dropping after a minute idle changes no answer: the bucket had refilled anyway."""
    limits, clock, _ = limiter(Limits(requests_per_minute=3))
    for _ in range(3):
        limits.request(scope())
    clock.now += 60
    limits.request(scope("10.9.9.9"))  # drops the idle one
    assert len(limits.buckets) == 1
    for _ in range(3):
        limits.request(scope())
    with pytest.raises(RateLimited):
        limits.request(scope())


# -- the limits file ------------------------------------------------------------------------------


def write(path: Path, content: object, mtime: int) -> None:
    path.write_text(content if isinstance(content, str) else json.dumps(content))
    os.utime(path, ns=(mtime * 10**9, mtime * 10**9))


def test_limits_file_sets_figures_per_key_id_and_a_default(tmp_path: Path) -> None:
    path = tmp_path / "limits.json"
    write(
        path,
        {
            "keys": {"frontend": {"requests_per_minute": 600, "max_request_chars": 5000}, "batch": {}},
            "default": {"requests_per_minute": 10},
        },
        1,
    )
    source = PolicySource(Limits(requests_per_minute=2, chars_per_minute=1000), path, Clock())
    policy = source.current()
    assert policy.of("key:frontend") == Limits(600, 1000, 5000)  # unnamed figures: the default's, then the settings'
    assert policy.of("key:batch") == Limits(10, 1000, 0)
    assert policy.of("key:key-00000000") == policy.of("addr:10.0.0.1") == Limits(10, 1000, 0)


def test_limits_file_is_reread_on_change_and_a_broken_one_keeps_the_last_good(
    tmp_path: Path, caplog: pytest.LogCaptureFixture
) -> None:
    path = tmp_path / "limits.json"
    write(path, {"keys": {"frontend": {"requests_per_minute": 600}}}, 1)
    clock = Clock()
    source = PolicySource(Limits(requests_per_minute=5), path, clock)
    assert source.current().of("key:frontend").requests_per_minute == 600
    write(path, {"keys": {"frontend": {"requests_per_minute": 60}}}, 2)
    assert source.current().of("key:frontend").requests_per_minute == 600  # looked at most once a second
    clock.now += 1
    assert source.current().of("key:frontend").requests_per_minute == 60
    caplog.set_level(logging.ERROR, "service.http.limits")
    for i, broken in enumerate(['{"keys": ', {"keys": {"frontend": {"requests_per_minute": -1}}}, [1]]):
        write(path, broken, 3 + i)
        for _ in range(3):
            clock.now += 1
            assert source.current().of("key:frontend").requests_per_minute == 60
    assert len(caplog.records) == 3  # one error per change, not per look
    path.unlink()
    clock.now += 1
    assert source.current().of("key:frontend").requests_per_minute == 60
    write(path, {"default": {"requests_per_minute": 7}}, 9)
    clock.now += 1
    assert source.current().of("key:frontend").requests_per_minute == 7


def test_a_broken_limits_file_stops_the_start(tmp_path: Path) -> None:
    path = tmp_path / "limits.json"
    write(path, {"keys": {"frontend": {"requests_per_minut": 5}}}, 1)
    with pytest.raises(ValueError, match="requests_per_minut"):
        PolicySource(Limits(), path)


def test_a_key_override_applies_through_the_limiter(tmp_path: Path) -> None:
    path = tmp_path / "limits.json"
    write(path, {"keys": {"frontend": {"requests_per_minute": 100}}}, 1)
    limits, _, _ = limiter(Limits(requests_per_minute=1), path)
    for _ in range(100):
        limits.request(scope(key="frontend"))
    limits.request(scope("10.0.0.1"))
    with pytest.raises(RateLimited):
        limits.request(scope("10.0.0.1"))
    with pytest.raises(RateLimited):
        limits.request(scope(key="frontend"))


# -- who the client is ----------------------------------------------------------------------------


def test_client_is_the_key_id_else_the_address() -> None:
    assert client_of(scope("10.0.0.1", key="frontend"), None) == "key:frontend"
    assert client_of(scope("10.0.0.1"), None) == "addr:10.0.0.1"
    assert client_of({"type": "http", "headers": []}, None) == "addr:unknown"
    spoofed = scope("10.0.0.1", x_forwarded_for="6.6.6.6")
    assert client_of(spoofed, None) == "addr:10.0.0.1"  # no trusted proxy: the header means nothing
    proxied = scope("10.0.0.1", x_forwarded_for="6.6.6.6, 192.0.2.7")
    assert client_of(proxied, "X-Forwarded-For") == "addr:192.0.2.7"  # the entry the nearest proxy added
    assert client_of(scope("10.0.0.1"), "x-forwarded-for") == "addr:10.0.0.1"  # no header: the connection
    twice = scope("10.0.0.1")
    twice["headers"] = [(b"x-forwarded-for", b"6.6.6.6"), (b"x-forwarded-for", b"1.1.1.1, 192.0.2.8")]
    assert client_of(twice, "x-forwarded-for") == "addr:192.0.2.8"


def test_key_id_names_a_key_without_holding_it() -> None:
    assert key_id("k1") == key_id("k1") != key_id("k2")
    assert key_id("k1").startswith("key-") and len(key_id("k1")) == 12 and "k1" not in key_id("k1")[4:]


def test_settings_leave_every_limit_off() -> None:
    s = Settings()
    assert (s.client_requests_per_minute, s.client_chars_per_minute, s.max_request_chars) == (0, 0, 0)
    assert s.limits_file is None and s.trusted_proxy_header is None
    with pytest.raises(ValueError):
        Settings(trusted_proxy_header="x-forwarded-for, x-real-ip")


def test_limits_apply_to_the_inference_routes_only(tiny_store: Path) -> None:
    table = create_app(Settings(model_store=tiny_store)).table
    limited = sorted(r.name for r in table.routes if r.inference)
    assert limited == [
        "classification",
        "completions",
        "infer",
        "libretranslate_translate",
        "libretranslate_translate_file",
        "rerank",
        "text2text",
        "translate_file",
        "translation",
        "version_infer",
        "zero_shot_classification",
    ]
    for r in table.routes:
        if r.inference:  # 413 is LibreTranslate's 400
            assert {413 if r.protocol is not Protocol.LIBRETRANSLATE else 400, 429} <= set(
                r.statuses("POST", Access(inference=True))
            )


# -- a real server --------------------------------------------------------------------------------

KEY_1, KEY_2 = "k1-s3cr3t-one", "k2-s3cr3t-two"


@pytest.mark.slow
def test_a_key_over_its_limit_gets_429_while_another_is_served(tiny_store: Path, tmp_path: Path) -> None:
    limits_file = tmp_path / "limits.json"
    limits_file.write_text(json.dumps({"keys": {key_id(KEY_2): {"requests_per_minute": 20}}}))
    log = tmp_path / "server.log"
    settings = {"api_keys": f"{KEY_1},{KEY_2}", "client_requests_per_minute": "5", "limits_file": str(limits_file)}
    settings["max_request_chars"] = "40"
    with run_server(tiny_store, log, **settings) as server, httpx.Client(base_url=server.url, timeout=30) as c:
        one, two = {"Authorization": f"Bearer {KEY_1}"}, {"Authorization": f"Bearer {KEY_2}"}
        assert c.get("/libretranslate/frontend/settings").json()["charLimit"] == 40  # its page stops longer input
        r = c.post("/predict", json={"texts": ["x" * 20, "y" * 21]}, headers=two)
        assert r.status_code == 413 and "40" in r.json()["error"]
        for _ in range(5):
            assert c.post("/translate", json={"texts": ["A dog runs."]}, headers=one).status_code == 200
        t0 = time.monotonic()
        r = c.post("/translate", json={"texts": ["A dog runs."]}, headers=one)
        assert time.monotonic() - t0 >= 0.9  # held SERVE_LIMIT_HOLD_S (1 s): a flood slows to its connections
        assert r.status_code == 429 and r.json()["type"] == "rate_limited" and set(r.json()) == {"error", "type"}
        assert 1 <= int(r.headers["retry-after"]) <= 12  # 5 a minute: one more each 12 s
        lt = {"q": "A dog runs.", "source": "en", "target": "de", "api_key": KEY_1}
        r = c.post("/libretranslate/translate", json=lt)
        assert r.status_code == 429 and set(r.json()) == {"error"} and int(r.headers["retry-after"]) >= 1
        oip = {"inputs": [{"name": "text", "datatype": "BYTES", "shape": [1], "data": ["A dog runs."]}]}
        r = c.post("/v2/models/tiny-mt/infer", json=oip, headers=one)
        assert r.status_code == 429 and set(r.json()) == {"error"}
        assert c.post("/v2/repository/index", headers=one).status_code == 200  # not an inference route
        for _ in range(8):  # the second key: its own bucket, and its own figure from the limits file
            assert c.post("/translate", json={"texts": ["A dog runs."]}, headers=two).status_code == 200
        assert c.post("/libretranslate/translate", json=lt | {"api_key": KEY_2}).status_code == 200
        assert c.post("/libretranslate/translate", data=lt | {"api_key": KEY_2}).status_code == 200
        assert c.get("/healthz").status_code == 200 and c.get("/readyz").status_code == 200
        metrics = c.get("/metrics").text
    assert 'inference_client_limited_total{limit="requests"} 3.0' in metrics
    text = log.read_text()
    assert KEY_1 not in text and KEY_2 not in text
    assert "429" in text  # the refusals were logged (without their keys)


@pytest.mark.slow
def test_the_address_comes_from_a_forwarded_header_only_when_it_is_trusted(tiny_store: Path, tmp_path: Path) -> None:
    body = {"texts": ["A dog runs."]}
    with (
        run_server(tiny_store, tmp_path / "plain.log", client_requests_per_minute="2") as server,
        httpx.Client(base_url=server.url, timeout=30) as c,
    ):
        answers = [c.post("/predict", json=body, headers={"X-Forwarded-For": f"203.0.113.{i}"}) for i in range(3)]
        assert [r.status_code for r in answers] == [200, 200, 429]  # spoofing the header changes nothing
    settings = {"client_requests_per_minute": "2", "trusted_proxy_header": "x-forwarded-for"}
    with (
        run_server(tiny_store, tmp_path / "proxied.log", **settings) as server,
        httpx.Client(base_url=server.url, timeout=30) as c,
    ):

        def via(chain: str) -> int:
            return c.post("/predict", json=body, headers={"X-Forwarded-For": chain}).status_code

        # what the client wrote before the proxy's entry does not make it someone else
        assert [via(f"198.51.100.{i}, 203.0.113.1") for i in range(3)] == [200, 200, 429]
        assert via("203.0.113.1, 203.0.113.2") == 200  # the proxy saw another client
