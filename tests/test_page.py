"""The try-it page in a real headless browser (Debian's chromium and chromedriver, through selenium)
against a real server process over the tiny store; and the page's static routes.

The browser comes from `make browser` (apt-get); the test fails, never skips, when it is missing.
Screenshots are kept as test artefacts: in the test's tmp folder and in build/test-artifacts/.
"""

from __future__ import annotations

import re
from collections.abc import Iterator
from pathlib import Path

import httpx
import pytest
from selenium.webdriver.chrome.webdriver import WebDriver
from selenium.webdriver.common.by import By
from selenium.webdriver.support.ui import Select

from service.http import page
from tests.browser import by_id, screenshot, severe, type_into, wait_for
from tests.conftest import CHECKED_TEXTS
from tests.helpers import Server, run_server
from tests.tiny import expected_label, expected_translation

MAX_TEXT_CHARS = 50  # the server's limit here, so that a long text gets an error answer
SENTENCE = "A small red dog runs."
SOURCE = "The cat sees a dog."


@pytest.fixture(scope="module")
def server(tiny_store: Path, tmp_path_factory: pytest.TempPathFactory) -> Iterator[Server]:
    log = tmp_path_factory.mktemp("page") / "server.log"
    with run_server(tiny_store, log, max_text_chars=str(MAX_TEXT_CHARS)) as s:
        yield s


def painted(driver: WebDriver, testid: str) -> bool:
    """The heatmap canvas has rows and columns and at least one drawn pixel."""
    return bool(
        driver.execute_script(
            """
            const c = document.querySelector(`[data-testid="${arguments[0]}"]`);
            if (!c || !(Number(c.dataset.rows) > 0 && Number(c.dataset.cols) > 0) || !c.width) return false;
            const px = c.getContext("2d").getImageData(0, 0, c.width, c.height).data;
            for (let i = 3; i < px.length; i += 4) if (px[i] > 0) return true;
            return false;
            """,
            testid,
        )
    )


@pytest.mark.browser
def test_page_classifies_translates_and_draws_attention(server: Server, browser: WebDriver, tmp_path: Path) -> None:
    browser.get(server.url + "/")
    type_into(browser, "sentiment-input", SENTENCE)
    by_id(browser, "sentiment-submit").click()
    type_into(browser, "translate-input", SOURCE)
    by_id(browser, "translate-submit").click()

    wait_for(browser, "the sentiment result", lambda d: by_id(d, "sentiment-result").is_displayed())
    wait_for(browser, "the translation", lambda d: by_id(d, "translation").is_displayed())
    wait_for(browser, "the cross-attention heatmap", lambda d: painted(d, "attention-map"))
    wait_for(browser, "the self-attention heatmap", lambda d: painted(d, "sentiment-attention-map"))
    wait_for(browser, "the model list", lambda d: d.find_element(By.ID, "models").text.startswith("Serving"))
    assert not by_id(browser, "text2text").is_displayed()  # no text-to-text model in this store

    # The page shows what the API answers for the same request (the page's default decoding).
    with httpx.Client(base_url=server.url, timeout=30) as c:
        prediction = c.post("/predict", json={"texts": [SENTENCE]}).json()["predictions"][0]
        body = {"texts": [SOURCE], "decode": "beam", "beam_size": 4, "num_hypotheses": 3, "return_attention": True}
        translated = c.post("/translate", json=body).json()["translations"][0]
    result = by_id(browser, "sentiment-result")
    assert result.find_element(By.ID, "sentiment-label").get_attribute("textContent") == prediction["label"]
    assert len(result.find_elements(By.CSS_SELECTOR, ".bars li")) == len(prediction["scores"])
    assert by_id(browser, "translation").text == translated["text"].strip()
    assert prediction["label"] == expected_label(SENTENCE)
    assert translated["text"] == expected_translation(SOURCE)
    items = by_id(browser, "nbest").find_elements(By.TAG_NAME, "li")
    nbest = [li.find_element(By.TAG_NAME, "span").text for li in items]
    assert nbest == [h["text"] for h in translated["hypotheses"]] and len(nbest) == 3
    [attention] = translated["attention"]
    heatmap = by_id(browser, "attention-map")
    rows, cols = int(heatmap.get_attribute("data-rows") or 0), int(heatmap.get_attribute("data-cols") or 0)
    assert (rows, cols) == (len(attention["target_tokens"]), len(attention["source_tokens"]))

    # The training pictures of both served versions load (through the figures route).
    browser.find_element(By.CSS_SELECTOR, "#training > summary").click()
    images = "#figures img"
    wait_for(
        browser,
        "the training figures",
        lambda d: (
            len(d.find_elements(By.CSS_SELECTOR, images)) == 3
            and all(
                d.execute_script("return arguments[0].complete && arguments[0].naturalWidth > 0", img)
                for img in d.find_elements(By.CSS_SELECTOR, images)
            )
        ),
    )

    screenshot(browser, tmp_path, "page.png", 1280)
    screenshot(browser, tmp_path, "page-phone.png", 390)
    assert painted(browser, "attention-map")  # redrawn at the phone's width
    assert browser.execute_script("return document.documentElement.scrollWidth <= window.innerWidth")  # no sideways
    browser.set_window_size(1280, 900)
    assert severe(browser) == []


