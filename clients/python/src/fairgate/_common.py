"""What the sync and asyncio clients share: URLs, parameters, SSE parsing, errors.

No I/O here. The wire contract is docs/serve.md and docs/openapi.yaml.
"""

from __future__ import annotations

import dataclasses
import datetime
import json
import urllib.parse
from typing import Any, Dict, Iterator, List, Mapping, Optional, Tuple, Union

Seconds = Union[int, float, datetime.timedelta]

#: Reasons the server gives when it decides not to grant (docs/serve.md).
REJECT_REASONS = ("timeout", "queue_full", "would_time_out", "disabled", "unavailable", "too_many_waiters")


class FairgateError(Exception):
    """Base class of every error this package raises.

    ``reason`` is the server's machine-readable reason (``"bad_request"``,
    ``"unknown_limiter"``, ``"timeout"``, ...) or ``"connection"`` when the
    server could not be reached; ``status`` the HTTP status (0 when there was
    no HTTP answer).
    """

    def __init__(self, reason: str, message: str, status: int = 0) -> None:
        super().__init__(f"{reason}: {message}" if message else reason)
        self.reason = reason
        self.message = message
        self.status = status


class Rejected(FairgateError):
    """The server decided: no permit for this request.

    ``reason`` is one of ``timeout`` (no permit within max_wait),
    ``queue_full``, ``disabled`` (limiter disabled in reject mode),
    ``unavailable`` (the backend cannot decide, or the server is shutting
    down), ``too_many_waiters`` (this client address already has too many
    waiting requests). ``waited`` is how long the request waited (seconds),
    ``retry_after`` the server's hint (seconds) when it gave one.
    """

    def __init__(
        self,
        reason: str,
        message: str,
        status: int = 0,
        waited: float = 0.0,
        ticket: Optional[str] = None,
        retry_after: Optional[float] = None,
    ) -> None:
        super().__init__(reason, message, status)
        self.waited = waited
        self.ticket = ticket
        self.retry_after = retry_after


class ApiError(FairgateError):
    """The server refused the request itself: bad parameters (400), unknown
    limiter or permit (404), missing admin token (401), ..."""


class ConnectionFailed(FairgateError, ConnectionError):
    """The server could not be reached, or the connection broke before an answer."""

    def __init__(self, message: str) -> None:
        super().__init__("connection", message, 0)


@dataclasses.dataclass(frozen=True)
class QueueStatus:
    """Where a waiting request stands: ``position`` 1 is next in line."""

    position: int
    queued: int
    estimated_wait: Optional[float]  # seconds, when the server has an estimate
    ticket: Optional[str]


def to_ms(value: Optional[Seconds], name: str) -> Optional[int]:
    """Seconds (int, float or timedelta) → whole milliseconds; None stays None."""
    if value is None:
        return None
    if isinstance(value, datetime.timedelta):
        seconds = value.total_seconds()
    elif isinstance(value, (int, float)) and not isinstance(value, bool):
        seconds = float(value)
    else:
        raise TypeError(f"{name}: expected seconds (int, float or timedelta), got {type(value).__name__}")
    if seconds < 0:
        raise ValueError(f"{name}: {value!r} is negative")
    return int(round(seconds * 1000))


class BaseURL:
    """http://HOST[:PORT][/PREFIX] → the pieces a connection needs."""

    def __init__(self, url: str) -> None:
        parts = urllib.parse.urlsplit(url)
        if parts.scheme not in ("http", "https") or not parts.hostname:
            raise ValueError(f"url: {url!r} is not http://HOST[:PORT] or https://HOST[:PORT]")
        if parts.query or parts.fragment:
            raise ValueError(f"url: {url!r} must not have a query or a fragment")
        self.url = url.rstrip("/")
        self.tls = parts.scheme == "https"
        self.host = parts.hostname
        self.port = parts.port or (443 if self.tls else 80)
        self.prefix = parts.path.rstrip("/")
        default_port = (self.tls and self.port == 443) or (not self.tls and self.port == 80)
        host = f"[{self.host}]" if ":" in self.host else self.host
        self.host_header = host if default_port else f"{host}:{self.port}"

    def path(self, *segments: str, query: Optional[Mapping[str, Any]] = None) -> str:
        path = self.prefix + "".join("/" + urllib.parse.quote(s, safe="") for s in segments)
        if query:
            path += "?" + urllib.parse.urlencode({k: v for k, v in query.items() if v is not None})
        return path


