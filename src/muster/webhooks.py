"""muster's own signed webhook (issue 36, notifications): one POST of a JSON body, signed so
that the receiver knows it came from this server and was not replayed.

The signature is the Stripe-style `Muster-Signature: t=<unix seconds>,v1=<hex>`, where
`<hex>` is HMAC-SHA256 under the shared secret of `<t>.` followed by the exact body bytes;
`verify` is what a receiver does (and what the tests do). Each delivery carries the
notification's `Idempotency-Key`: a retry of the same notification (after a 5xx, a timeout,
or a server restart mid-delivery) carries the same key, so a receiver that keeps the keys
it has seen acts once. `deliver` makes one try and says how it went; retrying with
`backoff` is the outbox's (durable) work, never a loop in a request.

A delivery follows no redirect (a 3xx is a failure that names where it pointed), reads at
most `RESPONSE_BYTES` of the answer, and is bounded by `timeout` seconds in all.
"""

from __future__ import annotations

import hashlib
import hmac
import json
import random
import time
from dataclasses import dataclass
from typing import Any

import httpx

from muster import __version__

__all__ = ["Delivery", "backoff", "body_of", "deliver", "sign", "verify"]

SIGNATURE_HEADER = "Muster-Signature"
KEY_HEADER = "Idempotency-Key"
RESPONSE_BYTES = 4096  # of a receiver's answer, kept for the delivery log
TOLERANCE_SECONDS = 300  # how old a signed timestamp `verify` accepts
BACKOFF_BASE, BACKOFF_CAP = 2.0, 3600.0  # seconds: 2, 4, 8, ... at most an hour


@dataclass(frozen=True)
class Delivery:
    """One try: `ok` (a 2xx), the HTTP status (None when no answer came), what went wrong
    in words, the start of the answer, and how long it took."""

    ok: bool
    status: int | None
    error: str | None
    answer: str
    seconds: float


def body_of(payload: dict[str, Any]) -> bytes:
    """The bytes sent and signed: compact, keys sorted, UTF-8."""
    return json.dumps(payload, sort_keys=True, separators=(",", ":"),
                      ensure_ascii=False).encode()


def sign(secret: bytes, timestamp: int, body: bytes) -> str:
    """The `Muster-Signature` header's value for `body` sent at `timestamp`."""
    digest = hmac.new(secret, f"{timestamp}.".encode() + body, hashlib.sha256).hexdigest()
    return f"t={timestamp},v1={digest}"


def verify(secret: bytes, header: str, body: bytes, now: float | None = None,
           tolerance: float = TOLERANCE_SECONDS) -> bool:
    """Whether `header` signs `body` under `secret`, made within `tolerance` seconds of
    `now` (a replayed old delivery fails). Compared in constant time."""
    fields = dict(part.split("=", 1) for part in header.split(",") if "=" in part)
    try:
        timestamp = int(fields["t"])
    except (KeyError, ValueError):
        return False
    if abs((time.time() if now is None else now) - timestamp) > tolerance:
        return False
    expected = sign(secret, timestamp, body).split("v1=", 1)[1]
    return hmac.compare_digest(expected, fields.get("v1", ""))


def deliver(url: str, payload: dict[str, Any], key: str, secret: bytes, *,
            timeout: float = 10.0, transport: httpx.BaseTransport | None = None,
            now: float | None = None) -> Delivery:
    """POST `payload` to `url` once, signed, with `key` as its Idempotency-Key."""
    body = body_of(payload)
    timestamp = int(time.time() if now is None else now)
    headers = {"Content-Type": "application/json", "User-Agent": f"muster/{__version__}",
               SIGNATURE_HEADER: sign(secret, timestamp, body), KEY_HEADER: key}
    started = time.monotonic()
    try:
        with httpx.Client(timeout=timeout, follow_redirects=False, transport=transport,
                          trust_env=False) as client, \
                client.stream("POST", url, content=body, headers=headers) as response:
            answer = _start_of(response)
            status = response.status_code
    except httpx.HTTPError as exc:
        return Delivery(False, None, f"{type(exc).__name__}: {exc}", "",
                        time.monotonic() - started)
    took = time.monotonic() - started
    if 200 <= status < 300:
        return Delivery(True, status, None, answer, took)
    where = response.headers.get("location")
    error = (f"HTTP {status}: redirects are not followed (to {where})" if where
             and 300 <= status < 400 else f"HTTP {status}")
    return Delivery(False, status, error, answer, took)


def backoff(tries: int, jitter: float | None = None) -> float:
    """Seconds to wait before try `tries + 1` (after `tries` failed ones): doubling from
    BACKOFF_BASE, spread by up to a quarter (`jitter` in [0, 1) fixes the spread, for tests)
    so that the retries to a receiver that was down do not all come at once; at most
    BACKOFF_CAP."""
    wait = BACKOFF_BASE * 2.0 ** min(max(0, tries - 1), 32)
    spread = random.random() if jitter is None else jitter  # (a spread, not a secret)
    return min(BACKOFF_CAP, wait * (1 + spread / 4))


def _start_of(response: httpx.Response) -> str:
    """At most RESPONSE_BYTES of the answer, decoded leniently."""
    kept = bytearray()
    for chunk in response.iter_bytes():
        kept += chunk[:RESPONSE_BYTES - len(kept)]
        if len(kept) >= RESPONSE_BYTES:
            break
    return kept.decode("utf-8", "replace")
