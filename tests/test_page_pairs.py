"""The try-it page's rerank and zero-shot cards in headless Chromium, against a real server over the
tiny store plus tiny random pair classifiers imported in the test (a BERT cross-encoder of one
label, a RoBERTa NLI model, a BERT pair classifier of two labels and no entailment): the cards offer
the models each can use, show what `POST /rerank` and `POST /zero-shot-classification` answer, show
a refusal in their error line, and stay hidden on the tiny store.
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
from tests.hf_checkpoints import Checkpoint, build_classifier

pytestmark = pytest.mark.browser

NLI = {0: "contradiction", 1: "neutral", 2: "entailment"}
QUERY = "who jumps over the dog?"
DOCS = ["the quick brown fox jumps", "a cat sat on the mat", "dogs sleep near the river bank", "x y z"]
TEXT = "the fox jumps over the lazy dog"
LABELS = ["animals", "maths", "the weather"]


@pytest.fixture(scope="module")
def pair_store(
    tmp_path_factory: pytest.TempPathFactory, tiny_store: Path, bert: Checkpoint, roberta: Checkpoint
) -> Path:
    """The tiny store (`tiny-clf`, `tiny-mt`) and pair classifiers: `xenc` (a scorer), `nli` (zero-shot
    too) and `pair2` (two labels, none of them entailment: rerank only)."""
    root = tmp_path_factory.mktemp("page-pairs")
    store = root / "store"
    shutil.copytree(tiny_store, store)
    folders = {
        "xenc": build_classifier(bert, root / "xenc", {0: "relevance"}, seed=3),
        "nli": build_classifier(roberta, root / "nli", NLI, seed=4),
        "pair2": build_classifier(bert, root / "pair2", {0: "unrelated", 1: "related"}, seed=5),
    }
    for name, folder in folders.items():
        import_checkpoint(folder, store, ImportOptions(name=name), log=lambda _: None)
    return store


@pytest.fixture(scope="module")
def server(pair_store: Path, tmp_path_factory: pytest.TempPathFactory) -> Iterator[Server]:
    with run_server(pair_store, tmp_path_factory.mktemp("log") / "server.log") as running:
        yield running


def open_cards(browser: WebDriver, server: Server) -> None:
    browser.get(server.url + "/")
    wait_for(browser, "the rerank card", lambda d: by_id(d, "rerank").is_displayed())


def submit(browser: WebDriver, prefix: str) -> None:
    """Clicks the card's button and waits for its answer (the status line's timing) or its error."""
    by_id(browser, f"{prefix}-submit").click()
    wait_for(
        browser,
        f"the {prefix} answer",
        lambda d: (
            d.find_element(By.ID, f"{prefix}-status").text.endswith(" ms") or by_id(d, f"{prefix}-error").is_displayed()
        ),
    )


def options(browser: WebDriver, testid: str) -> list[str]:
    return [str(o.get_attribute("value")) for o in Select(by_id(browser, testid)).options]


def test_the_cards_offer_the_pair_models_each_can_use(server: Server, browser: WebDriver) -> None:
    """Rerank: every pair classifier, the scorer first; zero-shot: the one with an entailment label.
    The sentiment card names the single-text classifier (the default is ambiguous beside them)."""
    open_cards(browser, server)
    assert by_id(browser, "zero-shot").is_displayed()
    rerankers = options(browser, "rerank-model")
    assert rerankers[0] == "xenc" and sorted(rerankers) == ["nli", "pair2", "xenc"]
    assert options(browser, "zeroshot-model") == ["nli"]
    assert options(browser, "translate-model") == ["", "tiny-mt"]
    assert not by_id(browser, "text2text").is_displayed()

    type_into(browser, "sentiment-input", TEXT)
    submit(browser, "sentiment")
    assert not by_id(browser, "sentiment-error").is_displayed(), by_id(browser, "sentiment-error").text
    want = httpx.post(server.url + "/predict", json={"model": "tiny-clf", "texts": [TEXT]}, timeout=30).json()
    shown = browser.find_element(By.ID, "sentiment-label").get_attribute("textContent")
    assert shown == want["predictions"][0]["label"]
    assert browser.find_element(By.ID, "sentiment-status").text.startswith("tiny-clf v1 · ")
    assert severe(browser) == []


@pytest.mark.parametrize("model", ["xenc", "nli"])
def test_the_rerank_card_shows_what_rerank_answers(
    server: Server, browser: WebDriver, model: str, tmp_path: Path
) -> None:
    """The documents in `/rerank`'s order with its scores (a blank line is no document)."""
    open_cards(browser, server)
    Select(by_id(browser, "rerank-model")).select_by_value(model)
    type_into(browser, "rerank-query", QUERY)
    type_into(browser, "rerank-texts", "\n".join([DOCS[0], "", *DOCS[1:]]))
    submit(browser, "rerank")
    assert not by_id(browser, "rerank-error").is_displayed(), by_id(browser, "rerank-error").text

    body = {"model": model, "query": QUERY, "texts": DOCS, "truncate": False}
    answer = httpx.post(server.url + "/rerank", json=body, timeout=30).json()
    items = by_id(browser, "ranks").find_elements(By.TAG_NAME, "li")
    assert [int(str(li.get_attribute("data-index"))) for li in items] == [r["index"] for r in answer]
    for li, rank in zip(items, answer, strict=True):
        assert float(str(li.get_attribute("data-score"))) == pytest.approx(rank["score"], abs=1e-6)
        assert li.find_element(By.CLASS_NAME, "value").text == f"{rank['score']:.4f}"
        assert li.find_element(By.CLASS_NAME, "doc").text == f"{DOCS[rank['index']]} #{rank['index'] + 1}"
    assert len({r["score"] for r in answer}) > 1  # the scores tell the documents apart
    assert browser.find_element(By.ID, "rerank-status").text.startswith(f"{model} v1 · 4 documents · ")
    screenshot(browser, tmp_path, f"page-rerank-{model}.png", 1280)
    screenshot(browser, tmp_path, f"page-rerank-{model}-phone.png", 390)
    assert browser.execute_script("return document.documentElement.scrollWidth <= window.innerWidth")  # no sideways
    browser.set_window_size(1280, 900)
    assert severe(browser) == []


