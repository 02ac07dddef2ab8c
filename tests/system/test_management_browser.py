"""The management page in a real headless Chromium (Debian ``chromium`` + ``chromium-driver``,
driven by Selenium): log in, see the family, disable a broker from the page, see it change; read
the Trends panel's numbers and compare them with the summary the real trend job made.

The screenshots are test artifacts: ``test-artifacts/`` at the top of the tree (or
``$SCALE0_TEST_ARTIFACTS``). tools/test installs chromium and chromium-driver when missing; a
machine without them fails here, saying so, rather than skipping.
"""

from __future__ import annotations

import contextlib
import json
import os
import shutil
import threading
from collections.abc import Callable, Iterator
from datetime import UTC, datetime
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
from scale0.testing import Family, running_family, wait_until
from tests.conftest import SPARK_TIMEOUT_S

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


def click(driver: WebDriver, selector: str, what: str) -> None:
    """Click a button of a table the page redraws at every refresh: found and clicked in one
    try, and tried again when the table was redrawn between the two (a stale element is not
    clicked, so nothing is clicked twice)."""

    def clicked(d: WebDriver) -> bool:
        d.find_element(By.CSS_SELECTOR, selector).click()
        return True

    wait(driver, clicked, what)


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


def log_in(driver: WebDriver, family: Family, user: str, broker: str = "b1") -> None:
    driver.get(family[broker].management + "/")
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

    click(browser, "button.disable[data-broker='b2']", "b2's disable button")
    seen = wait(
        browser,
        lambda d: found if (found := states(d)).get("b2") == "disabled" else None,
        "b2 shown disabled",
    )
    assert seen == {"b1": "active", "b2": "disabled", "b3": "active"}
    assert "b2 is now disabled" in browser.find_element(By.ID, "message").text
    path = screenshot(browser, "management-page.png")
    assert path.stat().st_size > 10_000

    click(browser, "button.enable[data-broker='b2']", "b2's enable button")
    wait(browser, lambda d: states(d).get("b2") == "active" or None, "b2 shown active again")

    # Reload config on b3 (a config source): its file did not change, and the page says so.
    click(browser, "button.reload[data-broker='b3']", "b3's reload button")
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


# ---- the Trends panel ---------------------------------------------------------------------------


def cells_of(row: Any) -> list[str]:
    return [c.text for c in row.find_elements(By.TAG_NAME, "td")]


def shown_percent(text: str, share: float | None) -> None:
    """The page shows shares as percentages with two decimals, or "unknown" for null."""
    if share is None:
        assert text == "unknown"
    else:
        assert text.endswith(" %"), text
        assert abs(float(text.removesuffix(" %")) - share * 100) <= 0.005 + 1e-9, (text, share)


def shown_ms(text: str, value: float | None) -> None:
    if value is None:
        assert text == "\u2013"  # an en dash
    else:
        assert text.endswith(" ms"), text
        assert abs(float(text.removesuffix(" ms")) - value) <= 0.005 + 1e-9, (text, value)


def utc_minute(ms: int) -> str:
    return datetime.fromtimestamp(ms / 1000, UTC).strftime("%Y-%m-%d %H:%M") + " UTC"