@pytest.mark.browser
def test_decode_options_and_a_sentence_selector(server: Server, browser: WebDriver) -> None:
    browser.get(server.url + "/")
    Select(by_id(browser, "decode")).select_by_value("sample")
    assert not by_id(browser, "beam-size").is_enabled() and by_id(browser, "num-hypotheses").is_enabled()
    type_into(browser, "num-hypotheses", "2")
    type_into(browser, "translate-input", "The cat sees a dog. A small dog runs.")
    by_id(browser, "translate-submit").click()
    wait_for(browser, "two sampled hypotheses", lambda d: len(by_id(d, "nbest").find_elements(By.TAG_NAME, "li")) == 2)
    sentence = Select(browser.find_element(By.ID, "sentence"))
    assert browser.find_element(By.ID, "sentence-box").is_displayed() and len(sentence.options) == 2
    sentence.select_by_value("1")
    layer, head = Select(browser.find_element(By.ID, "layer")), Select(browser.find_element(By.ID, "head"))
    layer.select_by_value("1")
    head.select_by_value("0")
    assert painted(browser, "attention-map")
    Select(by_id(browser, "decode")).select_by_value("greedy")
    assert not by_id(browser, "num-hypotheses").is_enabled()
    by_id(browser, "translate-submit").click()
    wait_for(
        browser, "the greedy answer (no n-best list)", lambda d: not d.find_element(By.ID, "nbest-box").is_displayed()
    )
    assert not by_id(browser, "translate-error").is_displayed() and by_id(browser, "translation").is_displayed()
    assert severe(browser) == []


@pytest.mark.browser
def test_an_api_error_is_shown(server: Server, browser: WebDriver, tmp_path: Path) -> None:
    browser.get(server.url + "/")
    too_long = "The cat sees a dog. " * 4  # 80 characters; the server takes 50
    for box in ("translate", "sentiment"):
        type_into(browser, f"{box}-input", too_long)
        by_id(browser, f"{box}-submit").click()
        wait_for(browser, f"the {box} error", lambda d, box=box: by_id(d, f"{box}-error").is_displayed())
        shown = by_id(browser, f"{box}-error").text
        assert "422" in shown and f"at most {MAX_TEXT_CHARS}" in shown, shown
    screenshot(browser, tmp_path, "page-error.png", 1280)
    browser.set_window_size(1280, 900)
    # The browser itself reports the failed requests; nothing else may go wrong.
    assert [m for m in severe(browser) if "status of 422" not in m] == []


def test_static_routes_send_only_known_files_under_a_strict_policy(server: Server) -> None:
    with httpx.Client(base_url=server.url, timeout=10) as c:
        r = c.get("/")
        assert r.status_code == 200 and r.headers["content-type"] == "text/html; charset=utf-8"
        assert "default-src 'self'" in r.headers["content-security-policy"]
        assert r.headers["x-content-type-options"] == "nosniff"
        linked = set(re.findall(r'(?:src|href)="/static/([^"]+)"', r.text))
        assert linked == {"app.js", "style.css", "favicon.svg"}
        for name, kind in page.ASSETS.items():
            r = c.get(f"/static/{name}")
            assert r.status_code == 200 and r.headers["content-type"] == kind, name
            assert r.headers["content-security-policy"] == page.CSP
            if name != "favicon.svg":  # (its xmlns is a name, not a request)
                assert not re.search(r"https?://", r.text), f"{name} refers outside the service"
        for path in ("/static/page.py", "/static/..%2Fpage.py", "/static/%2e%2e%2fpage.py", "/static/"):
            r = c.get(path)
            assert r.status_code == 404 and r.json()["type"] == "not_found", path


def revised(catalog: str) -> str:
    """A catalog with its header's revision date left out."""
    return re.sub(r'"PO-Revision-Date: [^"]*"\n', "", catalog)


