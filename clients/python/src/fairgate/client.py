"""The blocking client: ``Client``, ``Permit`` (an SSE stream held open) and ``Lease``
(a JSON permit released with DELETE or when its lease runs out).

Invariant: a ``Permit`` owns exactly one open connection, and the server holds
the permit exactly as long as that connection is open. Every exit path of
``acquire`` that does not hand out a ``Permit`` closes the connection (a
waiting request is then cancelled by the server, a grant that raced it is
released), so an exception, a KeyboardInterrupt or a callback that raises
never strands a permit.
"""

from __future__ import annotations

import http.client
import json
import socket
import ssl
import threading
import time
from typing import Any, Callable, Dict, List, Optional

from ._common import (
    ApiError,
    BaseURL,
    ConnectionFailed,
    FairgateError,
    QueueStatus,
    Seconds,
    SseParser,
    acquire_query,
    error_from_response,
    parse_json,
    queue_status,
    rejected_event,
    to_ms,
    user_agent,
)

OnQueued = Callable[[QueueStatus], Any]


def _tcp_keepalive(sock: Optional[socket.socket]) -> None:
    """A held stream is quiet for long stretches: let the kernel notice a peer
    that vanished without a FIN (about 60 s) instead of waiting forever."""
    if sock is None:
        return
    try:
        sock.setsockopt(socket.SOL_SOCKET, socket.SO_KEEPALIVE, 1)
        for name, value in (("TCP_KEEPIDLE", 30), ("TCP_KEEPINTVL", 10), ("TCP_KEEPCNT", 3)):
            if hasattr(socket, name):
                sock.setsockopt(socket.IPPROTO_TCP, getattr(socket, name), value)
        sock.setsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY, 1)
    except OSError:
        pass


class Permit:
    """A granted permit, held while this object's stream is open.

    Use it as a context manager (``with client.acquire(...) as permit:``) or
    call ``release()``; both are idempotent. ``lost`` becomes true when the
    stream ended without ``release()`` (the server went away): on the memory
    backend the permit is gone with the server; on Redis it is reclaimed once
    the server's instance is declared dead. ``on_lost`` (given to
    ``acquire``) is called once, from a background thread, when that happens.
    """

    def __init__(
        self,
        limiter: str,
        data: Dict[str, Any],
        conn: http.client.HTTPConnection,
        sock: socket.socket,
        resp: http.client.HTTPResponse,
        on_lost: Optional[Callable[["Permit"], Any]],
    ) -> None:
        self.limiter = limiter
        self.id: str = str(data.get("permit", ""))
        self.ticket: Optional[str] = data.get("ticket")
        waited = data.get("waited_ms", 0)
        self.waited: float = waited / 1000.0 if isinstance(waited, (int, float)) else 0.0
        self.granted_at = time.monotonic()
        self._conn = conn
        self._sock = sock
        self._resp = resp
        self._on_lost = on_lost
        self._lock = threading.Lock()
        self._released = False
        self._lost = threading.Event()
        self._watcher = threading.Thread(target=self._watch, name=f"fairgate-permit-{self.id}", daemon=True)
        self._watcher.start()

    # -- the stream ----------------------------------------------------------
    def _watch(self) -> None:
        # Reads the keep-alive comments until the stream ends; only this
        # thread reads the response after the grant.
        try:
            while self._resp.readline():
                pass
        except (OSError, ValueError, http.client.HTTPException):
            pass
        with self._lock:
            if self._released:
                return
            self._lost.set()
        if self._on_lost is not None:
            try:
                self._on_lost(self)
            except Exception:  # a callback's failure must not kill the watcher silently
                import traceback

                traceback.print_exc()

    @property
    def released(self) -> bool:
        return self._released

    @property
    def lost(self) -> bool:
        """True when the server ended the stream while the permit was held."""
        return self._lost.is_set()

    def wait_lost(self, timeout: Optional[float] = None) -> bool:
        """Blocks until the permit is lost (True) or ``timeout`` passes (False)."""
        return self._lost.wait(timeout)

    def release(self) -> None:
        """Gives the permit back (closes the stream). Safe to call again."""
        with self._lock:
            if self._released:
                return
            self._released = True
        try:
            self._sock.shutdown(socket.SHUT_RDWR)  # wakes the watcher; the server sees the close at once
        except OSError:
            pass
        if threading.current_thread() is not self._watcher:
            self._watcher.join(5.0)
        self._resp.close()
        self._conn.close()
        self._sock.close()

    def __enter__(self) -> "Permit":
        return self

    def __exit__(self, *exc: Any) -> None:
        self.release()

    def __del__(self) -> None:
        try:
            self.release()
        except Exception:
            pass

    def __repr__(self) -> str:
        state = "released" if self._released else "lost" if self.lost else "held"
        return f"<fairgate.Permit {self.limiter}/{self.id} {state} waited={self.waited:.3f}s>"


