"""Signed cookie values: `<value>.<HMAC-SHA256 of "<purpose>:<value>">`, keyed by a secret.

Nothing is stored server-side. The purpose is signed with the value, so a value signed for one
use (a console login) never passes for another (a chat login), even under the same secret."""

from __future__ import annotations

import functools
import hashlib
import hmac
import os
import secrets
import time
from pathlib import Path

# Seconds since 1970 have 10 digits until the year 2286: a longer expiry is forged, and bounding it
# keeps int() far from Python's 4,300-digit limit (a 5,000-digit expiry was a 500).
MAX_EXPIRY_DIGITS = 12
MIN_SECRET_CHARS = 32


def sign(value: str, secret: str, purpose: str) -> str:
    return f"{value}.{_mac(value, secret, purpose)}"


def unsign(signed: str, secret: str, purpose: str) -> str | None:
    """The value, or None when the signature is missing or wrong."""
    value, dot, mac = signed.rpartition(".")
    if not dot or not hmac.compare_digest(mac.encode(), _mac(value, secret, purpose).encode()):
        return None
    return value


def issue(secret: str, purpose: str, ttl_s: int, now: float | None = None) -> str:
    """An expiring login: its value is the expiry, in whole seconds since 1970."""
    return sign(str(int((time.time() if now is None else now) + ttl_s)), secret, purpose)


def verify(signed: str, secret: str, purpose: str, now: float | None = None) -> bool:
    expires = unsign(signed, secret, purpose)
    if expires is None or not _is_expiry(expires):
        return False
    return int(expires) >= (time.time() if now is None else now)


def _is_expiry(text: str) -> bool:
    # str.isdigit() also accepts digits int() refuses ("²") and other scripts' digits int() takes.
    return 0 < len(text) <= MAX_EXPIRY_DIGITS and text.isascii() and text.isdigit()


def _mac(value: str, secret: str, purpose: str) -> str:
    return hmac.new(secret.encode(), f"{purpose}:{value}".encode(), hashlib.sha256).hexdigest()


@functools.cache
def stored_secret(path: Path) -> str:
    """A random secret kept in `path` (created once, readable by its owner only), so that what it
    signed stays valid across restarts. Two processes starting at once agree on one: the file
    appears whole (a hard link of a finished file) or not at all."""
    if not path.exists():
        path.parent.mkdir(parents=True, exist_ok=True)
        draft = path.with_name(f".{path.name}.{os.getpid()}")
        fd = os.open(draft, os.O_WRONLY | os.O_CREAT | os.O_TRUNC, 0o600)
        with os.fdopen(fd, "w", encoding="ascii") as file:
            file.write(secrets.token_hex(32))
        try:
            os.link(draft, path)
        except FileExistsError:
            pass  # another process was first: its secret is the one
        finally:
            draft.unlink()
    secret = path.read_text(encoding="ascii").strip()
    if len(secret) < MIN_SECRET_CHARS:
        raise ValueError(f"{path} holds no usable secret: delete it and it is created again.")
    return secret
