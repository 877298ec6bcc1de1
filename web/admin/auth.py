"""Console login: the admin token, once, through a form (web/login.py); then a signed, expiring
session cookie: nothing is stored server-side, a restart keeps logins, and changing the token
logs everyone out."""

from __future__ import annotations

from typing import Annotated

from fastapi import Cookie, Depends, HTTPException, status

from web.deps import SettingsDep
from web.login import LoginForm

COOKIE = "clawdbot_admin"
LOGIN = LoginForm(
    heading="Clawdbot console",
    action="/admin/login",
    label="Admin token",
    wrong="Wrong token.",
    cookie=COOKIE,
    cookie_path="/admin",
    purpose="clawdbot-admin",  # what the cookie was signed with before web/login.py: logins stay valid
    then="/admin",
)
CLOSED = "The console is closed: set admin.token in config.yaml or CLAWDBOT_ADMIN_TOKEN."
issue = LOGIN.issue
verify = LOGIN.logged_in


async def console_token(settings: SettingsDep) -> str:
    """The admin token; 403 while none is configured (the console is closed)."""
    if not settings.admin.token:
        raise HTTPException(status.HTTP_403_FORBIDDEN, CLOSED)
    return settings.admin.token


ConsoleToken = Annotated[str, Depends(console_token)]


async def is_logged_in(token: ConsoleToken, clawdbot_admin: Annotated[str | None, Cookie()] = None) -> bool:
    return LOGIN.logged_in(clawdbot_admin, token)


async def require_admin(logged_in: Annotated[bool, Depends(is_logged_in)]) -> None:
    if not logged_in:
        raise HTTPException(status.HTTP_401_UNAUTHORIZED, "Log in at /admin/login.")
