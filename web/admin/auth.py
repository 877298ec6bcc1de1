"""Console login: the admin token, once, through a form; then a signed, expiring session cookie.

The cookie is `<expiry>.<HMAC of the expiry keyed by the token>`: nothing is stored server-side,
a restart keeps logins, and changing the token logs everyone out."""

from __future__ import annotations

import hashlib
import hmac
import time
from typing import Annotated

from fastapi import Cookie, Depends, HTTPException, status

from web.deps import SettingsDep

COOKIE = "clawdbot_admin"
COOKIE_PATH = "/admin"


def issue(token: str, ttl_s: int, now: float | None = None) -> str:
    expires = int((time.time() if now is None else now) + ttl_s)
    return f"{expires}.{_signature(token, expires)}"


def verify(cookie: str, token: str, now: float | None = None) -> bool:
    expires, _, signature = cookie.partition(".")
    if not expires.isdigit() or int(expires) < (time.time() if now is None else now):
        return False
    return hmac.compare_digest(signature, _signature(token, int(expires)))


def token_matches(given: str, token: str) -> bool:
    return hmac.compare_digest(given.encode(), token.encode())


def _signature(token: str, expires: int) -> str:
    return hmac.new(token.encode(), f"clawdbot-admin:{expires}".encode(), hashlib.sha256).hexdigest()


def console_token(settings: SettingsDep) -> str:
    """The admin token; 403 while none is configured (the console is closed)."""
    if not settings.admin.token:
        raise HTTPException(
            status.HTTP_403_FORBIDDEN, "The console is closed: set admin.token in config.yaml or CLAWDBOT_ADMIN_TOKEN."
        )
    return settings.admin.token


ConsoleToken = Annotated[str, Depends(console_token)]


def is_logged_in(token: ConsoleToken, clawdbot_admin: Annotated[str | None, Cookie()] = None) -> bool:
    return clawdbot_admin is not None and verify(clawdbot_admin, token)


def require_admin(logged_in: Annotated[bool, Depends(is_logged_in)]) -> None:
    if not logged_in:
        raise HTTPException(status.HTTP_401_UNAUTHORIZED, "Log in at /admin/login.")
