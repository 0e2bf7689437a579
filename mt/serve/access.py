"""Who may call the server and how much: API keys (`api_keys=FILE`) and per-caller rate limits.

The key file has one key per line, `name:key` (split at the first colon: a key may hold colons, a name may not) or
a bare key (then named after its line, "line 3"); blank lines and `#` comments are skipped. A key shorter than
`MIN_KEY_CHARS` is refused at load, with the line's number and never the key. The file is read again on SIGHUP and
when it changes (its size or time, looked at no more than once a second), so that a key is added or revoked
without a restart; a file that has become unreadable or wrong keeps the keys it had, with an error in the log.
Keys are compared in constant time (`hmac.compare_digest` on their SHA-256) and never logged: the log and the
metrics name the key's name.

Rate limits count per key, or per client address when the server has no keys: requests per minute (checked before
the body is read) and source tokens per minute (checked once the request's lines are tokenized). They use `limits`,
the engine of slowapi, directly: slowapi's decorators count requests per route, while the token limit costs each
request its number of tokens, which is known only inside the route (`hit(..., cost=tokens)`).
"""

from __future__ import annotations

import hashlib
import hmac
import logging
import math
import os
import time
from pathlib import Path

from limits import RateLimitItemPerMinute
from limits.storage import MemoryStorage
from limits.strategies import MovingWindowRateLimiter

from mt.config import ConfigError
from mt.serve.batching import BadRequest

log = logging.getLogger(__name__)
MIN_KEY_CHARS = 16  # e.g. python -c "import secrets; print(secrets.token_urlsafe(24))" gives 32


def _digest(key: str) -> bytes:
    return hashlib.sha256(key.encode()).digest()


def read_keys(path: Path) -> dict[str, bytes]:
    """{name: SHA-256 of the key} of a key file, or a one-line ConfigError naming the file and line."""
    where = f"api_keys={path}"
    try:
        lines = path.read_text(encoding="utf-8").splitlines()
    except FileNotFoundError:
        raise ConfigError(f"{where}: no such file; write one key per line (name:key)") from None
    except (OSError, UnicodeDecodeError) as e:
        raise ConfigError(f"{where}: cannot read it ({getattr(e, 'strerror', None) or e})") from None
    keys: dict[str, bytes] = {}
    for number, line in enumerate(lines, 1):
        line = line.strip()
        if not line or line.startswith("#"):
            continue
        name, colon, key = line.partition(":")
        if not colon:
            name, key = "", name
        name = name.strip() or f"line {number}"
        key = key.strip()
        if not key or any(c.isspace() for c in key):
            raise ConfigError(f"{where} line {number}: a key is one word with no spaces (name:key)")
        if len(key) < MIN_KEY_CHARS:
            raise ConfigError(f"{where} line {number}: a key of {len(key)} characters, shorter than {MIN_KEY_CHARS}; "
                              "give a longer one, e.g. python -c \"import secrets; print(secrets.token_urlsafe(24))\""
                              )  # fmt: skip
        if name in keys:
            raise ConfigError(f"{where} line {number}: the name {name!r} is given twice; give each key its own")
        if _digest(key) in keys.values():
            raise ConfigError(f"{where} line {number}: this key is given twice; give each caller its own")
        keys[name] = _digest(key)
    if not keys:
        raise ConfigError(f"{where}: no keys in it; write one key per line (name:key)")
    return keys


