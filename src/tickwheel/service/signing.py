"""Signed deliveries, by the Standard Webhooks specification (standardwebhooks.com).

A request carries ``webhook-id`` (the same on every retry of it), ``webhook-timestamp``
(Unix seconds) and ``webhook-signature``: ``v1,`` and the base64 HMAC-SHA256 of
``<id>.<timestamp>.<body>`` under the secret. A secret is written ``whsec_`` and the
base64 of its bytes, as the specification's libraries take it, so a receiver verifies
with the ``standardwebhooks`` package or any implementation of the specification.
"""

from __future__ import annotations

import base64
import binascii
import hashlib
import hmac
from typing import Final

__all__ = ["SECRET_PREFIX", "SigningKey", "signature_headers"]

SECRET_PREFIX: Final = "whsec_"
#: The specification asks for secrets of 24 to 64 bytes.
_MIN_BYTES: Final = 24
_MAX_BYTES: Final = 64


class SigningKey:
    """A Standard Webhooks secret's bytes. Its ``repr`` never shows them, so a key
    that reaches a log or a traceback gives nothing away."""

    __slots__ = ("_key",)

    def __init__(self, secret: str) -> None:
        """``secret``: ``whsec_`` and base64 (ValueError otherwise, not quoting it)."""
        text = secret.strip()
        if not text.startswith(SECRET_PREFIX):
            raise ValueError(f"a signing secret starts with {SECRET_PREFIX!r}")
        try:
            key = base64.b64decode(text[len(SECRET_PREFIX):], validate=True)
        except (binascii.Error, ValueError):
            raise ValueError(f"a signing secret is {SECRET_PREFIX!r} and base64") from None
        if not _MIN_BYTES <= len(key) <= _MAX_BYTES:
            raise ValueError(f"a signing secret holds {_MIN_BYTES} to {_MAX_BYTES} bytes, "
                             f"not {len(key)}")
        self._key = key

    def __repr__(self) -> str:
        return "SigningKey(<hidden>)"

    def sign(self, message_id: str, timestamp_s: int, body: bytes) -> str:
        """The ``webhook-signature`` value of one request."""
        signed = f"{message_id}.{timestamp_s}.".encode() + body
        digest = hmac.new(self._key, signed, hashlib.sha256).digest()
        return "v1," + base64.b64encode(digest).decode("ascii")


def signature_headers(key: SigningKey, message_id: str, timestamp_s: int,
                      body: bytes) -> dict[str, str]:
    """The three headers of a signed request."""
    return {"webhook-id": message_id, "webhook-timestamp": str(timestamp_s),
            "webhook-signature": key.sign(message_id, timestamp_s, body)}
