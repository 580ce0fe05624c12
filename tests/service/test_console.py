"""The console in a real browser (Chromium through Playwright): it signs in with the
service's token, lists schedules, pauses one, looks up an operation, and asks nothing
of any other host."""

from __future__ import annotations

import os
import shutil
import signal
import subprocess
import sys
import time
from collections.abc import Iterator
from typing import Any

import pytest

pytest.importorskip("aiohttp")

from tests.service.conftest import service_url
from tickwheel.client import Client

playwright = pytest.importorskip("playwright.sync_api")

pytestmark = pytest.mark.slow

TOKEN = "console-test-token-0123456789"
CHROMIUM = shutil.which("chromium") or "/usr/bin/chromium"


def _browser_or_skip() -> str:
    if os.access(CHROMIUM, os.X_OK):
        return CHROMIUM
    if os.environ.get("TICKWHEEL_REQUIRE_BROWSER"):
        pytest.fail(f"no Chromium at {CHROMIUM}: apt-get install chromium")
    pytest.skip("no Chromium (apt-get install chromium)")


@pytest.fixture(scope="module")
def service(tmp_path_factory: pytest.TempPathFactory) -> Iterator[tuple[str, Client]]:
    """``tickwheel serve`` with a token, holding three schedules and an operation."""
    home = tmp_path_factory.mktemp("console")
    token_file = home / "token"
    token_file.write_text(TOKEN + "\n")
    child = subprocess.Popen([sys.executable, "-m", "tickwheel.cli", "serve", "--listen",
                              "127.0.0.1:0", "--token-file", str(token_file)], cwd=home,
                             stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True)
    try:
        url = service_url(child)
        with Client(url, token=TOKEN) as client:
            client.wait_ready(timeout_s=60)
            client.schedule("coupons-hourly", {"cron": "0 * * * *", "tz": "America/New_York"})
            client.schedule("earnings-nightly", {"cron": "30 2 * * *", "tz": "Asia/Tokyo"})
            client.schedule("heartbeat", {"every_ms": 60_000})
            last = client.schedule_at("order-17", int(time.time() * 1000) + 3_600_000)
            client.wait_applied(last.ts_ms, timeout_s=30)
            yield url, client
    finally:
        child.send_signal(signal.SIGTERM)
        child.communicate(timeout=120)


@pytest.fixture
def page(service: tuple[str, Client]) -> Iterator[Any]:
    """A signed-in page of the console, recording every request it makes."""
    url, _ = service
    with playwright.sync_playwright() as p:
        browser = p.chromium.launch(executable_path=_browser_or_skip())
        try:
            tab = browser.new_page()
            tab.requests = []
            tab.on("request", lambda request: tab.requests.append(request.url))
            tab.goto(url)
            tab.fill("input[name=token]", TOKEN)
            tab.click("button[type=submit]")
            tab.wait_for_selector("#schedules tbody tr")
            yield tab
        finally:
            browser.close()


def _row(page: Any, schedule_id: str) -> Any:
    return page.locator(f'#schedules tbody tr[data-schedule-id="{schedule_id}"]')


def test_the_console_lists_schedules_with_next_fires_in_their_zone_and_utc(
        page: Any, service: tuple[str, Client]) -> None:
    row = _row(page, "coupons-hourly")
    playwright.expect(row).to_contain_text("America/New_York")
    playwright.expect(row).to_contain_text("running")
    text = row.inner_text()
    assert " UTC" in text and (" EST" in text or " EDT" in text)
    assert page.locator("#schedules tbody tr").count() == 3
    playwright.expect(page.locator("#engine")).to_have_text("engine running")


def test_pause_pauses_the_schedule_and_a_reload_shows_it(page: Any) -> None:
    _row(page, "heartbeat").get_by_role("button", name="Pause").click()
    playwright.expect(page.locator("#action-note")).to_contain_text("pause heartbeat: taken")
    deadline = time.monotonic() + 30
    while True:
        page.reload()
        page.wait_for_selector("#schedules tbody tr")
        state = _row(page, "heartbeat").locator("td.state").inner_text()
        if state == "paused" or time.monotonic() > deadline:
            break
        time.sleep(0.5)
    assert state == "paused"
    playwright.expect(_row(page, "heartbeat").get_by_role("button", name="Resume")
                      ).to_be_visible()
    page.select_option("#state", "paused")
    page.click("#filter button[type=submit]")
    playwright.expect(page.locator("#schedules tbody tr")).to_have_count(1)


def test_an_operation_is_looked_up_by_its_id(page: Any) -> None:
    page.fill("#op-id", "order-17")
    page.click("#lookup button[type=submit]")
    playwright.expect(page.locator("#operation")).to_contain_text("pending")
    playwright.expect(page.locator("#pending-count")).to_have_text("1")
    playwright.expect(page.locator("#next-deadlines")).to_contain_text("order-17")


def test_the_page_asks_nothing_of_any_other_host(page: Any,
                                                  service: tuple[str, Client]) -> None:
    url, _ = service
    page.wait_for_timeout(500)  # its first round of reads has gone out
    assert page.requests, "the page made no request at all"
    assert all(request.startswith(url + "/") for request in page.requests), page.requests


def test_a_wrong_token_is_refused_and_nothing_is_shown(service: tuple[str, Client]) -> None:
    url, _ = service
    with playwright.sync_playwright() as p:
        browser = p.chromium.launch(executable_path=_browser_or_skip())
        try:
            tab = browser.new_page()
            answer = tab.goto(url)
            assert answer is not None and answer.status == 401
            tab.fill("input[name=token]", "not-the-token-at-all")
            tab.click("button[type=submit]")
            playwright.expect(tab.locator(".error")).to_contain_text(
                "not the token of this service")
            assert tab.locator("#schedules").count() == 0
        finally:
            browser.close()
