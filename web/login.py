"""Logging in through a form, once (the console with the admin token, the chat page with the API
key): throttled per client, then a signed, expiring, HttpOnly cookie keyed by that secret, so a
restart keeps logins and changing the secret logs everyone out."""

from __future__ import annotations

import hmac
from dataclasses import dataclass

from fastapi import Request, status
from fastapi.responses import HTMLResponse, RedirectResponse, Response

from web import signing
from web.limits import LoginThrottle, client_address
from web.templating import templates


@dataclass(frozen=True)
class LoginForm:
    heading: str
    action: str
    label: str
    wrong: str  # the error for a wrong secret
    cookie: str
    cookie_path: str
    purpose: str  # signed with the expiry: one form's cookie never passes for another's
    then: str  # where a login goes

    def page(
        self, request: Request, *, error: str = "", closed: bool = False, status_code: int = status.HTTP_200_OK
    ) -> HTMLResponse:
        context = {"form": self, "error": error, "closed": closed}
        return templates.TemplateResponse(request, "login.html", context, status_code=status_code)

    def issue(self, secret: str, ttl_s: int, now: float | None = None) -> str:
        return signing.issue(secret, self.purpose, ttl_s, now)

    def logged_in(self, cookie: str | None, secret: str, now: float | None = None) -> bool:
        return cookie is not None and signing.verify(cookie, secret, self.purpose, now)

    def submit(self, request: Request, throttle: LoginThrottle, given: str, secret: str, ttl_s: int) -> Response:
        client = client_address(request)
        wait_s = throttle.wait_s(client)
        if wait_s:
            page = self.page(
                request,
                error=f"Too many failed logins: try again in {wait_s} s.",
                status_code=status.HTTP_429_TOO_MANY_REQUESTS,
            )
            page.headers["Retry-After"] = str(wait_s)
            return page
        if not hmac.compare_digest(given.encode(), secret.encode()):
            throttle.failed(client)
            return self.page(request, error=self.wrong, status_code=status.HTTP_401_UNAUTHORIZED)
        throttle.succeeded(client)
        response = RedirectResponse(self.then, status_code=status.HTTP_303_SEE_OTHER)
        response.set_cookie(
            self.cookie,
            self.issue(secret, ttl_s),
            max_age=ttl_s,
            path=self.cookie_path,
            httponly=True,
            samesite="strict",
            secure=request.url.scheme == "https",
        )
        return response

    def logout(self) -> Response:
        response = RedirectResponse(self.action, status_code=status.HTTP_303_SEE_OTHER)
        response.delete_cookie(self.cookie, path=self.cookie_path)
        return response
