"""The console's tabs and the chat page at a phone's, two laptops' and a desktop's widths, in Debian's
Chromium driven by Playwright: nothing overflows the page or a table's card, and every column header
shows. Then the sessions search, the charts' units and tooltips, badges across a reload, the Stop
button and the favicon. Screenshots go to test-artifacts/layout-WIDTH-PAGE.png (git-ignored)."""

from __future__ import annotations

import re
import time
from collections.abc import Iterator
from contextlib import contextmanager
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any

import httpx
import pytest

from tests.app_process import AppProcess
from tests.web.browser_support import ADMIN_TOKEN, ARTIFACTS, log_in
from tests.web.web_support import running_app

if TYPE_CHECKING:
    from playwright.sync_api import Browser, Page, StorageState, ViewportSize

playwright_api = pytest.importorskip("playwright.sync_api")
expect = playwright_api.expect

pytestmark = pytest.mark.browser

MODEL = "builtin:tiny-qwen3"
# Chat-page replies stream for seconds at this length: long enough to scroll, and to be stopped
# before the server has finished. At 400 tokens a loaded CI machine's Chromium, lagging behind the
# stream, clicked Stop after the server had stored the whole turn.
LONG_REPLY_TOKENS = 1000
VIEWPORTS = {390: 844, 1024: 768, 1280: 800, 1920: 1080}  # width: height
# Each console tab, and what shows once its figures have arrived.
TABS = {
    "overview": "#chart-requests polyline",
    "cache": "#cache-entries tbody tr",
    "sessions": "#session-list tbody tr",
    "config": "#config-body table",
}
SEARCH_WORDS = ("aardvark", "zeppelin", "quokka")  # one API session each
ANSWER_BELOW_THE_LOG = """() => {
  const log = document.getElementById("log");
  return log.scrollTop + log.clientHeight < log.scrollHeight - 20;
}"""

# What does not fit: the page wider than the window, a card or the chat's log wider than itself (a
# table, a long word), a column header off-screen or cut without a title to say it whole, a date cut.
MISFITS = """() => {
  const root = document.documentElement, misfits = [];
  const cut = (element) => element.scrollWidth > element.clientWidth;
  if (cut(root)) misfits.push(`the page is ${root.scrollWidth} px wide in a ${root.clientWidth} px window`);
  for (const box of document.querySelectorAll(".card, .log")) {
    const name = box.id || box.querySelector("h2, figcaption")?.textContent || box.className;
    if (box.checkVisibility() && cut(box)) misfits.push(`${name} overflows`);
  }
  for (const table of document.querySelectorAll("table")) {
    if (!table.checkVisibility()) continue;
    for (const th of table.tHead?.rows[0].cells ?? []) {
      const box = th.getBoundingClientRect();
      if (box.left < 0 || box.right > root.clientWidth) misfits.push(`${table.id}: "${th.textContent}" is off-screen`);
      if (cut(th) && !th.title) misfits.push(`${table.id}: "${th.textContent}" is cut`);
    }
    for (const td of table.querySelectorAll("td.when")) {
      if (cut(td)) misfits.push(`${table.id}: "${td.textContent}" is cut`);
    }
  }
  return misfits;
}"""


@dataclass(frozen=True)
class Seeded:
    storage_state: StorageState  # the console's login; the chat page's conversation and its badges
    badges: list[str]  # under the chat page's one reply


@pytest.fixture(scope="module")
def app(tmp_path_factory: pytest.TempPathFactory) -> Iterator[AppProcess]:
    overrides: dict[str, dict[str, Any]] = {
        "admin": {"token": ADMIN_TOKEN, "sample_interval_s": 1},
        "generation": {"max_tokens": LONG_REPLY_TOKENS},
    }
    with running_app(tmp_path_factory, overrides) as running:
        yield running


