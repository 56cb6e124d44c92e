"""Per-client limits for public instances: requests and characters of input text per minute, and
characters per request, each 0 (no limit) unless set.

A client is the id of the valid API key its request carried (`KEY_ID` in the scope, set by the
key check), else its address: the connection's, or with `SERVE_TRUSTED_PROXY_HEADER` the last
entry of that header (the one the nearest proxy added; the earlier ones are the client's to
write). Every rate is a token bucket: capacity the per-minute figure, refilled at figure/60 a
second; a refusal says how long until the request would fit (`Retry-After`). A limits file may
set other figures per key id and a default for everyone else.

The state is this process's: with N replicas a client may get N times the limit (a global limit
belongs in the gateway). It stays bounded: a bucket untouched for a minute has refilled, which is
the same as having none, so it is dropped; beyond `MAX_BUCKETS` the least recently used go first
(which only forgives their clients, never refuses anyone).
"""

from __future__ import annotations

import asyncio
import json
import logging
import math
import time
from collections import OrderedDict
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass, field, replace
from pathlib import Path

from pydantic import BaseModel, ConfigDict, Field, ValidationError
from starlette.types import Scope

from service.errors import InputTooLong, RateLimited, ServiceError
from service.http.scope import KEY_ID

log = logging.getLogger(__name__)

Clock = Callable[[], float]

REFILL_S = 60.0  # a bucket refills from empty in a minute: its figure is per minute
MAX_BUCKETS = 100_000  # about 300 bytes each: 30 MB at most, whatever the addresses a client sprays
RECHECK_S = 1.0  # the limits file's mtime is looked at at most this often


@dataclass(frozen=True)
class Limits:
    """One client's figures; 0: no limit."""

    requests_per_minute: int = 0
    chars_per_minute: int = 0
    max_request_chars: int = 0

    @property
    def any(self) -> bool:
        return bool(self.requests_per_minute or self.chars_per_minute or self.max_request_chars)


class _Figures(BaseModel):
    """A limits file's entry: the figures it names replace those it falls back to."""

    model_config = ConfigDict(extra="forbid")
    requests_per_minute: int | None = Field(default=None, ge=0)
    chars_per_minute: int | None = Field(default=None, ge=0)
    max_request_chars: int | None = Field(default=None, ge=0)

    def over(self, base: Limits) -> Limits:
        return replace(base, **self.model_dump(exclude_none=True))


class _LimitsFile(BaseModel):
    """``{"keys": {"<key id>": {...}}, "default": {...}}``: key ids, never keys."""

    model_config = ConfigDict(extra="forbid")
    keys: dict[str, _Figures] = Field(default_factory=dict)
    default: _Figures = Field(default_factory=_Figures)


@dataclass(frozen=True)
class Policy:
    """Whose limits are which: a key's own entry, else the default."""

    default: Limits
    keys: Mapping[str, Limits] = field(default_factory=dict)

    def of(self, client: str) -> Limits:
        if client.startswith("key:"):
            return self.keys.get(client[4:], self.default)
        return self.default

    @property
    def any(self) -> bool:
        return self.default.any or any(v.any for v in self.keys.values())


def parse_policy(text: str, base: Limits) -> Policy:
    """A limits file's policy over the settings' figures (`base`); ValueError when it is broken."""
    try:
        document = _LimitsFile.model_validate(json.loads(text))
    except ValidationError as exc:
        first = exc.errors()[0]
        raise ValueError(f"{exc.error_count()} invalid field(s), first {first['loc']}: {first['msg']}") from None
    default = document.default.over(base)
    return Policy(default, {key: figures.over(default) for key, figures in document.keys.items()})


class PolicySource:
    """The policy in force: the settings' figures, or the limits file's over them. The file is read
    at start (a broken one stops the start), then again when its mtime or size changes, looked at
    most once a second; a broken change keeps the last good policy and logs one error."""

    def __init__(self, base: Limits, path: Path | None = None, clock: Clock = time.monotonic) -> None:
        self.base, self.path, self.clock = base, path, clock
        self.policy = Policy(base)
        self._looked, self._stamp = -math.inf, self._stat()
        if path is not None:
            self.policy = parse_policy(path.read_text(), base)

    def _stat(self) -> tuple[int, int] | None:
        if self.path is None:
            return None
        try:
            st = self.path.stat()
        except OSError:
            return None
        return st.st_mtime_ns, st.st_size

    def current(self) -> Policy:
        if self.path is None or self.clock() - self._looked < RECHECK_S:
            return self.policy
        self._looked = self.clock()
        stamp = self._stat()
        if stamp == self._stamp:
            return self.policy
        self._stamp = stamp
        try:
            self.policy = parse_policy(self.path.read_text(), self.base)
        except (OSError, ValueError) as exc:
            log.error("limits file %s not read, the last good limits stay: %s", self.path, exc)
        else:
            log.info("limits file %s read: %d key(s)", self.path, len(self.policy.keys))
        return self.policy

    @property
    def active(self) -> bool:
        """Whether any limit may ever apply (a file may set some later)."""
        return self.path is not None or self.base.any


@dataclass(slots=True)
class Bucket:
    tokens: float
    stamp: float


