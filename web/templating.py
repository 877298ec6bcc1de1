"""The chat page's and the console's templates (web/templates/) and assets (web/static/)."""

from pathlib import Path

from fastapi import APIRouter, status
from fastapi.responses import RedirectResponse
from fastapi.templating import Jinja2Templates

WEB_DIR = Path(__file__).resolve().parent
STATIC_DIR = WEB_DIR / "static"
templates = Jinja2Templates(directory=WEB_DIR / "templates")
# the console's pages need it as much as the chat page's, which may be off
assets_router = APIRouter(include_in_schema=False)


@assets_router.get("/favicon.ico")
async def favicon() -> RedirectResponse:
    """Browsers ask for /favicon.ico whatever the page links."""
    return RedirectResponse("/static/favicon.svg", status_code=status.HTTP_307_TEMPORARY_REDIRECT)