@pytest.fixture(scope="module")
def seeded(app: AppProcess, browser: Browser) -> Iterator[Seeded]:
    """API sessions (and cache entries) with distinct words, and a chat-page conversation."""
    for word in SEARCH_WORDS:
        response = httpx.post(
            f"{app.base_url}/v1/chat/completions",
            json={"model": MODEL, "max_tokens": 2, "messages": [{"role": "user", "content": f"What is a {word}?"}]},
            timeout=60,
        )
        assert response.status_code == 200, response.text
    context = browser.new_context(viewport={"width": 1280, "height": 800})
    page = context.new_page()
    log_in(page, app.base_url, ADMIN_TOKEN)
    page.wait_for_url(f"{app.base_url}/admin")
    page.goto(app.base_url)
    page.fill("#text", "Tell me a long story about a lighthouse.")
    page.press("#text", "Enter")
    badges = page.locator(".msg.assistant .badge")
    expect(badges.first).to_have_text("cache: miss", timeout=30_000)
    yield Seeded(context.storage_state(), badges.all_inner_texts())
    context.close()


@contextmanager
def opened(browser: Browser, seeded: Seeded, width: int = 1280, height: int | None = None) -> Iterator[Page]:
    """A page of its own (a browser context) of this size, logged in and in the seeded conversation."""
    viewport: ViewportSize = {"width": width, "height": height or VIEWPORTS[width]}
    context = browser.new_context(viewport=viewport, storage_state=seeded.storage_state)
    try:
        yield context.new_page()
    finally:
        context.close()


def misfits(page: Page, width: int, name: str) -> list[str]:
    """What does not fit on the page shown, after a screenshot of it."""
    ARTIFACTS.mkdir(exist_ok=True)
    page.screenshot(path=ARTIFACTS / f"layout-{width}-{name}.png", full_page=True)
    return [f"{name}: {misfit}" for misfit in page.evaluate(MISFITS)]


@pytest.mark.parametrize("width", VIEWPORTS)
def test_every_page_fits_the_window(app: AppProcess, browser: Browser, seeded: Seeded, width: int) -> None:
    found = []
    with opened(browser, seeded, width) as page:
        for tab, loaded in TABS.items():
            page.goto(f"{app.base_url}/admin#{tab}")
            expect(page.locator(loaded).first).to_be_visible(timeout=10_000)
            if tab == "sessions":
                page.locator("#session-list tbody tr").filter(has_text="Web").click()
                expect(page.locator("#session-detail .turn")).to_have_count(2)
            found += misfits(page, width, tab)
        page.goto(app.base_url)
        expect(page.locator(".msg.assistant .badges")).to_be_visible()
        found += misfits(page, width, "chat")
    assert found == []


def test_the_session_search_finds_a_chat_by_a_word_of_its_messages(
    app: AppProcess, browser: Browser, seeded: Seeded
) -> None:
    with opened(browser, seeded) as page:
        page.goto(f"{app.base_url}/admin#overview")
        expect(page.locator('.figure[data-figure="Sessions"] .note')).to_contain_text(f"API {len(SEARCH_WORDS)}")

        page.goto(f"{app.base_url}/admin#sessions")
        rows, shown = page.locator("#session-list tbody tr"), page.locator("#sessions-range")
        expect(rows).to_have_count(len(SEARCH_WORDS) + 1)
        page.fill("#session-query", "ZEPPELIN")
        expect(rows).to_have_count(1)
        expect(shown).to_have_text("1–1 of 1")
        rows.click()
        expect(page.locator("#session-detail .turn.user")).to_have_text(re.compile("What is a zeppelin"))

        page.fill("#session-query", "")
        page.select_option("#session-channel", "api")
        expect(rows.locator("td:nth-child(2)")).to_have_text(["API"] * len(SEARCH_WORDS))
        expect(shown).to_have_text(f"1–{len(SEARCH_WORDS)} of {len(SEARCH_WORDS)}")
        expect(page.locator("#sessions-next")).to_be_disabled()
        page.select_option("#session-state", "closed")
        expect(rows).to_have_count(0)
        expect(shown).to_have_text("none of 0")