def take(bucket: Bucket, per_minute: int, amount: float, now: float) -> float:
    """Takes `amount` if the bucket holds it: 0.0; else the seconds until it would (nothing taken)."""
    rate = per_minute / REFILL_S
    bucket.tokens = min(float(per_minute), bucket.tokens + (now - bucket.stamp) * rate)
    bucket.stamp = now
    if bucket.tokens >= amount:
        bucket.tokens -= amount
        return 0.0
    return (amount - bucket.tokens) / rate


def retry_after(seconds: float) -> int:
    """`Retry-After` is whole seconds: rounded up, at least 1."""
    return max(1, math.ceil(seconds))


class Buckets:
    """Every client's buckets, least recently used first, the idle ones dropped as others are used."""

    def __init__(self, clock: Clock = time.monotonic, max_buckets: int = MAX_BUCKETS) -> None:
        self.clock, self.max_buckets = clock, max_buckets
        self._buckets: OrderedDict[tuple[str, str], Bucket] = OrderedDict()

    def __len__(self) -> int:
        return len(self._buckets)

    def take(self, client: str, limit: str, per_minute: int, amount: float) -> float:
        """0.0: taken; else the seconds until `amount` would fit `client`'s `limit` bucket."""
        now = self.clock()
        key = (client, limit)
        bucket = self._buckets.get(key)
        if bucket is None:
            bucket = self._buckets[key] = Bucket(float(per_minute), now)
        else:
            self._buckets.move_to_end(key)
        wait = take(bucket, per_minute, amount, now)
        self._drop_idle(now)
        return wait

    def _drop_idle(self, now: float) -> None:
        buckets = self._buckets
        while buckets:
            key, oldest = next(iter(buckets.items()))
            if now - oldest.stamp < REFILL_S and len(buckets) <= self.max_buckets:
                return
            del buckets[key]


async def hold(exc: ServiceError, hold_s: float) -> None:
    """Before a 429 is sent: wait `hold_s`, at most its Retry-After. A client that floods in a closed
    loop would otherwise get refusals as fast as the event loop can write them, and that loop work
    preempts the model threads serving everyone else (bench/limits.py); held, a refusal costs a
    sleeping coroutine and the flood slows to its connections / `hold_s` a second."""
    if isinstance(exc, RateLimited) and hold_s > 0:
        await asyncio.sleep(min(hold_s, exc.retry_after or 0))


def client_of(scope: Scope, trusted_proxy_header: str | None) -> str:
    """``key:<id>`` for a request with a valid key, else ``addr:<address>``."""
    found = scope.get(KEY_ID)
    if isinstance(found, str) and found:
        return "key:" + found
    if trusted_proxy_header:
        name, forwarded = trusted_proxy_header.lower().encode("latin-1"), None
        for k, v in scope.get("headers", ()):
            if k == name:
                forwarded = v  # a repeated header continues the list: the last line has the last entry
        if forwarded is not None:
            nearest = forwarded.decode("latin-1").rsplit(",", 1)[-1].strip()
            if nearest:
                return "addr:" + nearest
    client = scope.get("client")
    return "addr:" + (str(client[0]) if client else "unknown")


class ClientLimits:
    """The checks the HTTP layer makes: `request` before a request's body is read (or, when its key
    travels in the body, once it is checked), `texts` where the texts are submitted. Each raises
    the domain error of the limit passed; `refused(limit)` counts it."""

    def __init__(
        self,
        source: PolicySource,
        trusted_proxy_header: str | None = None,
        buckets: Buckets | None = None,
        refused: Callable[[str], None] = lambda limit: None,
    ) -> None:
        self.source, self.header, self.refused = source, trusted_proxy_header, refused
        self.buckets = buckets or Buckets(source.clock)

    @property
    def active(self) -> bool:
        return self.source.active

    def request(self, scope: Scope) -> None:
        if not self.active:
            return
        client = client_of(scope, self.header)
        per_minute = self.source.current().of(client).requests_per_minute
        if per_minute:
            wait = self.buckets.take(client, "requests", per_minute, 1)
            if wait:
                self.refused("requests")
                message = f"too many requests: at most {per_minute} a minute per client"
                raise RateLimited(message, retry_after(wait), "requests")

    def texts(self, scope: Scope, texts: Sequence[str]) -> None:
        if not self.active:
            return
        client = client_of(scope, self.header)
        limits = self.source.current().of(client)
        chars = sum(len(t) for t in texts)
        cap, per_minute = limits.max_request_chars, limits.chars_per_minute
        if cap and chars > cap:
            self.refused("request_chars")
            raise InputTooLong(f"the request has {chars} characters of text; at most {cap} per request")
        if per_minute and chars > per_minute:  # would never fit: retrying cannot help
            self.refused("request_chars")
            raise InputTooLong(f"the request has {chars} characters of text; at most {per_minute} a minute")
        if per_minute and chars:
            wait = self.buckets.take(client, "chars", per_minute, chars)
            if wait:
                self.refused("chars")
                message = f"too many characters: at most {per_minute} a minute per client"
                raise RateLimited(message, retry_after(wait), "chars")
