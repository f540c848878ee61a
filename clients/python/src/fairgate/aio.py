"""The asyncio client: ``AsyncClient``, ``AsyncPermit`` and ``AsyncLease``.

Same contract as the blocking client (fairgate.client): an ``AsyncPermit``
owns one open connection and the server holds the permit exactly as long as
it is open. Cancelling the task that waits in ``acquire`` (``asyncio.timeout``,
``task.cancel()``, a client that went away) closes the connection, which
cancels the request on the server. HTTP/1.1 is spoken directly on asyncio
streams (``Content-Length``, chunked and close-delimited bodies).
"""

from __future__ import annotations

import asyncio
import inspect
import json
import socket
import ssl
import time
from typing import Any, Awaitable, Callable, Dict, Generator, List, Optional, Tuple, Union

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
    user_agent,
)

OnQueued = Callable[[QueueStatus], Union[None, Awaitable[None]]]


class _Body:
    """Reads one response body: by Content-Length, chunked, or until the connection closes."""

    def __init__(self, reader: asyncio.StreamReader, headers: Dict[str, str]) -> None:
        self._reader = reader
        self._chunked = "chunked" in headers.get("transfer-encoding", "").lower()
        length = headers.get("content-length")
        self._left: Optional[int] = int(length) if length is not None and not self._chunked else None
        self._chunk_left = 0
        self._done = False
        self._buf = b""

    async def _more(self) -> bytes:
        if self._done:
            return b""
        if self._chunked:
            if self._chunk_left == 0:
                size_line = await self._reader.readline()
                if not size_line:
                    self._done = True
                    return b""
                size = int(size_line.split(b";")[0].strip() or b"0", 16)
                if size == 0:
                    await self._reader.readline()
                    self._done = True
                    return b""
                self._chunk_left = size
            data = await self._reader.read(self._chunk_left)
            if not data:
                self._done = True
                return b""
            self._chunk_left -= len(data)
            if self._chunk_left == 0:
                await self._reader.readline()  # the CRLF after each chunk
            return data
        if self._left is not None:
            if self._left == 0:
                self._done = True
                return b""
            data = await self._reader.read(min(self._left, 65536))
            if not data:
                self._done = True
            self._left -= len(data)
            return data
        data = await self._reader.read(65536)
        if not data:
            self._done = True
        return data

    async def readline(self) -> bytes:
        while b"\n" not in self._buf:
            more = await self._more()
            if not more:
                line, self._buf = self._buf, b""
                return line
            self._buf += more
        line, _, self._buf = self._buf.partition(b"\n")
        return line + b"\n"

    async def read_all(self, limit: int = 4 << 20) -> bytes:
        out = self._buf
        self._buf = b""
        while len(out) < limit:
            more = await self._more()
            if not more:
                break
            out += more
        return out


class AsyncPermit:
    """A granted permit, held while its stream is open: ``async with`` or
    ``await permit.release()`` (idempotent). ``lost`` / ``wait_lost()`` as in
    ``fairgate.Permit``."""

    def __init__(
        self,
        limiter: str,
        data: Dict[str, Any],
        writer: asyncio.StreamWriter,
        body: _Body,
        on_lost: Optional[Callable[["AsyncPermit"], Any]],
    ) -> None:
        self.limiter = limiter
        self.id: str = str(data.get("permit", ""))
        self.ticket: Optional[str] = data.get("ticket")
        waited = data.get("waited_ms", 0)
        self.waited: float = waited / 1000.0 if isinstance(waited, (int, float)) else 0.0
        self.granted_at = time.monotonic()
        self._writer = writer
        self._body = body
        self._on_lost = on_lost
        self._released = False
        self._lost = asyncio.Event()
        self._watcher = asyncio.ensure_future(self._watch())

    async def _watch(self) -> None:
        try:
            while await self._body.readline():
                pass
        except (OSError, ValueError, asyncio.IncompleteReadError):
            pass
        if self._released:
            return
        self._lost.set()
        if self._on_lost is not None:
            result = self._on_lost(self)
            if inspect.isawaitable(result):
                await result

    @property
    def released(self) -> bool:
        return self._released

    @property
    def lost(self) -> bool:
        return self._lost.is_set()

    async def wait_lost(self) -> None:
        """Returns when the server ended the stream while the permit was held."""
        await self._lost.wait()

    async def release(self) -> None:
        """Gives the permit back (closes the stream). Safe to call again."""
        if self._released:
            return
        self._released = True
        if asyncio.current_task() is not self._watcher:
            self._watcher.cancel()
        self._writer.close()
        try:
            await self._writer.wait_closed()
        except (OSError, asyncio.CancelledError):
            pass

    async def __aenter__(self) -> "AsyncPermit":
        return self

    async def __aexit__(self, *exc: Any) -> None:
        await self.release()

    def __repr__(self) -> str:
        state = "released" if self._released else "lost" if self.lost else "held"
        return f"<fairgate.AsyncPermit {self.limiter}/{self.id} {state} waited={self.waited:.3f}s>"