def acquire_query(
    max_wait: Optional[Seconds],
    tenant: Optional[str],
    weight: Optional[int],
    lease: Optional[Seconds] = None,
) -> Dict[str, Any]:
    if tenant is not None and not isinstance(tenant, str):
        raise TypeError("tenant: expected a string")
    if weight is not None and (isinstance(weight, bool) or not isinstance(weight, int)):
        raise TypeError("weight: expected an int")
    return {
        "max_wait_ms": to_ms(max_wait, "max_wait"),
        "tenant": tenant,
        "weight": weight,
        "lease_ms": to_ms(lease, "lease"),
    }


class SseParser:
    """Incremental text/event-stream parser (the WHATWG rules that matter here):
    feed it lines, it yields (event, data) at each blank line; comments
    (``: keepalive``) yield nothing."""

    def __init__(self) -> None:
        self._event = ""
        self._data: List[str] = []

    def feed_line(self, line: str) -> Optional[Tuple[str, str]]:
        line = line.rstrip("\r\n")
        if line == "":
            if not self._data and not self._event:
                return None
            out = (self._event or "message", "\n".join(self._data))
            self._event, self._data = "", []
            return out
        if line.startswith(":"):
            return None
        field, _, value = line.partition(":")
        if value.startswith(" "):
            value = value[1:]
        if field == "event":
            self._event = value
        elif field == "data":
            self._data.append(value)
        return None

    def feed(self, text: str) -> Iterator[Tuple[str, str]]:
        for line in text.splitlines():
            ev = self.feed_line(line)
            if ev is not None:
                yield ev


def parse_json(text: str) -> Any:
    try:
        return json.loads(text) if text else None
    except ValueError:
        return None


def retry_after_seconds(value: Optional[str]) -> Optional[float]:
    if value is None:
        return None
    try:
        return float(int(value.strip()))
    except ValueError:
        return None


def error_from_response(status: int, body: str, retry_after: Optional[str] = None) -> FairgateError:
    """A non-2xx answer → Rejected (a decision: 429, 503 with an admission
    reason) or ApiError (the request itself was refused)."""
    doc = parse_json(body)
    err = doc.get("error") if isinstance(doc, dict) else None
    reason = "http_error"
    message = body.strip()[:200]
    if isinstance(err, dict):
        reason = str(err.get("reason") or err.get("code") or reason)
        message = str(err.get("message") or "")
    if reason in REJECT_REASONS or status == 429:
        return Rejected(reason, message, status, retry_after=retry_after_seconds(retry_after))
    return ApiError(reason, message or f"HTTP {status}", status)


def queue_status(data: Any) -> QueueStatus:
    d = data if isinstance(data, dict) else {}
    eta = d.get("estimated_wait_ms")
    return QueueStatus(
        position=int(d.get("position", 0)),
        queued=int(d.get("queued", 0)),
        estimated_wait=eta / 1000.0 if isinstance(eta, (int, float)) else None,
        ticket=d.get("ticket"),
    )


def rejected_event(data: Any) -> Rejected:
    d = data if isinstance(data, dict) else {}
    waited = d.get("waited_ms")
    return Rejected(
        str(d.get("reason") or "unavailable"),
        str(d.get("message") or ""),
        200,
        waited=waited / 1000.0 if isinstance(waited, (int, float)) else 0.0,
        ticket=d.get("ticket"),
    )


def user_agent() -> str:
    from . import __version__

    return f"fairgate-python/{__version__}"
