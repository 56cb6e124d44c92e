"""Documents through a real server (the tiny translator): Debian catalogs round trip through
`POST /translate_file` and pass `msgfmt -c -f`; LibreTranslate's upload, URL and download, also
behind a proxy; hostile uploads get a 4xx and leave the service serving."""

from __future__ import annotations

import re
import statistics
import threading
import time
from collections.abc import Iterator
from pathlib import Path

import httpx
import pytest

from service.documents import po_syntax
from service.documents.placeholders import formats, placeholders
from tests.helpers import CATALOG, CATALOGS, Server, entries, lines_outside, msgfmt, run_server

pytestmark = pytest.mark.slow  # real server processes, a few seconds each: left out of `make test-fast`

PO = "text/x-gettext-translation"


@pytest.fixture(scope="module")
def server(tiny_store: Path, tmp_path_factory: pytest.TempPathFactory) -> Iterator[Server]:
    log = tmp_path_factory.mktemp("documents") / "server.log"
    with run_server(tiny_store, log, max_file_bytes=str(1 << 20)) as s:
        yield s


def upload(c: httpx.Client, name: str, data: bytes, path: str = "/translate_file", **fields: str) -> httpx.Response:
    return c.post(path, files={"file": (name, data)}, data=fields)


def without_date(data: bytes) -> bytes:
    return re.sub(rb'"PO-Revision-Date: [^"]*"', b"", data)


@pytest.mark.parametrize("path", CATALOGS, ids=lambda p: p.stem)
def test_a_debian_catalog_round_trips_through_translate_file(server: Server, path: Path, tmp_path: Path) -> None:
    source = path.read_bytes()
    with httpx.Client(base_url=server.url, timeout=120) as c:
        r = upload(c, path.name.upper(), source)  # the extension in any case
        assert r.status_code == 200, r.text
        again = upload(c, path.name, r.content)
    assert r.headers["content-type"] == PO
    assert f'filename="{path.stem.upper()}_de.PO"' in r.headers["content-disposition"]
    done, kept, failed = (int(r.headers[f"x-{k}-entries"]) for k in ("translated", "kept", "failed"))
    before, after = entries(source), entries(r.content)
    assert done > 0 and done + kept + failed == len(before) - 1
    result = msgfmt(r.content, tmp_path)
    assert result.returncode == 0, result.stderr
    changed = {b.start for b, a in zip(before, after, strict=True) if b.msgstr != a.msgstr or b.is_header}
    for b, a in zip(before, after, strict=True):
        if b.start in changed and not b.is_header:
            assert b.untranslated and "fuzzy" not in b.flags and not b.obsolete and "fuzzy" in a.flags
            kinds = formats(b.flags)
            assert placeholders(a.msgstr[0], kinds) == placeholders(b.msgid or "", kinds)
            if b.msgid_plural is not None:
                assert len(a.msgstr) == 2 and placeholders(a.msgstr[1], kinds) == placeholders(b.msgid_plural, kinds)
    starts = {a.start for a, b in zip(after, before, strict=True) if b.start in changed}
    assert lines_outside(r.content, starts) == lines_outside(source, changed)  # the rest byte for byte
    assert len(changed) - 1 == done
    assert again.status_code == 200 and without_date(again.content) == without_date(r.content)
    assert again.headers["x-translated-entries"] == "0"  # the failed ones fail again, nothing changes


def test_crlf_context_and_the_documented_refusals(server: Server, tmp_path: Path) -> None:
    crlf = CATALOG.replace("\n", "\r\n").encode()
    with httpx.Client(base_url=server.url, timeout=60) as c:
        r = upload(c, "menu.pot", crlf)
        bom = upload(c, "bom.po", b"\xef\xbb\xbf" + CATALOG.encode())
        latin = b'msgid ""\nmsgstr "Content-Type: text/plain; charset=ISO-8859-1\\n"\n'
        refused = {
            "syntax": upload(c, "broken.po", b'msgid "a"\nmsgstr "b"\nnonsense\n'),
            "bom+latin1": upload(c, "x.po", b"\xef\xbb\xbf" + latin),
            "not utf-8": upload(c, "x.po", CATALOG.encode() + b'\nmsgid "\xff\xfe"\nmsgstr ""\n'),
            "garbage": upload(c, "garbage.po", bytes(range(256)) * 64),
            "extension": upload(c, "../../setup.exe", b"MZ"),
            "no file": c.post("/translate_file", files={"other": ("x.po", b"")}),
            "json": c.post("/translate_file", json={"file": "x"}),
        }
    assert r.status_code == 200 and r.content.count(b"\r\n") == r.content.count(b"\n")
    assert 'filename="menu_de.pot"' in r.headers["content-disposition"]
    got = {(e.msgctxt, e.msgid): e.msgstr[0] for e in po_syntax.read(r.content.decode().splitlines(True))}
    assert got[("menu", "_Open")] and got[("verb", "_Open")]  # each context its own entry
    assert bom.status_code == 200 and bom.content.startswith(b"\xef\xbb\xbf")
    statuses = {k: v.status_code for k, v in refused.items()}
    assert statuses == dict.fromkeys(refused, 400) | {"json": 415}, {k: v.text for k, v in refused.items()}
    assert "line 3" in refused["syntax"].json()["error"]
    assert "line 1" in refused["bom+latin1"].json()["error"]
    assert f"line {CATALOG.count(chr(10)) + 2}:" in refused["not utf-8"].json()["error"]
    assert refused["garbage"].json()["type"] == "invalid_document"