class ApiKeys:
    """The keys of a file, kept current (see the module docstring)."""

    def __init__(self, path: str):
        self.path = Path(path)
        self.keys = read_keys(self.path)
        self.stamp, self.looked = self._stamp(), time.monotonic()

    def _stamp(self):
        try:
            st = os.stat(self.path)
            return st.st_mtime_ns, st.st_size, st.st_ino
        except OSError:
            return None

    def reload(self) -> None:
        """Read the file again (SIGHUP, or it changed); a bad file keeps the keys there were."""
        self.stamp = self._stamp()
        try:
            keys = read_keys(self.path)
        except ConfigError as e:
            log.error("%s; keeping the %d keys read before", e, len(self.keys))
            return
        if keys != self.keys:
            log.info("api_keys=%s: %d keys (%d before)", self.path, len(keys), len(self.keys))
        self.keys = keys

    def name_of(self, key: str) -> str | None:
        """The name of `key`, or None; every key is compared, in constant time."""
        if time.monotonic() - self.looked >= 1.0:
            self.looked = time.monotonic()
            if self._stamp() != self.stamp:
                self.reload()
        given, found = _digest(key), None
        for name, digest in self.keys.items():
            if hmac.compare_digest(given, digest):
                found = name
        return found


def key_of(headers: dict[str, str]) -> str | None:
    """The key a request carries: `Authorization: Bearer KEY` or `X-API-Key: KEY`."""
    scheme, _, token = headers.get("authorization", "").partition(" ")
    if scheme.lower() == "bearer" and token.strip():
        return token.strip()
    return headers.get("x-api-key", "").strip() or None


class Gate:
    """Keys and rate limits of one server (`keys` None: no keys; a limit of 0: none)."""

    GUARDED = ("/translate", "/info")  # /health, /metrics and the page (which asks for a key) stay open

    def __init__(self, keys: ApiKeys | None, requests_per_minute: int = 0, tokens_per_minute: int = 0,
                 on_refuse=lambda reason: None):  # fmt: skip
        """`on_refuse(reason)`: told of each refusal ("unauthorized", "requests", "tokens"; the metrics)."""
        self.keys, self.on_refuse = keys, on_refuse
        self.limiter = MovingWindowRateLimiter(MemoryStorage())
        self.per_minute = {"requests": requests_per_minute, "tokens": tokens_per_minute}
        self.items = {k: RateLimitItemPerMinute(v) for k, v in self.per_minute.items() if v}

    def guards(self, path: str) -> bool:
        return path in self.GUARDED

    def identify(self, headers: dict[str, str], client: str) -> str:
        """The caller: its key's name, or its address when the server has no keys; a 401 for a missing or wrong
        key."""
        if self.keys is None:
            return client
        key = key_of(headers)
        name = self.keys.name_of(key) if key else None
        if name is None:
            self.on_refuse("unauthorized")
            what = "a wrong API key" if key else "no API key"
            raise BadRequest(401, f"{what}; send it as 'Authorization: Bearer KEY' or 'X-API-Key: KEY'",
                             {"WWW-Authenticate": "Bearer"})  # fmt: skip
        return name

    def count_request(self, caller: str) -> None:
        self._hit("requests", caller, 1)

    def count_tokens(self, caller: str, tokens: int) -> None:
        limit = self.per_minute["tokens"]
        if limit and tokens > limit:
            raise BadRequest(413, f"src: {tokens} source tokens, more than tokens_per_minute={limit} allows at once; "
                                  "split the request")  # fmt: skip
        self._hit("tokens", caller, tokens)

    def charge(self, caller: str, tokens: int) -> None:
        """Count `tokens` of refused work (a request over max_request_tokens, counted before it was refused) against
        the caller's tokens_per_minute, up to the whole minute's allowance, refusing nothing now."""
        item = self.items.get("tokens")
        if tokens and item is not None:
            left = self.limiter.get_window_stats(item, caller).remaining  # (a hit over it would count nothing)
            if left > 0:
                self.limiter.hit(item, caller, cost=min(tokens, left))

    def _hit(self, kind: str, caller: str, cost: int) -> None:
        item = self.items.get(kind)
        if item is None or self.limiter.hit(item, caller, cost=cost):
            return
        self.on_refuse(kind)
        reset = self.limiter.get_window_stats(item, caller).reset_time
        wait = max(1, math.ceil(reset - time.time()))
        raise BadRequest(429, f"over {kind}_per_minute={self.per_minute[kind]} for this caller; retry in {wait} s",
                         {"Retry-After": str(wait)})  # fmt: skip
