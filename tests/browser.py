"""Headless Chromium for the tests that look at pages (`make browser` installs Debian's chromium and
its driver): started with the network switches off, its screenshots kept in build/test-artifacts/."""

from __future__ import annotations

import base64
import shutil
import time
from collections.abc import Callable
from pathlib import Path

from selenium import webdriver
from selenium.webdriver.chrome.service import Service as ChromeService
from selenium.webdriver.chrome.webdriver import WebDriver
from selenium.webdriver.common.by import By
from selenium.webdriver.remote.webelement import WebElement
from selenium.webdriver.support.ui import WebDriverWait

from tests.helpers import ROOT

CHROMIUM = Path("/usr/bin/chromium")
CHROMEDRIVER = Path("/usr/bin/chromedriver")
ARTIFACTS = ROOT / "build" / "test-artifacts"
FLAGS = (
    "--headless=new",
    "--no-sandbox",
    "--disable-gpu",
    "--disable-dev-shm-usage",
    "--disable-background-networking",  # the machine may have no network: nothing may phone home
    "--disable-component-update",
    "--disable-sync",
    "--no-first-run",
    "--window-size=1280,900",
    "--hide-scrollbars",
)


def start_chromium(folder: Path, *flags: str) -> WebDriver:
    """Headless chromium with the FLAGS (and `flags`), its profile and driver log in `folder`."""
    missing = [str(p) for p in (CHROMIUM, CHROMEDRIVER) if not p.is_file()]
    assert not missing, f"{', '.join(missing)} missing: `make browser` installs chromium and chromium-driver"
    options = webdriver.ChromeOptions()
    options.binary_location = str(CHROMIUM)
    for flag in (*FLAGS, *flags, f"--user-data-dir={folder / 'profile'}"):
        options.add_argument(flag)
    options.set_capability("goog:loggingPrefs", {"browser": "ALL"})
    # An explicit driver path: Selenium Manager is never asked to find or download one.
    service = ChromeService(executable_path=str(CHROMEDRIVER), log_output=str(folder / "chromedriver.log"))
    driver = webdriver.Chrome(service=service, options=options)
    driver.set_page_load_timeout(30)
    return driver


def wait_for(driver: WebDriver, what: str, condition: Callable[[WebDriver], object], timeout: float = 60) -> None:
    WebDriverWait(driver, timeout).until(condition, f"timed out waiting for {what}")


def by_id(driver: WebDriver, testid: str) -> WebElement:
    """The page's element with this data-testid."""
    return driver.find_element(By.CSS_SELECTOR, f'[data-testid="{testid}"]')


def type_into(driver: WebDriver, testid: str, text: str) -> None:
    box = by_id(driver, testid)
    box.clear()
    box.send_keys(text)


def severe(driver: WebDriver) -> list[str]:
    return [e["message"] for e in driver.get_log("browser") if e["level"] == "SEVERE"]


def screenshot(driver: WebDriver, tmp_path: Path, name: str, width: int) -> Path:
    """A full-page PNG at `width` CSS pixels, kept in tmp_path and build/test-artifacts/."""
    driver.set_window_size(width, 900)
    time.sleep(0.4)  # the page redraws its heatmaps 150 ms after a resize
    size = driver.execute_cdp_cmd("Page.getLayoutMetrics", {})["cssContentSize"]
    clip = {"x": 0, "y": 0, "width": size["width"], "height": size["height"], "scale": 1}
    shot = driver.execute_cdp_cmd(
        "Page.captureScreenshot", {"format": "png", "captureBeyondViewport": True, "clip": clip}
    )
    path = tmp_path / name
    path.write_bytes(base64.b64decode(shot["data"]))
    ARTIFACTS.mkdir(parents=True, exist_ok=True)
    shutil.copyfile(path, ARTIFACTS / name)
    print(f"screenshot: {path} (also {ARTIFACTS / name})")
    return path