class AsyncLease:
    """A JSON permit (long poll); see ``fairgate.Lease``."""

    def __init__(self, client: "AsyncClient", limiter: str, data: Dict[str, Any]) -> None:
        self._client = client
        self.limiter = limiter
        self.id: str = str(data.get("permit", ""))
        self.lease: float = data.get("lease_ms", 0) / 1000.0
        self.waited: float = data.get("waited_ms", 0) / 1000.0
        self.granted_at = time.monotonic()
        self._released = False

    async def renew(self) -> float:
        body = await self._client._call("POST", "v1", "permits", self.id, "renew")
        self.lease = body.get("lease_ms", 0) / 1000.0
        return self.lease

    async def release(self) -> bool:
        if self._released:
            return True
        self._released = True
        try:
            await self._client._call("DELETE", "v1", "permits", self.id)
            return True
        except ApiError as e:
            if e.status == 404:
                return False
            raise

    async def __aenter__(self) -> "AsyncLease":
        return self

    async def __aexit__(self, *exc: Any) -> None:
        await self.release()


class _Acquiring:
    """What ``AsyncClient.acquire`` returns: ``await`` it for the permit, or
    ``async with`` it to hold the permit for the block."""

    def __init__(self, coro: Awaitable[AsyncPermit]) -> None:
        self._coro = coro
        self._permit: Optional[AsyncPermit] = None

    def __await__(self) -> Generator[Any, None, AsyncPermit]:
        return self._coro.__await__()

    async def __aenter__(self) -> AsyncPermit:
        self._permit = await self._coro
        return self._permit

    async def __aexit__(self, *exc: Any) -> None:
        if self._permit is not None:
            await self._permit.release()


