"""The try-it page's text-to-text card in headless Chromium, against a real server over the tiny
store plus two tiny T5s imported as text-to-text models (one with a prefix, as Flan-T5 is served
for summaries): the card shows the served models and what each reads, its output streams in and
ends as `POST /generate` answers the same options, and a refusal shows in its error line.
(The card stays hidden on a store without such a model: tests/test_page.py.)
"""

from __future__ import annotations

import shutil
from collections.abc import Iterator
from pathlib import Path

import httpx
import pytest
from selenium.webdriver.chrome.webdriver import WebDriver
from selenium.webdriver.common.by import By
from selenium.webdriver.support.ui import Select

from export.import_hf import ImportOptions, import_checkpoint
from tests.browser import by_id, screenshot, severe, type_into, wait_for
from tests.helpers import Server, run_server
from tests.hf_checkpoints import Checkpoint, build

pytestmark = pytest.mark.browser

TEXT = "x y z. the dog ran after the cat, and the cat ran up a tree."
MODELS = {"flan": "summarize: ", "t5": ""}  # name: prefix


@pytest.fixture(scope="module")
def server(
    tiny_store: Path, flan_t5: Checkpoint, t5: Checkpoint, tmp_path_factory: pytest.TempPathFactory
) -> Iterator[Server]:
    """The tiny store's classifier and translator, and two text-to-text models."""
    store = tmp_path_factory.mktemp("page-t2t") / "store"
    shutil.copytree(tiny_store, store)
    for (name, prefix), checkpoint in zip(MODELS.items(), (flan_t5, t5), strict=True):
        generation = {"num_beams": 4, "max_length": 20}
        # EOS made less likely than build's default: each model writes several tokens on TEXT
        folder = build(checkpoint, tmp_path_factory.mktemp(name) / "ckpt", generation, eos_bias=2.0)
        import_checkpoint(folder, store, ImportOptions(name=name, prefix=prefix), log=lambda _: None)
    with run_server(store, tmp_path_factory.mktemp("log") / "server.log") as running:
        yield running


def open_card(browser: WebDriver, server: Server) -> Select:
    """The page loaded until its text-to-text card shows; its model select."""
    browser.get(server.url + "/")
    wait_for(browser, "the text-to-text card", lambda d: by_id(d, "text2text").is_displayed())
    return Select(by_id(browser, "generate-model"))


def generate(browser: WebDriver) -> str:
    """Clicks Generate and waits for the answer (the status line's timing); the text shown."""
    by_id(browser, "generate-submit").click()
    wait_for(browser, "the generation", lambda d: d.find_element(By.ID, "generate-status").text.endswith(" ms"))
    assert not by_id(browser, "generate-error").is_displayed(), by_id(browser, "generate-error").text
    return str(by_id(browser, "generation").get_attribute("textContent"))


def test_the_card_offers_the_text_to_text_models_and_what_each_reads(server: Server, browser: WebDriver) -> None:
    models = open_card(browser, server)
    assert [o.get_attribute("value") for o in models.options] == list(MODELS)
    assert by_id(browser, "generate-prefix").text == "reads: summarize: …"
    models.select_by_value("t5")
    assert by_id(browser, "generate-prefix").text == "reads the text as it is"
    translators = Select(by_id(browser, "translate-model"))
    assert [o.get_attribute("value") for o in translators.options] == ["", "tiny-mt"]  # not offered to translate
    assert severe(browser) == []


@pytest.mark.parametrize("decode", ["beam", "greedy"])
def test_the_card_shows_what_generate_answers(server: Server, browser: WebDriver, decode: str, tmp_path: Path) -> None:
    """Each model, the model's own beam search and greedy: the text streamed in is `/generate`'s, its
    score shown; greedy shows it growing, each step the start of the answer."""
    models = open_card(browser, server)
    type_into(browser, "generate-input", TEXT)
    Select(by_id(browser, "generate-decode")).select_by_value(decode)
    browser.execute_script(
        # the text as each event left it (a callback may see several events at once)
        """window.seen = [];
        new MutationObserver((records) => {
          for (const r of records) for (const n of r.addedNodes) window.seen.push(n.textContent);
        }).observe(document.getElementById("generation"), {childList: true});"""
    )
    for name in MODELS:
        models.select_by_value(name)
        browser.execute_script("window.seen = [];")
        shown = generate(browser)
        body = {"model": name, "texts": [TEXT], "decode": decode, "return_scores": True}
        answer = httpx.post(server.url + "/generate", json=body, timeout=60).json()["generations"][0]
        assert shown == answer["text"] and len(answer["text"]) > 3, (name, shown)
        meta = by_id(browser, "generation-meta").text
        assert f"score {answer['score']:.3f}" in meta
        assert ("cut at the length limit" in meta) == (answer["finish_reason"] == "length"), meta
        assert browser.find_element(By.ID, "generate-status").text.startswith(f"{name} v1 · ")
        seen = [t for t in browser.execute_script("return window.seen;") if t]
        assert seen[-1] == answer["text"] and all(answer["text"].startswith(t) for t in seen), seen
        if decode == "greedy":
            assert len(set(seen)) >= 2, seen  # it appeared before it was complete
    screenshot(browser, tmp_path, f"page-text2text-{decode}.png", 1280)
    screenshot(browser, tmp_path, f"page-text2text-{decode}-phone.png", 390)
    assert browser.execute_script("return document.documentElement.scrollWidth <= window.innerWidth")  # no sideways
    browser.set_window_size(1280, 900)
    assert severe(browser) == []


def test_a_refusal_shows_in_the_card_s_error_line(server: Server, browser: WebDriver) -> None:
    open_card(browser, server)
    type_into(browser, "generate-input", " ".join([TEXT] * 30))  # past the model's 511 tokens
    by_id(browser, "generate-submit").click()
    wait_for(browser, "the error", lambda d: by_id(d, "generate-error").is_displayed())
    shown = by_id(browser, "generate-error").text
    assert "HTTP 413, input_too_long" in shown and "accepts at most" in shown, shown
    assert not by_id(browser, "generation").is_displayed()
    assert [m for m in severe(browser) if "status of 413" not in m] == []
