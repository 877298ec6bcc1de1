"""What the browser tests share: Debian's Chromium driven by Playwright (never `playwright
install`), the console's login, where screenshots go (test-artifacts/, git-ignored)."""

from __future__ import annotations

from collections.abc import Iterator
from pathlib import Path
from typing import TYPE_CHECKING

import pytest

from tests.support import ROOT

if TYPE_CHECKING:
    from playwright.sync_api import Browser, Page

ADMIN_TOKEN = "console-test-token"
CHROMIUM = Path("/usr/bin/chromium")
ARTIFACTS = ROOT / "test-artifacts"
CHROMIUM_ARGS = [
    "--headless",
    "--no-sandbox",
    "--disable-gpu",
    "--disable-background-networking",
    "--disable-component-update",
    "--disable-sync",
    "--no-first-run",
]


@pytest.fixture(scope="module")
def browser() -> Iterator[Browser]:
    if not CHROMIUM.exists():
        pytest.skip("Chromium is not installed (apt-get install chromium)")
    from playwright.sync_api import sync_playwright  # a dev dependency: only where a browser test runs

    with sync_playwright() as playwright:
        browser = playwright.chromium.launch(executable_path=str(CHROMIUM), args=CHROMIUM_ARGS)
        yield browser
        browser.close()


def log_in(page: Page, base_url: str, token: str) -> None:
    page.goto(f"{base_url}/admin")
    page.fill("#token", token)
    page.click("button[type=submit]")