class AsyncClient:
    """A fairgate server at ``url``, from asyncio. Same arguments as ``fairgate.Client``."""

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
        self._ssl: Union[None, bool, ssl.SSLContext] = (ssl_context or True) if self._base.tls else None

    def acquire(
        self,
        limiter: str,
        *,
        max_wait: Optional[Seconds] = None,
        tenant: Optional[str] = None,
        weight: Optional[int] = None,
        on_queued: Optional[OnQueued] = None,
        on_lost: Optional[Callable[[AsyncPermit], Any]] = None,
    ) -> _Acquiring:
        """``async with client.acquire("chat") as permit:`` or ``permit = await client.acquire("chat")``.

        ``on_queued`` may be a plain function or a coroutine function. Raises
        ``Rejected``, ``ApiError`` or ``ConnectionFailed`` like ``Client.acquire``.
        """
        return _Acquiring(self._acquire(limiter, max_wait, tenant, weight, on_queued, on_lost))

    async def _acquire(
        self,
        limiter: str,
        max_wait: Optional[Seconds],
        tenant: Optional[str],
        weight: Optional[int],
        on_queued: Optional[OnQueued],
        on_lost: Optional[Callable[[AsyncPermit], Any]],
    ) -> AsyncPermit:
        query = acquire_query(max_wait, tenant, weight)
        wait_ms = query["max_wait_ms"]
        path = self._base.path("v1", "limiters", limiter, "acquire", query=query)
        reader, writer = await self._open()
        try:
            try:
                self._send(writer, "POST", path, {"Accept": "text/event-stream", "Content-Length": "0"}, b"")
                status, headers = await asyncio.wait_for(self._read_head(reader), self.timeout)
            except (OSError, asyncio.TimeoutError, asyncio.IncompleteReadError, ValueError) as e:
                raise ConnectionFailed(f"{self.url}: {str(e) or type(e).__name__}") from e
            body = _Body(reader, headers)
            if status != 200 or not headers.get("content-type", "").startswith("text/event-stream"):
                text = (await body.read_all()).decode("utf-8", "replace")
                raise error_from_response(status, text, headers.get("retry-after"))
            parser = SseParser()
            deadline = None if wait_ms is None else time.monotonic() + wait_ms / 1000.0 + self.timeout
            while True:
                try:
                    left = None if deadline is None else max(0.0, deadline - time.monotonic())
                    raw = await asyncio.wait_for(body.readline(), left)
                except (OSError, asyncio.TimeoutError, ValueError) as e:
                    raise ConnectionFailed(f"{self.url}: the stream broke while waiting: {e!r}") from e
                if not raw:
                    raise ConnectionFailed(f"{self.url}: the server ended the stream before a decision")
                ev = parser.feed_line(raw.decode("utf-8", "replace"))
                if ev is None:
                    continue
                name, text = ev
                data = parse_json(text)
                if name == "queued":
                    if on_queued is not None:
                        result = on_queued(queue_status(data))
                        if inspect.isawaitable(result):
                            await result
                elif name == "granted":
                    return AsyncPermit(limiter, data if isinstance(data, dict) else {}, writer, body, on_lost)
                elif name == "rejected":
                    raise rejected_event(data)
        except BaseException:
            writer.close()  # cancels the wait on the server (CancelledError included)
            raise

    async def acquire_lease(
        self,
        limiter: str,
        *,
        lease: Optional[Seconds] = None,
        max_wait: Optional[Seconds] = None,
        tenant: Optional[str] = None,
        weight: Optional[int] = None,
    ) -> AsyncLease:
        query = acquire_query(max_wait, tenant, weight, lease)
        wait_ms = query["max_wait_ms"]
        timeout = None if wait_ms is None else wait_ms / 1000.0 + self.timeout
        body = await self._call("POST", "v1", "limiters", limiter, "acquire", query=query, timeout=timeout)
        return AsyncLease(self, limiter, body)

    async def limiters(self) -> List[Dict[str, Any]]:
        return list((await self._call("GET", "v1", "limiters")).get("limiters", []))

    async def limiter(self, name: str) -> Dict[str, Any]:
        return await self._call("GET", "v1", "limiters", name)

    async def configure(self, name: str, *, token: Optional[str] = None, **changes: Any) -> Dict[str, Any]:
        token = token or self.admin_token
        headers = {"Authorization": f"Bearer {token}"} if token else {}
        return await self._call("PUT", "v1", "limiters", name, body=changes, headers=headers)

    async def health(self) -> Dict[str, Any]:
        return await self._call("GET", "healthz", accept_status=(200, 503))

    async def rate_limit(self, rule: str, key: str, cost: int = 1) -> Dict[str, Any]:
        """As Client.rate_limit: the decision, allowed or not."""
        return await self._call("POST", "v1", "ratelimit", rule, body={"key": key, "cost": cost}, accept_status=(200, 429))

    async def refund(self, rule: str, key: str, decision: str, amount: int) -> int:
        body = {"key": key, "decision": decision, "amount": amount}
        return int((await self._call("POST", "v1", "ratelimit", rule, "refund", body=body)).get("refunded", 0))

    async def rate_rules(self) -> List[Dict[str, Any]]:
        return list((await self._call("GET", "v1", "ratelimit")).get("rules", []))

    # -- plumbing ------------------------------------------------------------
    async def _open(self) -> Tuple[asyncio.StreamReader, asyncio.StreamWriter]:
        try:
            reader, writer = await asyncio.wait_for(
                asyncio.open_connection(self._base.host, self._base.port, ssl=self._ssl), self.timeout
            )
        except (OSError, asyncio.TimeoutError) as e:
            raise ConnectionFailed(f"{self.url}: cannot connect: {str(e) or type(e).__name__}") from e
        sock = writer.get_extra_info("socket")
        if sock is not None:
            try:
                sock.setsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY, 1)
                sock.setsockopt(socket.SOL_SOCKET, socket.SO_KEEPALIVE, 1)
                for name, value in (("TCP_KEEPIDLE", 30), ("TCP_KEEPINTVL", 10), ("TCP_KEEPCNT", 3)):
                    if hasattr(socket, name):
                        sock.setsockopt(socket.IPPROTO_TCP, getattr(socket, name), value)
            except OSError:
                pass
        return reader, writer

    def _send(self, writer: asyncio.StreamWriter, method: str, path: str, headers: Dict[str, str], body: bytes) -> None:
        h = {"Host": self._base.host_header, "User-Agent": user_agent(), "Connection": "close"}
        h.update(headers)
        head = f"{method} {path} HTTP/1.1\r\n" + "".join(f"{k}: {v}\r\n" for k, v in h.items()) + "\r\n"
        writer.write(head.encode("latin-1") + body)

    @staticmethod
    async def _read_head(reader: asyncio.StreamReader) -> Tuple[int, Dict[str, str]]:
        line = await reader.readline()
        parts = line.decode("latin-1").split(" ", 2)
        if len(parts) < 2 or not parts[0].startswith("HTTP/"):
            raise ValueError(f"not an HTTP response: {line[:80]!r}")
        status = int(parts[1])
        headers: Dict[str, str] = {}
        while True:
            h = await reader.readline()
            if h in (b"\r\n", b"\n", b""):
                break
            k, _, v = h.decode("latin-1").partition(":")
            headers[k.strip().lower()] = v.strip()
        return status, headers

    async def _call(
        self,
        method: str,
        *segments: str,
        query: Optional[Dict[str, Any]] = None,
        body: Optional[Dict[str, Any]] = None,
        headers: Optional[Dict[str, str]] = None,
        timeout: Optional[float] = -1.0,
        accept_status: tuple = (200, 204),
    ) -> Dict[str, Any]:
        t = self.timeout if timeout == -1.0 else timeout
        reader, writer = await self._open()
        try:
            data = b"" if body is None else json.dumps(body).encode()
            h = {"Accept": "application/json", "Content-Length": str(len(data))}
            if body is not None:
                h["Content-Type"] = "application/json"
            h.update(headers or {})
            self._send(writer, method, self._base.path(*segments, query=query), h, data)

            async def exchange() -> Tuple[int, Dict[str, str], bytes]:
                status, rh = await self._read_head(reader)
                return status, rh, await _Body(reader, rh).read_all()

            status, rh, raw = await asyncio.wait_for(exchange(), t)
        except (OSError, asyncio.TimeoutError, asyncio.IncompleteReadError, ValueError) as e:
            raise ConnectionFailed(f"{self.url}: {str(e) or type(e).__name__}") from e
        finally:
            writer.close()
        text = raw.decode("utf-8", "replace")
        if status not in accept_status:
            raise error_from_response(status, text, rh.get("retry-after"))
        doc = parse_json(text)
        if status != 204 and not isinstance(doc, dict):
            raise FairgateError("bad_response", f"expected a JSON object, got {text[:100]!r}", status)
        return doc or {}

    def __repr__(self) -> str:
        return f"<fairgate.AsyncClient {self.url}>"


__all__ = ["AsyncClient", "AsyncPermit", "AsyncLease"]
