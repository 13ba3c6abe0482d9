"""A real headless Chromium (Debian's chromium + chromium-driver) driven by selenium, reading
the live page as an operator's browser does: what it logged, what it fetched, what it shows."""

from __future__ import annotations

import json
import shutil
from collections.abc import Iterator
from contextlib import contextmanager
from urllib.parse import urlsplit

from selenium import webdriver
from selenium.webdriver.chrome.service import Service
from selenium.webdriver.common.by import By
from selenium.webdriver.remote.webdriver import WebDriver
from selenium.webdriver.support.ui import WebDriverWait

CHROMIUM = "/usr/bin/chromium"
CHROMEDRIVER = "/usr/bin/chromedriver"
PAGE_TIMEOUT_S = 20.0


def chromium_missing() -> str | None:
    """Why no browser can run here (the packages to install), or None."""
    missing = [name for name, path in (("chromium", CHROMIUM), ("chromium-driver", CHROMEDRIVER))
               if shutil.which(path) is None]
    return f"install {' '.join(missing)} (apt-get install {' '.join(missing)})" if missing else None


@contextmanager
def browser(width: int = 1400, height: int = 1100) -> Iterator[WebDriver]:
    """A headless Chromium that keeps its console and network logs; quit at the end."""
    missing = chromium_missing()
    if missing:  # never a skip: CI installs both, and a test that cannot run must say so
        raise RuntimeError(f"no headless Chromium here: {missing}")
    options = webdriver.ChromeOptions()
    options.binary_location = CHROMIUM
    for argument in ("--headless=new", "--no-sandbox", "--disable-dev-shm-usage",
                     "--disable-background-networking", "--disable-component-update",
                     "--no-first-run", "--disable-default-apps", "--disable-sync",
                     f"--window-size={width},{height}"):
        options.add_argument(argument)
    options.set_capability("goog:loggingPrefs", {"browser": "ALL", "performance": "ALL"})
    driver = webdriver.Chrome(options=options, service=Service(CHROMEDRIVER))
    try:
        yield driver
    finally:
        driver.quit()


def wait_for(driver: WebDriver, predicate, message: str, timeout: float = PAGE_TIMEOUT_S):
    """What `predicate(driver)` returns once truthy; fails naming `message`."""
    return WebDriverWait(driver, timeout, poll_frequency=0.2).until(predicate, message)


def wait_live(driver: WebDriver, timeout: float = PAGE_TIMEOUT_S) -> None:
    """Until the page says its data is live (a poll of /status and /capabilities answered)."""
    wait_for(driver, lambda d: d.find_element(By.ID, "state").get_attribute("data-state")
             == "live", "the page to show live data", timeout)


def console_errors(driver: WebDriver) -> list[dict]:
    """The console entries at SEVERE since the last read (errors, refused scripts, CSP)."""
    return [entry for entry in driver.get_log("browser") if entry["level"] == "SEVERE"]


def requested_urls(driver: WebDriver) -> list[str]:
    """Every URL the page asked the network for since the last read (the performance log)."""
    urls = []
    for entry in driver.get_log("performance"):
        message = json.loads(entry["message"])["message"]
        if message["method"] == "Network.requestWillBeSent":
            urls.append(message["params"]["request"]["url"])
    return urls


def foreign(urls: list[str], origin: str) -> list[str]:
    """The URLs not on `origin` (data: URLs never leave the page)."""
    own = urlsplit(origin)
    return [url for url in urls if not url.startswith("data:")
            and (urlsplit(url).scheme, urlsplit(url).netloc) != (own.scheme, own.netloc)]


def rows(driver: WebDriver, table: str, attribute: str) -> dict[str, dict]:
    """The rows of a table of the page by their `attribute`: data-ready, text and cells, read
    in one script run (the page replaces its rows at every poll)."""
    return driver.execute_script(
        "const found = {};"
        "for (const tr of document.querySelectorAll(`#${arguments[0]} tbody tr`)) {"
        "  found[tr.getAttribute(arguments[1])] = {ready: tr.getAttribute('data-ready'),"
        "    text: tr.innerText, cells: [...tr.cells].map((td) => td.textContent)};"
        "}"
        "return found;", table, attribute)


def links(driver: WebDriver) -> list[dict[str, str]]:
    """The mesh picture's peer links: role, peer origin and state as drawn."""
    return driver.execute_script(
        "return [...document.querySelectorAll('#mesh line')].map((l) => ({"
        "role: l.getAttribute('data-role'), origin: l.getAttribute('data-origin'),"
        "state: l.getAttribute('data-state')}));")


def boxes(driver: WebDriver) -> dict[str, str]:
    """The mesh picture's boxes: this box by name, each peer by origin, and its state."""
    return driver.execute_script(
        "const drawn = {};"
        "for (const g of document.querySelectorAll('#mesh g')) {"
        "  drawn[g.getAttribute('data-origin') || g.getAttribute('data-box')] ="
        "    g.getAttribute('data-state');"
        "}"
        "return drawn;")


def load_ms(driver: WebDriver) -> float:
    """Navigation start to the load event of the current page, in ms (navigation timing)."""
    return driver.execute_script(
        "const t = performance.getEntriesByType('navigation')[0];"
        "return t.loadEventEnd - t.startTime;")
