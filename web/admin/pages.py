"""Console pages: the login form and the console itself (its figures come from web/admin/api.py)."""

from __future__ import annotations

from typing import Annotated

from fastapi import APIRouter, Depends, Form, Request, status
from fastapi.responses import HTMLResponse, RedirectResponse, Response

from web.admin import auth
from web.deps import SettingsDep
from web.templating import templates

router = APIRouter(prefix="/admin", tags=["admin console"], include_in_schema=False)


@router.get("", response_class=HTMLResponse)
async def console(request: Request, logged_in: Annotated[bool, Depends(auth.is_logged_in)]) -> Response:
    if not logged_in:
        return RedirectResponse("/admin/login", status_code=status.HTTP_303_SEE_OTHER)
    return templates.TemplateResponse(request, "admin.html")


@router.get("/login", response_class=HTMLResponse)
async def login_form(request: Request, settings: SettingsDep) -> HTMLResponse:
    closed = not settings.admin.token
    return templates.TemplateResponse(
        request,
        "login.html",
        {"closed": closed},
        status_code=status.HTTP_403_FORBIDDEN if closed else status.HTTP_200_OK,
    )


@router.post("/login", response_class=HTMLResponse)
async def login(
    request: Request, token: auth.ConsoleToken, settings: SettingsDep, given: Annotated[str, Form(alias="token")]
) -> Response:
    if not auth.token_matches(given, token):
        return templates.TemplateResponse(
            request, "login.html", {"error": "Wrong token."}, status_code=status.HTTP_401_UNAUTHORIZED
        )
    ttl_s = settings.admin.session_ttl_s
    response = RedirectResponse("/admin", status_code=status.HTTP_303_SEE_OTHER)
    response.set_cookie(
        auth.COOKIE,
        auth.issue(token, ttl_s),
        max_age=ttl_s,
        path=auth.COOKIE_PATH,
        httponly=True,
        samesite="strict",
        secure=request.url.scheme == "https",
    )
    return response


@router.post("/logout")
async def logout() -> Response:
    response = RedirectResponse("/admin/login", status_code=status.HTTP_303_SEE_OTHER)
    response.delete_cookie(auth.COOKIE, path=auth.COOKIE_PATH)
    return response