class Lease:
    """A JSON permit (long poll): held until ``release()`` or until its lease
    runs out unless ``renew()``\\ ed. It lives in the server instance that
    granted it, so release and renew go to the same URL."""

    def __init__(self, client: "Client", limiter: str, data: Dict[str, Any]) -> None:
        self._client = client
        self.limiter = limiter
        self.id: str = str(data.get("permit", ""))
        self.lease: float = data.get("lease_ms", 0) / 1000.0
        self.waited: float = data.get("waited_ms", 0) / 1000.0
        self.granted_at = time.monotonic()
        self._released = False

    def renew(self) -> float:
        """Restarts the lease; returns its length in seconds. ApiError 404 when it already ran out."""
        body = self._client._call("POST", "v1", "permits", self.id, "renew")
        self.lease = body.get("lease_ms", 0) / 1000.0
        return self.lease

    def release(self) -> bool:
        """Gives the permit back; False when the server no longer had it (lease ran out)."""
        if self._released:
            return True
        self._released = True
        try:
            self._client._call("DELETE", "v1", "permits", self.id)
            return True
        except ApiError as e:
            if e.status == 404:
                return False
            raise

    def __enter__(self) -> "Lease":
        return self

    def __exit__(self, *exc: Any) -> None:
        self.release()

    def __repr__(self) -> str:
        return f"<fairgate.Lease {self.limiter}/{self.id} lease={self.lease:.1f}s>"


