"""Delivery targets: where outcomes go, by the name a ``watch`` or ``schedule`` row gives.

A targets file is TOML, one table per target::

    [targets.coupons]
    urls = ["http://10.0.0.5:9001/hook", "http://10.0.0.6:9001/hook"]
    strategy = "round_robin"      # or "failover" (the default)
    secret_file = "coupons.key"   # a Standard Webhooks secret (whsec_...)
    headers = { "X-Team" = "growth" }
    timeout_ms = 10000
    max_attempts = 8              # 0: retry until delivered
    max_batch = 250
    retry_ms = 1000               # the pause before a failed request is tried again

Rows without a ``target`` go to the target named ``default`` (``--deliver-to URL`` is
the same as ``[targets.default]`` with that one url). A file that is not that is
refused whole, naming the key.
"""

from __future__ import annotations

import re
import tomllib
from collections.abc import Mapping
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Final, Literal

from tickwheel.pipeline.contract.events import TARGET_NAME
from tickwheel.service.signing import SigningKey

__all__ = ["DEFAULT_TARGET", "STRATEGIES", "TargetSpec", "TargetsError", "check_url",
           "load_targets", "target_for_url"]

#: The target of rows that name none.
DEFAULT_TARGET: Final = "default"
STRATEGIES: Final = ("failover", "round_robin")
Strategy = Literal["failover", "round_robin"]
_KEYS: Final = frozenset({"urls", "strategy", "secret_file", "headers", "timeout_ms",
                          "max_attempts", "max_batch", "retry_ms"})
# Headers a target may not set: the request's framing and its signature are tickwheel's.
_RESERVED: Final = frozenset({"content-type", "content-length", "host", "transfer-encoding",
                              "connection", "accept-encoding", "webhook-id",
                              "webhook-timestamp", "webhook-signature"})
_TOKEN: Final = re.compile(r"[!#$%&'*+\-.^_`|~0-9A-Za-z]+")
_MAX_BATCH: Final = 10_000


class TargetsError(ValueError):
    """A targets file, or a target, that cannot be used (the message names the key)."""


@dataclass(frozen=True, slots=True)
class TargetSpec:
    """One target: its urls and how requests to them are made."""

    name: str
    urls: tuple[str, ...]
    strategy: Strategy = "failover"
    signing_key: SigningKey | None = field(default=None, repr=False)
    headers: Mapping[str, str] = field(default_factory=dict)
    timeout_ms: int = 10_000
    #: Attempts of one request before its dead letter; 0 tries until it is delivered.
    max_attempts: int = 0
    max_batch: int = 250
    retry_ms: int = 1_000


def check_url(url: str) -> str:
    """``url`` if it is an http(s) URL with a host; ValueError naming what is wrong."""
    import httpx

    try:
        parsed = httpx.URL(url)
    except (httpx.InvalidURL, TypeError) as exc:
        raise ValueError(f"{url!r} is not a URL: {exc}") from None
    if parsed.scheme not in ("http", "https") or not parsed.host:
        raise ValueError(f"{url!r} is not an http:// or https:// URL with a host")
    return url


def target_for_url(url: str, name: str = DEFAULT_TARGET) -> TargetSpec:
    """The target of ``--deliver-to URL``."""
    return TargetSpec(name, (check_url(url),))


def load_targets(path: Path) -> dict[str, TargetSpec]:
    """The targets a file defines, by name; :class:`TargetsError` naming the key of
    anything malformed (a relative ``secret_file`` is read beside the file)."""
    try:
        with path.open("rb") as file:
            document = tomllib.load(file)
    except OSError as exc:
        raise TargetsError(f"{path}: {exc.strerror or exc}") from None
    except tomllib.TOMLDecodeError as exc:
        raise TargetsError(f"{path} is not TOML: {exc}") from None
    unknown = sorted(set(document) - {"targets"})
    if unknown:
        raise TargetsError(f"{path}: unknown key {unknown[0]!r}: the file holds "
                           "[targets.NAME] tables only")
    tables = document.get("targets", {})
    if not isinstance(tables, dict) or not tables:
        raise TargetsError(f"{path}: no [targets.NAME] table")
    return {name: _target(path, name, table) for name, table in tables.items()}


def _target(path: Path, name: str, table: Any) -> TargetSpec:
    where = f"{path}: targets.{name}"
    if TARGET_NAME.fullmatch(name) is None:
        raise TargetsError(f"{where}: a target's name is letters, digits, '_', '.' and "
                           "'-', at most 64, not starting with '.' or '-'")
    if not isinstance(table, dict):
        raise TargetsError(f"{where} must be a table")
    unknown = sorted(set(table) - _KEYS)
    if unknown:
        raise TargetsError(f"{where}.{unknown[0]}: unknown key (known: "
                           f"{', '.join(sorted(_KEYS))})")
    urls = table.get("urls")
    if not isinstance(urls, list) or not urls or not all(isinstance(u, str) for u in urls):
        raise TargetsError(f"{where}.urls: a list of one or more URLs is needed")
    for url in urls:
        try:
            check_url(url)
        except ValueError as exc:
            raise TargetsError(f"{where}.urls: {exc}") from None
    strategy = table.get("strategy", "failover")
    if strategy not in STRATEGIES:
        raise TargetsError(f"{where}.strategy: one of {', '.join(STRATEGIES)}, "
                           f"not {strategy!r}")
    key = None
    if "secret_file" in table:
        key = _signing_key(path, where, table["secret_file"])
    return TargetSpec(name, tuple(urls), strategy, key, _headers(where, table.get("headers", {})),
                      _int(where, table, "timeout_ms", 10_000, 1, 600_000),
                      _int(where, table, "max_attempts", 0, 0, 1_000_000),
                      _int(where, table, "max_batch", 250, 1, _MAX_BATCH),
                      _int(where, table, "retry_ms", 1_000, 0, 3_600_000))


def _int(where: str, table: dict[str, Any], key: str, default: int, low: int,
         high: int) -> int:
    value = table.get(key, default)
    if type(value) is not int or not low <= value <= high:
        raise TargetsError(f"{where}.{key}: an integer from {low:,} to {high:,}, "
                           f"not {value!r}")
    return value


def _signing_key(path: Path, where: str, name: Any) -> SigningKey:
    if not isinstance(name, str) or not name:
        raise TargetsError(f"{where}.secret_file: a file name is needed")
    secret_path = Path(name) if Path(name).is_absolute() else path.parent / name
    try:
        text = secret_path.read_text(encoding="utf-8")
    except (OSError, UnicodeDecodeError) as exc:
        reason = exc.strerror if isinstance(exc, OSError) and exc.strerror else str(exc)
        raise TargetsError(f"{where}.secret_file: {secret_path}: {reason}") from None
    try:
        return SigningKey(text)
    except ValueError as exc:  # never quotes the secret
        raise TargetsError(f"{where}.secret_file: {secret_path}: {exc}") from None


def _headers(where: str, headers: Any) -> dict[str, str]:
    if not isinstance(headers, dict):
        raise TargetsError(f"{where}.headers: a table of names and strings is needed")
    for name, value in headers.items():
        if _TOKEN.fullmatch(name) is None:
            raise TargetsError(f"{where}.headers: {name!r} is not a header name")
        if name.lower() in _RESERVED:
            raise TargetsError(f"{where}.headers: {name!r} is set by tickwheel")
        if not isinstance(value, str) or any(c in value for c in "\r\n\0"):
            raise TargetsError(f"{where}.headers.{name}: a string on one line is needed")
    return dict(headers)
