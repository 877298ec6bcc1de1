from tests.web.browser_support import browser  # noqa: F401  (a fixture of the browser tests)