def test_hostile_uploads_leave_the_service_serving(server: Server) -> None:
    with httpx.Client(base_url=server.url, timeout=60) as c:
        try:
            big = upload(c, "big.po", b"#" * (50 << 20)).status_code
        except httpx.TransportError:  # the server may answer and close before the upload ends
            big = 413
        traversal = upload(c, "../../../etc/cron.d/evil.po", CATALOG.encode())
        assert c.get("/healthz").status_code == 200
        assert c.post("/translate", json={"texts": ["The red cat."]}).status_code == 200
    assert big == 413
    assert traversal.status_code == 200 and 'filename="evil_de.po"' in traversal.headers["content-disposition"]


def test_libretranslate_file_flow_behind_a_proxy(server: Server) -> None:
    source = CATALOGS[0].read_bytes()
    proxy = {"x-forwarded-proto": "https", "x-forwarded-host": "mt.example.org", "x-forwarded-prefix": "/api"}
    with httpx.Client(base_url=server.url, timeout=120) as c:
        settings = c.get("/libretranslate/frontend/settings").json()
        assert settings["filesTranslation"] is True and ".po" in settings["supportedFilesFormat"]
        fields = {"source": "en", "target": "de"}
        direct = c.post("/libretranslate/translate_file", files={"file": (CATALOGS[0].name, source)}, data=fields)
        odd = "a#b? 100%.po"  # its download URL percent-encoded
        behind = c.post("/libretranslate/translate_file", files={"file": (odd, source)}, data=fields, headers=proxy)
        native = upload(c, CATALOGS[0].name, source)
        url = direct.json()["translatedFileUrl"]
        assert url.startswith(f"{server.url}/libretranslate/download_file/") and url.endswith("_de.po")
        proxied = behind.json()["translatedFileUrl"]
        assert proxied.startswith("https://mt.example.org/api/libretranslate/download_file/")
        assert proxied.endswith(".a%23b%3F%20100%25_de.po")
        downloaded = c.get(url.removeprefix(server.url))
        via_proxy = c.get(proxied.removeprefix("https://mt.example.org/api"))
        unknown = c.get("/libretranslate/download_file/" + "A" * 32 + ".x.po")
        bad = c.post("/libretranslate/translate_file", files={"file": ("a.po", b"nonsense")}, data=fields)
        unsupported = c.post("/libretranslate/translate_file", files={"file": ("a.po", source)}, data={"source": "en"})
    assert downloaded.status_code == 200 and downloaded.headers["content-type"] == PO
    assert without_date(downloaded.content) == without_date(native.content) == without_date(via_proxy.content)
    assert unknown.status_code == 404 and bad.status_code == 400 and unsupported.status_code == 400


def test_a_catalog_does_not_starve_one_sentence_requests(server: Server) -> None:
    """While a large catalog runs, one-sentence /translate requests are interleaved with it."""
    body = "".join(f'msgid "The red cat {i} sees a dog."\nmsgstr ""\n\n' for i in range(400))
    catalog = ('msgid ""\nmsgstr "Content-Type: text/plain; charset=UTF-8\\n"\n\n' + body).encode()

    def latencies(c: httpx.Client, n: int) -> list[float]:
        out = []
        for _ in range(n):
            t0 = time.perf_counter()
            assert c.post("/translate", json={"texts": ["A blue dog runs."]}).status_code == 200
            out.append(time.perf_counter() - t0)
        return out

    with httpx.Client(base_url=server.url, timeout=120) as c:
        idle = latencies(c, 20)
        finished: list[float] = []

        def run_catalog() -> None:
            with httpx.Client(base_url=server.url, timeout=300) as f:
                assert upload(f, "big.po", catalog).status_code == 200
            finished.append(time.perf_counter())

        worker = threading.Thread(target=run_catalog)
        worker.start()
        time.sleep(0.5)
        loaded = latencies(c, 20)
        during = time.perf_counter()
        worker.join()
    assert finished and finished[0] > during, "the catalog ended before the one-sentence requests did"
    p99 = lambda xs: statistics.quantiles(xs, n=100)[98]  # noqa: E731
    print(f"one-sentence /translate p99: {p99(idle) * 1000:.1f} ms idle, {p99(loaded) * 1000:.1f} ms with a catalog")
    assert p99(loaded) <= 5 * p99(idle) + 0.25  # + scheduling noise of a shared 2-core machine


