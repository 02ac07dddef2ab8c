"""The management page in a real headless Chromium (Debian ``chromium`` + ``chromium-driver``,
driven by Selenium): log in, see the family, disable a broker from the page, see it change.

The screenshots are test artifacts: ``test-artifacts/`` at the top of the tree (or
``$SCALE0_TEST_ARTIFACTS``). tools/test installs chromium and chromium-driver when missing; a
machine without them fails here, saying so, rather than skipping.
"""

from __future__ import annotations

import contextlib
import os
import shutil
import threading
import time
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any, TypeVar

import pytest
from selenium import webdriver
from selenium.common.exceptions import StaleElementReferenceException, WebDriverException
from selenium.webdriver.chrome.service import Service
from selenium.webdriver.common.by import By
from selenium.webdriver.remote.webdriver import WebDriver
from selenium.webdriver.support.ui import WebDriverWait

from scale0.net.client import Client
from scale0.net.worker import Worker
from scale0.testing import Family, running_family

pytestmark = pytest.mark.system

CHROMIUM = "/usr/bin/chromium"
CHROMEDRIVER = "/usr/bin/chromedriver"
WAIT_S = 20.0
ARTIFACTS = Path(
    os.environ.get("SCALE0_TEST_ARTIFACTS", Path(__file__).resolve().parents[2] / "test-artifacts")
)

T = TypeVar("T")


def echo(body: list[bytes]) -> list[bytes]:
    return body


@pytest.fixture
def browser(tmp_path: Path) -> Iterator[WebDriver]:
    for path in (CHROMIUM, CHROMEDRIVER):
        assert shutil.which(path), (
            f"{path} is missing: apt-get install chromium chromium-driver (tools/test does)"
        )
    options = webdriver.ChromeOptions()
    options.binary_location = CHROMIUM
    for flag in (
        "--headless",
        "--no-sandbox",
        "--disable-gpu",
        "--disable-background-networking",
        "--disable-component-update",
        "--disable-sync",
        "--no-first-run",
        "--disable-dev-shm-usage",
        "--window-size=1280,1400",
        f"--user-data-dir={tmp_path / 'chromium-profile'}",
    ):
        options.add_argument(flag)
    service = Service(executable_path=CHROMEDRIVER, log_output=str(tmp_path / "driver.log"))
    driver = webdriver.Chrome(options=options, service=service)
    driver.set_page_load_timeout(WAIT_S)
    try:
        yield driver
    finally:
        driver.quit()


def wait(driver: WebDriver, condition: Callable[[WebDriver], T | None], what: str) -> T:
    def safe(d: WebDriver) -> T | None:
        try:
            return condition(d)
        except StaleElementReferenceException:
            return None  # the table was redrawn under us: ask again

    try:
        return WebDriverWait(driver, WAIT_S, poll_frequency=0.2).until(safe)
    except WebDriverException as exc:
        screenshot(driver, "management-page-failure.png")
        raise AssertionError(f"timed out waiting for {what}") from exc


def screenshot(driver: WebDriver, name: str) -> Path:
    ARTIFACTS.mkdir(parents=True, exist_ok=True)
    path = ARTIFACTS / name
    assert driver.save_screenshot(str(path)), f"no screenshot written to {path}"
    return path


def states(driver: WebDriver) -> dict[str, str]:
    rows = driver.find_elements(By.CSS_SELECTOR, "#brokers tbody tr")
    return {
        row.get_attribute("data-broker") or "": row.find_element(By.CSS_SELECTOR, ".state").text
        for row in rows
    }


def log_in(driver: WebDriver, family: Family, user: str) -> None:
    driver.get(family["b1"].management + "/")
    wait(driver, lambda d: d.find_element(By.ID, "login").is_displayed(), "the login form")
    driver.find_element(By.ID, "auth-id").send_keys(user)
    driver.find_element(By.ID, "password").send_keys(family.admins[user][0])
    driver.find_element(By.ID, "login-button").click()
    wait(driver, lambda d: d.find_element(By.ID, "dashboard").is_displayed(), "the dashboard")


def test_admin_logs_in_sees_the_family_and_disables_a_broker(
    tmp_path: Path, browser: WebDriver
) -> None:
    with running_family(tmp_path / "family") as family:
        worker = Worker(family["b1"].endpoints["backend"], {"echo": echo}).start_in_thread()
        try:
            with traffic(family["b1"].frontend) as answered:
                wait_until(lambda: answered[0] >= 5, "five echo answers")
                _check_page(browser, family)
        finally:
            worker.stop()


