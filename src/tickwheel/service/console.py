"""The console's page, its assets and its sign-in, served by the service itself.

The page (``GET /``) and its script and style (``GET /console/...``) ship inside the
package: nothing is fetched from elsewhere, and a Content-Security-Policy lets the page
load and call this origin only. Where the service has a token, a browser signs in once
(``POST /console/login``, the token in a form) and holds a cookie from then on: the
cookie carries a value derived from the token, not the token, and is ``HttpOnly`` and
``SameSite=Strict``, so no other site's page can send requests with it.
"""

from __future__ import annotations

import hashlib
import hmac
import html
import importlib.resources
from functools import cache
from typing import Final

__all__ = ["ASSETS", "CONTENT_SECURITY_POLICY", "MAX_LOGIN_BYTES", "TOKEN_COOKIE",
           "asset", "cookie_authorized", "cookie_value", "login_page"]

#: The console's files besides its page, with their content types.
ASSETS: Final = {"console.js": "text/javascript; charset=utf-8",
                 "console.css": "text/css; charset=utf-8"}
CONTENT_SECURITY_POLICY: Final = (
    "default-src 'none'; script-src 'self'; style-src 'self'; connect-src 'self'; "
    "img-src 'self'; form-action 'self'; frame-ancestors 'none'; base-uri 'none'")
TOKEN_COOKIE: Final = "tickwheel_console"
#: The largest sign-in form read.
MAX_LOGIN_BYTES: Final = 4096


@cache
def asset(name: str) -> bytes:
    """A file of the console (``index.html``, ``login.html`` or one of :data:`ASSETS`)."""
    return (importlib.resources.files("tickwheel.service") / "static" / name).read_bytes()


def login_page(error: str = "") -> str:
    """The sign-in page, with ``error`` said (escaped) where there is one."""
    return asset("login.html").decode().replace("{error}", html.escape(error))


def cookie_value(token: str) -> str:
    """What the console's cookie holds for ``token``: derived, so that the token itself
    never sits in a browser's cookie store."""
    return hmac.new(token.encode("ascii"), b"tickwheel console", hashlib.sha256).hexdigest()


def cookie_authorized(value: str | None, token: str) -> bool:
    """Whether a console cookie is the one :func:`cookie_value` gives ``token``, in time
    that does not depend on where a wrong one differs."""
    if value is None:
        return False
    return hmac.compare_digest(value.encode("utf-8", "surrogateescape"),
                               cookie_value(token).encode())