def test_keys_apply_and_a_file_past_its_deadline_is_a_504(tiny_store: Path, tmp_path: Path) -> None:
    key = "doc-key-0123456789"
    body = "".join(f'msgid "The red cat {i} sees a dog."\nmsgstr ""\n\n' for i in range(600))
    catalog = ('msgid ""\nmsgstr "Content-Type: text/plain; charset=UTF-8\\n"\n\n' + body).encode()
    with (
        run_server(tiny_store, tmp_path / "server.log", api_keys=f"web:{key}", file_timeout_s="1") as server,
        httpx.Client(base_url=server.url, timeout=60) as c,
    ):
        fields = {"source": "en", "target": "de"}
        lt = "/libretranslate/translate_file"
        assert upload(c, "a.po", CATALOG.encode()).status_code == 401
        no_key = c.post(lt, files={"file": ("a.po", CATALOG.encode())}, data=fields)
        assert no_key.status_code == 400 and "API key" in no_key.json()["error"]  # as LibreTranslate answers
        wrong = c.post(lt, files={"file": ("a.po", CATALOG.encode())}, data=fields | {"api_key": "wrong"})
        assert wrong.status_code == 403 and wrong.json() == {"error": "Invalid API key"}
        keyed = c.post(lt, files={"file": ("a.po", CATALOG.encode())}, data=fields | {"api_key": key})
        assert keyed.status_code == 200, keyed.text
        t0 = time.monotonic()
        late = c.post(
            "/translate_file", files={"file": ("big.po", catalog)}, headers={"authorization": f"Bearer {key}"}
        )
        assert late.status_code == 504 and time.monotonic() - t0 < 10, late.text
        assert c.get("/healthz").status_code == 200


SUBTITLES = (
    "1\r\n00:00:01,000 --> 00:00:02,500\r\nThe cat sees a dog.\r\n\r\n"
    "2\r\n00:00:03,000 --> 00:00:04,000\r\n<i>A small dog runs.</i>\r\nThe cat sees a dog.\r\n"
)
MARKDOWN = (
    "# The cat sees a dog.\n\nA small dog runs. See [the docs](https://example.org/a_dog).\n\n"
    "```\nThe cat sees a dog.\n```\n"
)
TEXT = "The cat sees a dog.\n\n  A small dog runs.\n"
HTML = '<p class="x">The cat sees a dog.</p><pre>A small dog runs.</pre>'


@pytest.mark.parametrize(
    ("name", "source", "kept", "translated"),
    [
        ("film.SRT", SUBTITLES, ["00:00:01,000 --> 00:00:02,500\r\n", "\r\n2\r\n", "<i>"], 2),  # cues
        ("notes.md", MARKDOWN, ["# ", "](https://example.org/a_dog)", "```\nThe cat sees a dog.\n```\n"], 2),  # blocks
        ("notes.txt", TEXT, ["\n\n  "], 2),
        ("page.html", HTML, ['<p class="x">', "<pre>A small dog runs.</pre>"], 1),
    ],
)
def test_other_formats_keep_their_structure_and_translate_every_segment(
    server: Server, name: str, source: str, kept: list[str], translated: int
) -> None:
    with httpx.Client(base_url=server.url, timeout=60) as c:
        r = upload(c, name, source.encode())
        sentence = c.post("/translate", json={"texts": ["The cat sees a dog."]}).json()["translations"][0]["text"]
    assert r.status_code == 200, r.text
    out = r.content.decode()
    assert int(r.headers["x-translated-entries"]) == translated and r.headers["x-failed-entries"] == "0"
    assert all(k in out for k in kept), out
    assert sentence in out and out.count("\r\n") == source.count("\r\n") and out.count("\n") == source.count("\n")