@contextlib.contextmanager
def traffic(endpoint: str) -> Iterator[list[int]]:
    """A client thread asking echo every 0.2 s (a live session and live charts) until exit."""
    answered = [0]
    stop = threading.Event()
    failures: list[BaseException] = []

    def run() -> None:
        try:
            with Client(endpoint, timeout=10.0) as client:
                while not stop.is_set():
                    assert client.request("echo", b"ping") == [b"ping"]
                    answered[0] += 1
                    stop.wait(0.2)
        except BaseException as exc:  # reported by the test, not lost in the thread
            failures.append(exc)

    thread = threading.Thread(target=run, name="traffic", daemon=True)
    thread.start()
    try:
        yield answered
    finally:
        stop.set()
        thread.join(15.0)
    assert not thread.is_alive(), "the traffic thread did not stop"
    assert not failures, failures


def wait_until(condition: Callable[[], bool], what: str, timeout_s: float = WAIT_S) -> None:
    deadline = time.monotonic() + timeout_s
    while not condition():
        if time.monotonic() > deadline:
            raise AssertionError(f"timed out waiting for {what}")
        time.sleep(0.05)


def _check_page(browser: WebDriver, family: Family) -> None:
    browser.get(family["b1"].management + "/")
    wait(browser, lambda d: d.find_element(By.ID, "login-form").is_displayed(), "login")
    # A wrong password first: the page says so and shows no dashboard.
    browser.find_element(By.ID, "auth-id").send_keys("admin")
    browser.find_element(By.ID, "password").send_keys("not-the-password")
    browser.find_element(By.ID, "login-button").click()
    error = wait(
        browser,
        lambda d: d.find_element(By.ID, "login-error").text or None,
        "the login error",
    )
    assert "bad credentials" in error
    assert not browser.find_element(By.ID, "dashboard").is_displayed()
    browser.find_element(By.ID, "auth-id").clear()
    log_in(browser, family, "admin")

    seen = wait(
        browser,
        lambda d: found if len(found := states(d)) == 3 else None,
        "three brokers in the table",
    )
    assert seen == {"b1": "active", "b2": "active", "b3": "active"}
    assert "admin (admin) on b1" in browser.find_element(By.ID, "who-text").text

    def echo_ready(d: WebDriver) -> list[str] | None:
        # The traffic thread keeps asking: a refresh may catch the worker busy (ready 0), so
        # wait for one that shows it ready rather than judging the first one.
        rows = d.find_elements(By.CSS_SELECTOR, "#services tbody tr[data-service='echo']")
        cells = [c.text for c in rows[0].find_elements(By.TAG_NAME, "td")] if rows else []
        return cells if cells[:4] == ["echo", "b1", "1", "1"] else None

    # service, broker, workers, ready
    cells = wait(browser, echo_ready, "the echo service, its one worker ready")
    assert int(cells[6]) >= 5  # answered
    assert "config v1" in browser.find_element(By.ID, "config-summary").text
    wait(
        browser,
        lambda d: (
            any("b1" in r.text for r in d.find_elements(By.CSS_SELECTOR, "#clients tbody tr"))
            or None
        ),
        "the client in the clients table",
    )
    assert browser.execute_script("return document.cookie") == ""  # HttpOnly: not readable

    browser.find_element(By.CSS_SELECTOR, "button.disable[data-broker='b2']").click()
    wait(browser, lambda d: states(d).get("b2") == "disabled" or None, "b2 shown disabled")
    assert states(browser) == {"b1": "active", "b2": "disabled", "b3": "active"}
    assert "b2 is now disabled" in browser.find_element(By.ID, "message").text
    path = screenshot(browser, "management-page.png")
    assert path.stat().st_size > 10_000

    browser.find_element(By.CSS_SELECTOR, "button.enable[data-broker='b2']").click()
    wait(browser, lambda d: states(d).get("b2") == "active" or None, "b2 shown active again")

    # Reload config on b3 (a config source): its file did not change, and the page says so.
    browser.find_element(By.CSS_SELECTOR, "button.reload[data-broker='b3']").click()
    wait(
        browser,
        lambda d: "nothing to apply" in d.find_element(By.ID, "message").text or None,
        "the reload's answer on the page",
    )

    browser.find_element(By.ID, "logout").click()
    wait(browser, lambda d: d.find_element(By.ID, "login").is_displayed(), "the login form")
    log_in(browser, family, "viewer")
    wait(browser, lambda d: len(states(d)) == 3 or None, "the brokers, as the viewer")
    buttons = browser.find_elements(By.CSS_SELECTOR, "#brokers button")
    assert buttons == [], "a read user must see no change buttons"
    screenshot(browser, "management-page-viewer.png")


def test_the_page_states_its_content_security_policy(tmp_path: Path, browser: WebDriver) -> None:
    """An inline script injected into the page does not run (CSP script-src 'self')."""
    with running_family(tmp_path / "family", size=1) as family:
        browser.get(family["b1"].management + "/")
        wait(browser, lambda d: d.find_element(By.ID, "login").is_displayed(), "login")
        ran: Any = browser.execute_script(
            "const s = document.createElement('script');"
            "s.textContent = 'window.__injected = 1';"
            "document.body.appendChild(s);"
            "return window.__injected === 1;"
        )
        assert ran is False