class Client:
    """A fairgate server at ``url`` (``http://127.0.0.1:8080``).

    ``timeout`` (seconds) bounds connecting and every call that does not wait
    in the queue; an acquire waits up to its ``max_wait`` plus ``timeout``
    (without ``max_wait``: as long as the limiter's own max wait, with TCP
    keep-alive watching the connection). Thread-safe: every call uses its own
    connection.
    """

    def __init__(
        self,
        url: str = "http://127.0.0.1:8080",
        *,
        timeout: float = 10.0,
        admin_token: Optional[str] = None,
        ssl_context: Optional[ssl.SSLContext] = None,
    ) -> None:
        self._base = BaseURL(url)
        self.url = self._base.url
        self.timeout = timeout
        self.admin_token = admin_token
        self._ssl = ssl_context

    # -- admission -----------------------------------------------------------
    def acquire(
        self,
        limiter: str,
        *,
        max_wait: Optional[Seconds] = None,
        tenant: Optional[str] = None,
        weight: Optional[int] = None,
        on_queued: Optional[OnQueued] = None,
        on_lost: Optional[Callable[[Permit], Any]] = None,
    ) -> Permit:
        """Waits in the limiter's queue and returns the granted ``Permit``.

        ``on_queued(QueueStatus)`` is called when the request has to wait and
        again whenever its position changes (raise from it to give up).
        Raises ``Rejected`` (``reason``: timeout, queue_full, disabled,
        unavailable, too_many_waiters), ``ApiError`` (unknown limiter, bad
        parameter) or ``ConnectionFailed``.
        """
        query = acquire_query(max_wait, tenant, weight)
        path = self._base.path("v1", "limiters", limiter, "acquire", query=query)
        wait_ms = query["max_wait_ms"]
        conn = self._connection()
        sock: Optional[socket.socket] = None
        try:
            try:
                conn.connect()
                sock = conn.sock  # the response owns it once read (Connection: close)
                _tcp_keepalive(sock)
                conn.putrequest("POST", path, skip_host=True, skip_accept_encoding=True)
                conn.putheader("Host", self._base.host_header)
                conn.putheader("Accept", "text/event-stream")
                conn.putheader("User-Agent", user_agent())
                conn.putheader("Content-Length", "0")
                conn.endheaders()
                resp = conn.getresponse()  # the event-stream header comes at once: within `timeout`
                # While queued the server says nothing until the position changes.
                assert sock is not None
                sock.settimeout(None if wait_ms is None else wait_ms / 1000.0 + self.timeout)
            except (OSError, http.client.HTTPException) as e:
                raise ConnectionFailed(f"{self.url}: {str(e) or type(e).__name__}") from e
            if resp.status != 200 or not resp.getheader("Content-Type", "").startswith("text/event-stream"):
                body = resp.read().decode("utf-8", "replace")
                raise error_from_response(resp.status, body, resp.getheader("Retry-After"))
            parser = SseParser()
            while True:
                try:
                    raw = resp.readline()
                except (OSError, http.client.HTTPException) as e:
                    raise ConnectionFailed(f"{self.url}: the stream broke while waiting: {e}") from e
                if not raw:
                    raise ConnectionFailed(f"{self.url}: the server ended the stream before a decision")
                ev = parser.feed_line(raw.decode("utf-8", "replace"))
                if ev is None:
                    continue
                name, text = ev
                data = parse_json(text)
                if name == "queued":
                    if on_queued is not None:
                        on_queued(queue_status(data))
                elif name == "granted":
                    sock.settimeout(None)
                    return Permit(limiter, data if isinstance(data, dict) else {}, conn, sock, resp, on_lost)
                elif name == "rejected":
                    raise rejected_event(data)
        except BaseException:
            # Cancels the wait (or releases a grant that raced this exit).
            if sock is not None:
                try:
                    sock.shutdown(socket.SHUT_RDWR)
                except OSError:
                    pass
                sock.close()
            conn.close()
            raise

    def acquire_lease(
        self,
        limiter: str,
        *,
        lease: Optional[Seconds] = None,
        max_wait: Optional[Seconds] = None,
        tenant: Optional[str] = None,
        weight: Optional[int] = None,
    ) -> Lease:
        """The JSON long poll: waits, then returns a ``Lease`` held until
        ``release()`` or until ``lease`` (default: the server's) runs out."""
        query = acquire_query(max_wait, tenant, weight, lease)
        wait_ms = query["max_wait_ms"]
        body = self._call(
            "POST",
            "v1",
            "limiters",
            limiter,
            "acquire",
            query=query,
            timeout=None if wait_ms is None else wait_ms / 1000.0 + self.timeout,
        )
        return Lease(self, limiter, body)

    # -- status, admin, operations -------------------------------------------
    def limiters(self) -> List[Dict[str, Any]]:
        """Every limiter with its settings, in_use and queued (GET /v1/limiters)."""
        return list(self._call("GET", "v1", "limiters").get("limiters", []))

    def limiter(self, name: str) -> Dict[str, Any]:
        """One limiter, with its ``holders`` and ``queue``."""
        return self._call("GET", "v1", "limiters", name)

    def configure(self, name: str, *, token: Optional[str] = None, **changes: Any) -> Dict[str, Any]:
        """PUT /v1/limiters/NAME: ``max_concurrent``, ``max_wait_ms``, ``max_queue``,
        ``enabled``, ``tenant_fairness``, ``max_per_tenant``; returns the new settings."""
        token = token or self.admin_token
        headers = {"Authorization": f"Bearer {token}"} if token else {}
        return self._call("PUT", "v1", "limiters", name, body=changes, headers=headers)

    def health(self) -> Dict[str, Any]:
        """GET /healthz; also its body when the server answers 503 (``status`` tells)."""
        return self._call("GET", "healthz", accept_status=(200, 503))

    # -- rate limits (docs/ratelimit.md, "In fairgate serve") ------------------
    def rate_limit(self, rule: str, key: str, cost: int = 1) -> Dict[str, Any]:
        """POST /v1/ratelimit/RULE: takes ``cost`` units for ``key``. Returns the
        decision either way: ``allowed``, ``remaining``, ``reset_ms``,
        ``retry_after_ms`` (-1: the cost can never pass) and, when allowed, the
        ``decision`` to name in refund(). Bad input raises ApiError."""
        return self._call("POST", "v1", "ratelimit", rule, body={"key": key, "cost": cost}, accept_status=(200, 429))

    def refund(self, rule: str, key: str, decision: str, amount: int) -> int:
        """POST /v1/ratelimit/RULE/refund: gives back unused units of an allowed
        decision; returns how many came back (0 once too late)."""
        body = {"key": key, "decision": decision, "amount": amount}
        return int(self._call("POST", "v1", "ratelimit", rule, "refund", body=body).get("refunded", 0))

    def rate_rules(self) -> List[Dict[str, Any]]:
        """GET /v1/ratelimit: every rule with this instance's counters."""
        return list(self._call("GET", "v1", "ratelimit").get("rules", []))

    def events(self) -> Any:
        """GET /v1/events: yields each snapshot (the body of ``limiters()``) until the caller stops."""
        conn = self._connection()
        try:
            conn.request("GET", self._base.path("v1", "events"), headers={"Accept": "text/event-stream"})
            resp = conn.getresponse()
            if resp.status != 200:
                raise error_from_response(resp.status, resp.read().decode("utf-8", "replace"))
            parser = SseParser()
            while True:
                raw = resp.readline()
                if not raw:
                    return
                ev = parser.feed_line(raw.decode("utf-8", "replace"))
                if ev is not None and ev[0] == "snapshot":
                    yield parse_json(ev[1])
        except (OSError, http.client.HTTPException) as e:
            raise ConnectionFailed(f"{self.url}: {e}") from e
        finally:
            conn.close()

    # -- plumbing ------------------------------------------------------------
    def _connection(self, timeout: Optional[float] = -1.0) -> http.client.HTTPConnection:
        t = self.timeout if timeout == -1.0 else timeout
        if self._base.tls:
            return http.client.HTTPSConnection(self._base.host, self._base.port, timeout=t, context=self._ssl)
        return http.client.HTTPConnection(self._base.host, self._base.port, timeout=t)

    def _call(
        self,
        method: str,
        *segments: str,
        query: Optional[Dict[str, Any]] = None,
        body: Optional[Dict[str, Any]] = None,
        headers: Optional[Dict[str, str]] = None,
        timeout: Optional[float] = -1.0,
        accept_status: tuple = (200, 204),
    ) -> Dict[str, Any]:
        conn = self._connection(self.timeout if timeout is None else timeout)
        try:
            h = {"Accept": "application/json", "User-Agent": user_agent()}
            h.update(headers or {})
            data = None
            if body is not None:
                data = json.dumps(body).encode()
                h["Content-Type"] = "application/json"
            conn.connect()
            if timeout is None and conn.sock is not None:
                conn.sock.settimeout(None)
            conn.request(method, self._base.path(*segments, query=query), body=data, headers=h)
            resp = conn.getresponse()
            text = resp.read().decode("utf-8", "replace")
        except (OSError, http.client.HTTPException) as e:
            raise ConnectionFailed(f"{self.url}: {str(e) or type(e).__name__}") from e
        finally:
            conn.close()
        if resp.status not in accept_status:
            raise error_from_response(resp.status, text, resp.getheader("Retry-After"))
        doc = parse_json(text)
        if resp.status != 204 and not isinstance(doc, dict):
            raise FairgateError("bad_response", f"expected a JSON object, got {text[:100]!r}", resp.status)
        return doc or {}

    def __repr__(self) -> str:
        return f"<fairgate.Client {self.url}>"


__all__ = ["Client", "Permit", "Lease", "to_ms"]