@pytest.mark.timeout(SPARK_TIMEOUT_S)
def test_the_trends_panel_shows_the_summary_the_job_made(
    tmp_path: Path, browser: WebDriver, trend_summary: Path
) -> None:
    with running_family(
        tmp_path / "family",
        size=2,
        management_overrides=[{"trend_summary": "../trend/summary.json"}, {}],
    ) as family:
        summary_path = family["b1"].directory.parent / "trend" / "summary.json"
        summary_path.parent.mkdir()

        # Before the job ran: the panel says how to make the summary, with the exact command.
        log_in(browser, family, "viewer")
        command = wait(
            browser,
            lambda d: d.find_element(By.ID, "trends-command").text or None,
            "the command that makes the summary",
        )
        assert command == (
            f"scale0-trend {family['b1'].directory / 'events'} --out {summary_path.parent}"
        )
        assert "does not exist" in browser.find_element(By.ID, "trends-note").text
        assert not browser.find_element(By.ID, "trends-body").is_displayed()

        # The job's summary appears; the page reads it again when it loads.
        shutil.copyfile(trend_summary, summary_path)
        summary = json.loads(trend_summary.read_text())
        browser.refresh()
        wait(browser, lambda d: d.find_element(By.ID, "trends-body").is_displayed(), "the panel")
        text = {
            name: browser.find_element(By.ID, f"trends-{name}").text
            for name in ("from", "to", "requests", "error-rate", "made", "source", "file")
        }
        assert text["from"] == utc_minute(summary["window"]["start_ms"])
        assert text["to"] == utc_minute(summary["window"]["end_ms"])
        assert text["requests"] == str(summary["totals"]["requests"])
        shown_percent(text["error-rate"], summary["totals"]["error_rate"])
        assert (text["made"], text["source"]) == (summary["generated_at"], summary["source"])
        assert text["file"] == str(summary_path)
        assert browser.find_element(By.ID, "trends-note").text == ""

        rows = browser.find_elements(By.CSS_SELECTOR, "#trend-services tbody tr")
        assert [r.get_attribute("data-service") for r in rows] == [
            s["service"] for s in summary["services"]
        ]
        for row, service in zip(rows, summary["services"], strict=True):
            cells = cells_of(row)
            assert cells[:3] == [
                service["service"],
                str(service["requests"]),
                str(service["errors"]),
            ]
            shown_percent(cells[3], service["error_rate"])
            for cell, key in zip(cells[4:], ("p50_ms", "p95_ms", "p99_ms"), strict=True):
                shown_ms(cell, service[key])

        rows = browser.find_elements(By.CSS_SELECTOR, "#trend-brokers tbody tr")
        assert len(rows) == len(summary["brokers"]) >= 3
        for row, broker in zip(rows, summary["brokers"], strict=True):
            cells = cells_of(row)
            assert cells[0] == broker["broker"] and cells[3] == str(broker["requests"])
            shown_percent(cells[1], broker["availability"])
            shown_percent(cells[4], broker["load_share"])
        # The generated family's last broker was down for a while: it shows under 100 %.
        assert any(float(cells_of(r)[1].rstrip(" %")) < 100 for r in rows)

        rows = browser.find_elements(By.CSS_SELECTOR, "#trend-workers tbody tr")
        assert len(rows) == len(summary["workers"]) > 0
        for row, worker in zip(rows, summary["workers"], strict=True):
            cells = cells_of(row)
            assert cells[:2] == [worker["broker"], worker["worker"]]
            assert cells[4] == str(worker["requests"])
            shown_percent(cells[2], worker["availability"])

        rows = browser.find_elements(By.CSS_SELECTOR, "#trend-config tbody tr")
        assert len(rows) == len(summary["config_changes"]) > 0
        for row, change in zip(rows, summary["config_changes"], strict=True):
            cells = cells_of(row)
            assert cells[1:4] == [
                change["broker"],
                change["outcome"],
                f"v{change['config_version']}",
            ]
            assert cells[0] == change["at"].replace("T", " ").removesuffix("Z")
            assert ("refused" in (row.get_attribute("class") or "")) is (
                change["outcome"] == "refused"
            )
        browser.execute_script("document.getElementById('trends').scrollIntoView()")
        screenshot(browser, "management-trends.png")

        # A corrupt file: the panel names the file and the problem instead of numbers.
        summary_path.write_text('{"schema_version": 1, "generated_at": ')
        browser.refresh()
        note = wait(
            browser,
            lambda d: d.find_element(By.ID, "trends-note").text or None,
            "the error about the corrupt summary",
        )
        assert f"{summary_path}: not valid JSON" in note
        assert not browser.find_element(By.ID, "trends-body").is_displayed()

        # A broker without management.trend_summary says so.
        log_in(browser, family, "viewer", broker="b2")
        note = wait(
            browser,
            lambda d: d.find_element(By.ID, "trends-note").text or None,
            "the note that no summary is configured",
        )
        assert note.startswith("No trend summary is configured")
        assert "management.trend_summary" in note