@pytest.mark.parametrize("multi_label", [False, True])
def test_the_zero_shot_card_shows_what_zero_shot_answers(
    server: Server, browser: WebDriver, multi_label: bool, tmp_path: Path
) -> None:
    """The labels as bars in the answer's order with its scores; the template as typed."""
    open_cards(browser, server)
    template = "This text is about {}."
    type_into(browser, "zeroshot-input", TEXT)
    type_into(browser, "zeroshot-labels", " , ".join(LABELS) + ",")  # spaces and an empty label dropped
    type_into(browser, "zeroshot-template", template)
    if by_id(browser, "zeroshot-multi").is_selected() != multi_label:
        by_id(browser, "zeroshot-multi").click()
    submit(browser, "zeroshot")
    assert not by_id(browser, "zeroshot-error").is_displayed(), by_id(browser, "zeroshot-error").text

    body = {
        "model": "nli",
        "texts": [TEXT],
        "candidate_labels": LABELS,
        "hypothesis_template": template,
        "multi_label": multi_label,
    }
    answer = httpx.post(server.url + "/zero-shot-classification", json=body, timeout=30).json()
    want = answer["results"][0]
    items = by_id(browser, "zeroshot-bars").find_elements(By.TAG_NAME, "li")
    assert [li.find_element(By.CLASS_NAME, "name").get_attribute("textContent") for li in items] == want["labels"]
    for li, score in zip(items, want["scores"], strict=True):
        assert float(str(li.get_attribute("data-score"))) == pytest.approx(score, abs=1e-6)
        assert li.find_element(By.CLASS_NAME, "value").text == f"{100 * score:.1f} %"
    assert (sum(want["scores"]) == pytest.approx(1.0, abs=1e-5)) != multi_label  # one softmax or each alone
    best = [li.get_attribute("class") == "best" for li in items]
    assert best == ([s >= 0.5 for s in want["scores"]] if multi_label else [True, False, False])
    assert browser.find_element(By.ID, "zeroshot-status").text.startswith("nli v1 · ")
    screenshot(browser, tmp_path, f"page-zero-shot-{'multi' if multi_label else 'single'}.png", 1280)
    assert severe(browser) == []


def test_refusals_show_in_the_cards_error_lines(server: Server, browser: WebDriver) -> None:
    """A document past the model's tokens (413; accepted once cut), a template without `{}` (422)."""
    open_cards(browser, server)
    type_into(browser, "rerank-texts", f"{DOCS[0]}\n{'x ' * 700}")
    submit(browser, "rerank")
    shown = by_id(browser, "rerank-error").text
    assert "HTTP 413, input_too_long" in shown, shown
    assert not by_id(browser, "rerank-result").is_displayed()
    by_id(browser, "rerank-truncate").click()
    submit(browser, "rerank")
    assert not by_id(browser, "rerank-error").is_displayed(), by_id(browser, "rerank-error").text
    assert len(by_id(browser, "ranks").find_elements(By.TAG_NAME, "li")) == 2

    type_into(browser, "zeroshot-template", "no braces")
    submit(browser, "zeroshot")
    shown = by_id(browser, "zeroshot-error").text
    assert "hypothesis_template" in shown and "HTTP 422" in shown, shown
    assert not by_id(browser, "zeroshot-result").is_displayed()
    assert [m for m in severe(browser) if "status of 413" not in m and "status of 422" not in m] == []


def test_the_cards_stay_hidden_without_pair_models(
    tiny_store: Path, browser: WebDriver, tmp_path_factory: pytest.TempPathFactory
) -> None:
    with run_server(tiny_store, tmp_path_factory.mktemp("tiny") / "server.log") as tiny:
        browser.get(tiny.url + "/")
        wait_for(browser, "the model list", lambda d: d.find_element(By.ID, "models").text.startswith("Serving"))
        assert not by_id(browser, "rerank").is_displayed()
        assert not by_id(browser, "zero-shot").is_displayed()
        assert severe(browser) == []