@pytest.mark.browser
def test_a_catalog_uploaded_on_the_page_comes_back_translated(
    server: Server, browser: WebDriver, tmp_path: Path
) -> None:
    catalog = tmp_path / "greetings.po"
    catalog.write_text(
        'msgid ""\nmsgstr ""\n"Content-Type: text/plain; charset=UTF-8\\n"\n\n'
        'msgid "The cat sees a dog."\nmsgstr ""\n\nmsgid "A small dog runs."\nmsgstr "Ein kleiner Hund rennt."\n',
        encoding="utf-8",
    )
    browser.get(server.url + "/")
    by_id(browser, "document-file").send_keys(str(catalog))
    by_id(browser, "document-submit").click()
    wait_for(browser, "the document counts", lambda d: by_id(d, "document-counts").is_displayed())
    assert by_id(browser, "document-counts").text.startswith("1 translated, 1 kept as they were, 0 left empty")
    link = by_id(browser, "document-link")
    assert link.get_attribute("download") == "greetings_de.po" and link.get_attribute("href").startswith("blob:")
    downloads = tmp_path / "downloads"
    browser.execute_cdp_cmd("Browser.setDownloadBehavior", {"behavior": "allow", "downloadPath": str(downloads)})
    link.click()
    saved = downloads / "greetings_de.po"  # Chromium may name the file before it has written all of it

    def downloaded(_: WebDriver) -> bool:
        return saved.is_file() and 'msgstr "Ein kleiner Hund rennt."' in saved.read_text(encoding="utf-8")

    wait_for(browser, "the download", downloaded)
    shown = (downloads / "greetings_de.po").read_text(encoding="utf-8")
    with httpx.Client(base_url=server.url, timeout=60) as c:
        direct = c.post("/translate_file", files={"file": ("greetings.po", catalog.read_bytes())})
    # the header's PO-Revision-Date is the minute of each translation: a minute may turn between them
    assert revised(shown) == revised(direct.text) and expected_translation("The cat sees a dog.") in shown
    assert severe(browser) == []


@pytest.mark.browser
def test_a_long_text_appears_as_it_is_translated(server: Server, browser: WebDriver) -> None:
    """The page streams the translation: the text grows in several steps, each the start of the answer."""
    text = "The red cat. A dog runs. The small blue window."  # within MAX_TEXT_CHARS
    browser.get(server.url + "/")
    Select(by_id(browser, "decode")).select_by_value("greedy")
    type_into(browser, "translate-input", text)
    browser.execute_script(
        # each record's text node: the text as each event left it (a callback may see several events at once)
        """window.seen = [];
        new MutationObserver((records) => {
          for (const r of records) for (const n of r.addedNodes) window.seen.push(n.textContent);
        }).observe(document.getElementById("translation"), {childList: true});"""
    )
    by_id(browser, "translate-submit").click()
    wait_for(browser, "the cross-attention heatmap", lambda d: painted(d, "attention-map"))
    with httpx.Client(base_url=server.url, timeout=30) as c:
        body = {"texts": [text], "decode": "greedy"}
        whole = c.post("/translate", json=body).json()["translations"][0]["text"]
    assert whole == expected_translation(text)
    seen = [t for t in browser.execute_script("return window.seen;") if t]
    assert seen[-1] == whole
    partial = [t for t in seen if t != whole]
    assert len(set(partial)) >= 2, seen  # it appeared before it was complete, in more than one step
    assert all(whole.startswith(t) for t in partial), seen
    assert severe(browser) == []


@pytest.mark.browser
def test_a_file_s_progress_bar_moves(server: Server, browser: WebDriver, tmp_path: Path) -> None:
    """The page reads `/translate_file`'s progress: the bar passes values between empty and full."""
    texts = [t for t in CHECKED_TEXTS if len(t) <= MAX_TEXT_CHARS and "⟨" not in t][:30]
    notes = tmp_path / "notes.txt"
    notes.write_text("\n\n".join(texts) + "\n", encoding="utf-8")
    browser.get(server.url + "/")
    browser.execute_script(
        # every value the bar took: each change's old value (a callback may see several at once)
        """window.bar = [];
        const bar = document.getElementById("document-progress");
        new MutationObserver((records) => {
          for (const r of records) if (r.oldValue !== null) window.bar.push(Number(r.oldValue));
        }).observe(bar, {attributes: true, attributeFilter: ["value"], attributeOldValue: true});"""
    )
    by_id(browser, "document-file").send_keys(str(notes))
    by_id(browser, "document-submit").click()
    wait_for(browser, "the document counts", lambda d: by_id(d, "document-counts").is_displayed())
    assert by_id(browser, "document-counts").text.startswith(f"{len(set(texts))} translated")
    bar = by_id(browser, "document-progress")
    total = float(bar.get_attribute("max") or 0)
    seen = [*browser.execute_script("return window.bar;"), float(bar.get_attribute("value") or 0)]
    assert total == len(set(texts)) and seen[-1] == total, seen
    assert any(0 < value < total for value in seen), seen  # it moved before the file was done
    assert seen[1:] == sorted(seen[1:]), seen  # from the previous file's value (or 0) it only grows
    assert not by_id(browser, "document-progress").is_displayed()
    assert severe(browser) == []
