"""Console pages: the login form and the console itself (its figures come from web/admin/api.py)."""

from __future__ import annotations

from typing import Annotated

from fastapi import APIRouter, Cookie, Form, HTTPException, Request, status
from fastapi.responses import HTMLResponse, RedirectResponse, Response

from web.admin import auth
from web.deps import LoginThrottleDep, SettingsDep
from web.templating import templates

router = APIRouter(prefix="/admin", tags=["admin console"], include_in_schema=False)


@router.get("", response_class=HTMLResponse)
async def console(
    request: Request, settings: SettingsDep, clawdbot_admin: Annotated[str | None, Cookie()] = None
) -> Response:
    """The console once logged in. Otherwise the login page, which also says when the console is
    closed; API clients asking a closed console get its 403 as JSON."""
    token = settings.admin.token
    if token and auth.verify(clawdbot_admin, token):
        return templates.TemplateResponse(request, "admin.html")
    if not token and "text/html" not in request.headers.get("accept", ""):
        raise HTTPException(status.HTTP_403_FORBIDDEN, auth.CLOSED)
    return RedirectResponse("/admin/login", status_code=status.HTTP_303_SEE_OTHER)


@router.get("/login", response_class=HTMLResponse)
async def login_form(request: Request, settings: SettingsDep) -> HTMLResponse:
    if not settings.admin.token:
        return auth.LOGIN.page(request, closed=True, status_code=status.HTTP_403_FORBIDDEN)
    return auth.LOGIN.page(request)


@router.post("/login", response_class=HTMLResponse)
async def login(
    request: Request,
    token: auth.ConsoleToken,
    settings: SettingsDep,
    throttle: LoginThrottleDep,
    given: Annotated[str, Form(alias="token")],
) -> Response:
    return auth.LOGIN.submit(request, throttle, given, token, settings.admin.session_ttl_s)


@router.post("/logout")
async def logout() -> Response:
    return auth.LOGIN.logout()