def test_charts_name_their_units_and_show_the_nearest_point(app: AppProcess, browser: Browser, seeded: Seeded) -> None:
    with opened(browser, seeded) as page:
        page.goto(f"{app.base_url}/admin#overview")
        expect(page.locator("#chart-ttft polyline").first).to_be_visible()
        units = {"requests": "req/s", "tokens": "tokens/s", "ttft": "ms", "kv": "%"}
        for name, unit in units.items():
            expect(page.locator(f"#chart-{name} text.unit")).to_have_text(unit)

        chart, tooltip = page.locator("#chart-ttft svg"), page.locator("#chart-ttft .tooltip")
        box = chart.bounding_box()
        assert box is not None
        page.mouse.move(box["x"] + box["width"] * 0.9, box["y"] + box["height"] / 2)
        expect(tooltip).to_be_visible()
        expect(tooltip).to_contain_text(re.compile(r"\d+:\d\d:\d\d.*p50: \d+ ms.*p99: \d+ ms", re.DOTALL))
        updated = page.locator("#updated").inner_text()
        expect(page.locator("#updated")).not_to_have_text(updated)  # a refresh redrew the chart
        expect(tooltip).to_be_visible()
        page.mouse.move(0, 0)
        expect(tooltip).to_be_hidden()

        page.goto(f"{app.base_url}/admin#cache")
        expect(page.locator("#chart-hits text.unit")).to_have_text("%")
        expect(page.locator("#chart-entries text.unit")).to_have_text("entries")


def test_badges_survive_a_reload(app: AppProcess, browser: Browser, seeded: Seeded) -> None:
    with opened(browser, seeded) as page:
        page.goto(app.base_url)
        expect(page.locator("#model")).to_have_text(MODEL)
        expect(page.locator(".msg.assistant .badge")).to_have_text(seeded.badges)


def test_stop_ends_a_streaming_answer_and_its_question_stays_in_view(
    app: AppProcess, browser: Browser, seeded: Seeded
) -> None:
    with opened(browser, seeded, 390, 560) as page:
        page.goto(app.base_url)
        expect(page.locator("#text")).to_be_enabled()  # the history is shown
        page.fill("#text", "Now write the longest story you can.")
        page.press("#text", "Enter")
        # The answer grows past the log's bottom, which does not follow it: the question stays in view.
        page.wait_for_function(ANSWER_BELOW_THE_LOG)
        log, question = page.locator("#log").bounding_box(), page.locator(".msg.user").last.bounding_box()
        assert log is not None and question is not None
        assert log["y"] <= question["y"] < log["y"] + log["height"] / 2

        page.click("#stop")
        reply = page.locator(".msg.assistant").last
        expect(reply.locator(".badge")).to_have_text(["stopped: not kept"])
        page.screenshot(path=ARTIFACTS / "layout-390-chat-stopped.png")
        expect(page.locator("#stop")).to_be_hidden()
        expect(page.locator("#send")).to_be_visible()
        until_engine_idle(app)

        page.reload()
        expect(page.locator("#text")).to_be_enabled()
        expect(page.locator(".msg.user")).to_have_count(1)  # the seeded question alone: nothing was stored


def until_engine_idle(app: AppProcess) -> None:
    """Until the engine runs nothing (an abandoned answer goes on to max_tokens); at most 5 s."""
    deadline = time.monotonic() + 5
    while 'clawdbot_engine_requests{state="running"} 0.0' not in httpx.get(f"{app.base_url}/metrics").text:
        assert time.monotonic() < deadline, "the stopped answer is still being generated"
        time.sleep(0.05)


def test_the_favicon_answers(app: AppProcess) -> None:
    asked = httpx.get(f"{app.base_url}/favicon.ico")
    assert (asked.status_code, asked.headers["location"]) == (307, "/static/favicon.svg")
    icon = httpx.get(f"{app.base_url}/favicon.ico", follow_redirects=True)
    assert icon.status_code == 200
    assert icon.headers["content-type"].startswith("image/svg+xml")
    assert '<link rel="icon" href="/static/favicon.svg">' in httpx.get(app.base_url).text
