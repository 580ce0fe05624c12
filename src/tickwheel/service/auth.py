"""Bearer tokens for the service's listener, and what counts as loopback.

A service that listens beyond loopback needs credentials: every request then carries
``Authorization: Bearer <token>``, compared in constant time, and anything else is
answered 401 before its body is read. The token comes from a file the user names (never
from the command line, where ``ps`` shows it), and is never logged.
"""

from __future__ import annotations

import hmac
import ipaddress
import os
from pathlib import Path
from typing import Final

__all__ = ["MAX_TOKEN_BYTES", "TokenError", "authorized", "is_loopback", "read_token"]

#: The largest token file read.
MAX_TOKEN_BYTES: Final = 4096
_MIN_TOKEN_CHARS: Final = 16


class TokenError(ValueError):
    """A token file that cannot be used; the message says why (never the token)."""


def read_token(path: Path) -> str:
    """The token in ``path``: its one line, printable ASCII without spaces, at least 16
    characters. Read without following a symlink at its last component, and at most
    ``MAX_TOKEN_BYTES``."""
    try:
        fd = os.open(path, os.O_RDONLY | os.O_NOFOLLOW | os.O_CLOEXEC)
    except OSError as exc:
        raise TokenError(f"{path}: cannot be read: {exc.strerror or exc}") from None
    try:
        data = os.read(fd, MAX_TOKEN_BYTES + 1)
    finally:
        os.close(fd)
    if len(data) > MAX_TOKEN_BYTES:
        raise TokenError(f"{path}: over {MAX_TOKEN_BYTES} bytes: not a token file")
    try:
        token = data.decode("ascii").strip()
    except UnicodeDecodeError:
        raise TokenError(f"{path}: the token must be ASCII") from None
    if len(token) < _MIN_TOKEN_CHARS or not all(33 <= ord(c) < 127 for c in token):
        raise TokenError(f"{path}: the token must be one line of at least "
                         f"{_MIN_TOKEN_CHARS} printable characters, without spaces")
    return token


def authorized(header: str | None, token: str) -> bool:
    """Whether an ``Authorization`` header carries ``token`` as a bearer token, in time
    that does not depend on where a wrong one differs."""
    if header is None:
        return False
    scheme, _, given = header.partition(" ")
    if scheme.lower() != "bearer":
        return False
    return hmac.compare_digest(given.strip().encode("utf-8", "surrogateescape"),
                               token.encode("ascii"))


def is_loopback(host: str) -> bool:
    """Whether ``host`` (an address, or ``localhost``) is on this machine only."""
    if host.lower() in ("localhost", "localhost."):
        return True
    try:
        return ipaddress.ip_address(host.strip("[]")).is_loopback
    except ValueError:
        return False  # a host name: it may resolve anywhere
