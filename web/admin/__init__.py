"""The admin console at /admin: pages behind a login, JSON under /admin/api."""

from web.admin.api import router as api_router
from web.admin.pages import router as pages_router

__all__ = ["api_router", "pages_router"]
