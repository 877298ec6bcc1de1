"""The chat page and the console in Debian's Chromium, driven by Playwright. Screenshots of each
console page go to test-artifacts/ (git-ignored)."""

from __future__ import annotations

import time
from collections.abc import Callable, Iterator
from typing import TYPE_CHECKING

import pytest

from tests.app_process import AppProcess
from tests.web.browser_support import ADMIN_TOKEN, ARTIFACTS, log_in
from tests.web.web_support import running_app

if TYPE_CHECKING:
    from playwright.sync_api import Browser, Page, Route

playwright_api = pytest.importorskip("playwright.sync_api")

pytestmark = pytest.mark.browser


@pytest.fixture(scope="module")
def app(tmp_path_factory: pytest.TempPathFactory) -> Iterator[AppProcess]:
    overrides = {"admin": {"token": ADMIN_TOKEN, "sample_interval_s": 1}}
    with running_app(tmp_path_factory, overrides) as running:
        yield running


@pytest.fixture
def page(browser: Browser) -> Iterator[Page]:
    context = browser.new_context(viewport={"width": 1360, "height": 900})
    yield context.new_page()
    context.close()


def figure(page: Page, label: str) -> int:
    return int(page.locator(f'.figure[data-figure="{label}"] .value').inner_text().replace(",", ""))


def test_wrong_token_is_refused(app: AppProcess, page: Page) -> None:
    log_in(page, app.base_url, "not-the-token")
    playwright_api.expect(page.get_by_role("alert")).to_have_text("Wrong token.")
    assert page.url.endswith("/admin/login")
    page.goto(f"{app.base_url}/admin")
    assert page.url.endswith("/admin/login")  # no session was granted
    assert page.request.get(f"{app.base_url}/admin/api/stats").status == 401


def test_a_new_session_asked_for_while_the_history_loads_keeps_the_composer_waiting(
    app: AppProcess, page: Page
) -> None:
    page.goto(app.base_url)
    page.fill("#text", "Remember this question")
    page.press("#text", "Enter")
    playwright_api.expect(page.locator(".msg.assistant .badge").first).to_be_visible()
    held: dict[str, Route] = {}  # by the last part of its path, until the test lets it through
    page.route(
        "**/chat/api/{history,reset}", lambda route: held.__setitem__(route.request.url.rsplit("/", 1)[1], route)
    )
    page.reload()
    wait_until(page, lambda: "history" in held)
    page.click("#new-session")
    held.pop("history").continue_()
    playwright_api.expect(page.locator(".msg")).to_have_count(2)  # the history is shown...
    playwright_api.expect(page.locator("#text")).to_be_disabled()  # ...and the reset still awaited
    wait_until(page, lambda: "reset" in held)
    held.pop("reset").continue_()
    playwright_api.expect(page.locator(".msg")).to_have_count(0)
    playwright_api.expect(page.locator("#text")).to_be_enabled()


def wait_until(page: Page, condition: Callable[[], bool], timeout_s: float = 10.0) -> None:
    """Until `condition` holds, letting the page's events (route handlers) run meanwhile."""
    deadline = time.monotonic() + timeout_s
    while not condition():
        assert time.monotonic() < deadline, "timed out"
        page.wait_for_timeout(20)


def test_chat_twice_then_console_shows_the_hit(app: AppProcess, browser: Browser) -> None:
    ARTIFACTS.mkdir(exist_ok=True)
    context = browser.new_context(viewport={"width": 1360, "height": 900})
    console, chat = context.new_page(), context.new_page()
    log_in(console, app.base_url, ADMIN_TOKEN)
    console.goto(f"{app.base_url}/admin#cache")
    playwright_api.expect(console.locator('.figure[data-figure="Exact hits"]')).to_be_visible()
    # the model, its size and where it runs (the demo model: 20M parameters, most of them its embeddings)
    playwright_api.expect(console.locator("#model")).to_have_text("builtin:tiny-qwen3 (20M parameters) on cpu")
    hits_before = figure(console, "Exact hits")

    chat.goto(app.base_url)
    # A repeat within one conversation has another context, so it is generated again; the same
    # first question in a new session is the cache's to answer.
    question = "What is the capital of France?"
    for expected_level in ("miss", "exact"):
        chat.click("#new-session")
        playwright_api.expect(chat.locator(".msg")).to_have_count(0)
        chat.fill("#text", question)
        chat.press("#text", "Enter")
        playwright_api.expect(chat.locator(".msg.assistant .badge").first).to_have_text(f"cache: {expected_level}")
        app.until_cached(question, ADMIN_TOKEN)  # the answer is cached after the turn
    chat.fill("#text", "And its population?")
    chat.press("#text", "Enter")
    playwright_api.expect(chat.locator(".msg.assistant .badge").filter(has_text="cache:")).to_have_count(2)
    chat.screenshot(path=ARTIFACTS / "chat.png")

    chat.reload()  # the session is kept across reloads
    playwright_api.expect(chat.locator(".msg.user")).to_have_count(2)

    playwright_api.expect(console.locator('.figure[data-figure="Exact hits"] .value')).to_have_text(
        str(hits_before + 1), timeout=10_000
    )
    playwright_api.expect(console.locator("#top-entries tbody tr").first).to_contain_text(question)
    playwright_api.expect(console.locator("#chart-hits polyline").first).to_be_visible(timeout=10_000)
    console.screenshot(path=ARTIFACTS / "console-cache.png", full_page=True)

    console.goto(f"{app.base_url}/admin#overview")
    playwright_api.expect(console.locator("#chart-requests polyline")).to_be_visible(timeout=10_000)
    console.screenshot(path=ARTIFACTS / "console-overview.png", full_page=True)

    console.goto(f"{app.base_url}/admin#sessions")
    playwright_api.expect(console.locator("#assistant-counts")).to_have_text(
        "Assistant: 0 memories of 0 people · 0 reminders · 0 scheduled prompts"
    )
    console.locator("#session-list tbody tr").filter(has_text="web:").first.click()
    playwright_api.expect(console.locator("#session-detail .turn")).to_have_count(4)
    console.screenshot(path=ARTIFACTS / "console-sessions.png", full_page=True)

    console.goto(f"{app.base_url}/admin#config")
    playwright_api.expect(console.locator("#config-body")).to_contain_text("max_queued_requests")
    assert ADMIN_TOKEN not in console.content()
    console.screenshot(path=ARTIFACTS / "console-config.png", full_page=True)

    chat.click("#new-session")
    playwright_api.expect(chat.locator(".msg")).to_have_count(0)
    chat.reload()
    playwright_api.expect(chat.locator("#text")).to_be_visible()
    assert chat.locator(".msg").count() == 0
    context.close()
