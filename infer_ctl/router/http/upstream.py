"""A minimal keep-alive HTTP/1.1 client for talking to workers, built on asyncio.Protocol.

Why not aiohttp's client: every routed PD request makes two upstream calls, and aiohttp's client costs
about as much CPU per call as the rest of the router together (measured, docs/router.md). This client
does exactly what the router needs: POST/GET with a byte body, responses framed by Content-Length,
chunked encoding or connection close, body read whole or chunk by chunk with flow control (reading
from the worker pauses while the consumer - the client socket - is slow: back-pressure end to end).

A connection goes back to the pool only after its response was read completely; anything else
(cancellation, timeout, error, early close) closes it, which is also how a cancelled client request
is propagated to the worker (SGLang aborts a request whose connection closed).
"""

from __future__ import annotations

import asyncio
from collections import deque
from collections.abc import Awaitable
from urllib.parse import urlsplit

_HIGH_WATER = 256 * 1024
#: what bytes.strip() strips (str.strip() would also strip \x85 and \xa0 of a latin-1 header value)
_WS = " \t\n\r\x0b\x0c"


class UpstreamError(Exception):
    """Transport-level failure talking to a worker (connect, reset, protocol)."""


class _Conn(asyncio.Protocol):
    def __init__(self, pool: Pool) -> None:
        self.pool = pool
        self.transport: asyncio.Transport | None = None
        self.buf = bytearray()
        self.state = "idle"
        self.headers_fut: asyncio.Future[None] | None = None
        self.status = 0
        self.headers: dict[str, str] = {}
        self.remaining = 0
        self.chunks: deque[bytes] = deque()
        self.buffered = 0
        self.waiter: asyncio.Future[None] | None = None
        self.done = False
        self.error: BaseException | None = None
        self.keep_alive = True
        self.paused = False
        self.closed = False

    # ---- asyncio.Protocol ----------------------------------------------------------------------
    def connection_made(self, transport: asyncio.BaseTransport) -> None:
        self.transport = transport  # type: ignore[assignment]  # uvloop's transports are not asyncio.Transport subclasses

    def connection_lost(self, exc: Exception | None) -> None:
        self.closed = True
        if self.state == "until_close":
            self._finish()
        elif self.state != "idle" and not self.done:
            self._fail(UpstreamError(f"connection to {self.pool.authority} lost: {exc or 'closed by peer'}"))
        self.pool._discard(self)

    def data_received(self, data: bytes) -> None:
        if self.state == "idle":
            return  # unsolicited bytes on an idle connection: it will be closed when reused
        self.buf += data
        try:
            self._parse()
        except UpstreamError as exc:
            self._fail(exc)
            self.close()

    # ---- parsing -------------------------------------------------------------------------------
    def _parse(self) -> None:
        while self.buf:
            if self.state == "headers":
                end = self.buf.find(b"\r\n\r\n")
                if end < 0:
                    if len(self.buf) > 65536:
                        raise UpstreamError("response headers too large")
                    return
                self._headers(bytes(self.buf[:end]))
                del self.buf[: end + 4]
                if self.state == "idle":  # 1xx: keep looking
                    self.state = "headers"
                    continue
            elif self.state == "length":
                take = min(self.remaining, len(self.buf))
                self._push(bytes(self.buf[:take]))
                del self.buf[:take]
                self.remaining -= take
                if self.remaining == 0:
                    self._finish()
                return
            elif self.state == "until_close":
                self._push(bytes(self.buf))
                self.buf.clear()
                return
            elif self.state == "chunk_size":
                nl = self.buf.find(b"\r\n")
                if nl < 0:
                    return
                try:
                    size = int(bytes(self.buf[:nl]).split(b";", 1)[0].strip(), 16)
                except ValueError:
                    raise UpstreamError("bad chunk size from worker") from None
                del self.buf[: nl + 2]
                if size == 0:
                    self.state = "trailers"
                else:
                    self.remaining = size
                    self.state = "chunk_data"
            elif self.state == "chunk_data":
                take = min(self.remaining, len(self.buf))
                if take:
                    self._push(bytes(self.buf[:take]))
                    del self.buf[:take]
                    self.remaining -= take
                if self.remaining:
                    return
                self.state = "chunk_crlf"
            elif self.state == "chunk_crlf":
                if len(self.buf) < 2:
                    return
                del self.buf[:2]
                self.state = "chunk_size"
            elif self.state == "trailers":
                nl = self.buf.find(b"\r\n")
                if nl < 0:
                    return
                line = self.buf[:nl]
                del self.buf[: nl + 2]
                if not line:
                    self._finish()
                    return
            else:
                return

    def _headers(self, raw: bytes) -> None:
        # decoded once (latin-1: every byte is one character), then split: two upstream heads per PD request
        lines = raw.decode("latin-1").split("\r\n")
        parts = lines[0].split(" ", 2)
        try:
            self.status = int(parts[1])
        except (IndexError, ValueError):
            raise UpstreamError(f"bad status line from worker: {lines[0][:80]!r}") from None
        if 100 <= self.status < 200:
            self.state = "idle"
            return
        headers: dict[str, str] = {}
        for line in lines[1:]:
            k, _, v = line.partition(":")
            headers[k.strip(_WS).lower()] = v.strip(_WS)
        self.headers = headers
        if headers.get("connection", "").lower() == "close":
            self.keep_alive = False
        if "chunked" in headers.get("transfer-encoding", "").lower():
            self.state = "chunk_size"
        elif "content-length" in headers:
            self.remaining = int(headers["content-length"])
            self.state = "length"
            if self.remaining == 0 or self.method == "HEAD":
                self._finish()
        elif self.status in (204, 304):
            self._finish()
        else:
            self.state = "until_close"
            self.keep_alive = False
        if self.headers_fut is not None and not self.headers_fut.done():
            self.headers_fut.set_result(None)

    method = "GET"

    def _push(self, data: bytes) -> None:
        self.chunks.append(data)
        self.buffered += len(data)
        if self.buffered > _HIGH_WATER and not self.paused and self.transport is not None:
            self.transport.pause_reading()
            self.paused = True
        self._wake()

    def _finish(self) -> None:
        self.done = True
        self.state = "complete"
        if self.headers_fut is not None and not self.headers_fut.done():
            self.headers_fut.set_result(None)
        self._wake()

    def _fail(self, exc: BaseException) -> None:
        self.error = exc
        self.done = True
        if self.headers_fut is not None and not self.headers_fut.done():
            self.headers_fut.set_exception(exc)
        self._wake()

    def _wake(self) -> None:
        if self.waiter is not None and not self.waiter.done():
            self.waiter.set_result(None)

    def close(self) -> None:
        if self.transport is not None and not self.closed:
            self.closed = True
            self.transport.close()
        self.pool._discard(self)

    # ---- consumer side -------------------------------------------------------------------------
    async def next_chunk(self) -> bytes | None:
        while not self.chunks:
            if self.error is not None:
                raise self.error
            if self.done:
                return None
            self.waiter = asyncio.get_running_loop().create_future()
            await self.waiter
            self.waiter = None
        # everything that arrived, in one piece: a relay writes it to its client in one socket write
        chunks = self.chunks
        if len(chunks) == 1:
            data = chunks.popleft()
        else:
            data = b"".join(chunks)
            chunks.clear()
        self.buffered -= len(data)
        if self.paused and self.buffered < _HIGH_WATER // 2 and self.transport is not None:
            self.transport.resume_reading()
            self.paused = False
        return data


class Response:
    """A worker's response. Read it whole (`read`) or chunk by chunk (`next_chunk`, None at the end);
    then call `release()` (done by `read`: the connection goes back to the pool when the body was read
    to the end) or `close()`."""

    def __init__(self, conn: _Conn) -> None:
        self._conn = conn
        self.status = conn.status
        self.headers = conn.headers
        self._released = False

    async def read(self) -> bytes:
        parts = []
        while True:
            chunk = await self._conn.next_chunk()
            if chunk is None:
                break
            parts.append(chunk)
        self.release()
        return b"".join(parts)

    def next_chunk(self) -> Awaitable[bytes | None]:
        """The next piece of the body as it arrived (None once it is complete); raises UpstreamError when
        the connection broke. Reading resumes from the worker as the consumer takes chunks (flow control)."""
        return self._conn.next_chunk()  # the connection's coroutine itself: no extra frame per chunk

    @property
    def complete(self) -> bool:
        """Whether the whole body arrived and every piece of it was taken (`next_chunk` gives None next)."""
        conn = self._conn
        return conn.done and conn.error is None and not conn.chunks

    def release(self) -> None:
        if self._released:
            return
        self._released = True
        conn = self._conn
        if conn.done and conn.error is None and conn.keep_alive and not conn.closed and not conn.chunks:
            conn.pool._put_back(conn)
        else:
            conn.close()

    def close(self) -> None:
        if not self._released:
            self._released = True
            self._conn.close()


class Pool:
    """Idle keep-alive connections to one worker (host:port)."""

    def __init__(self, host: str, port: int, *, max_idle: int = 256, unix: str | None = None) -> None:
        self.host = host
        self.port = port
        self.unix = unix  # a unix socket path instead of host:port (the router's internal admin app)
        self.authority = host if unix else f"{host}:{port}"
        self.max_idle = max_idle
        self._idle: list[_Conn] = []
        self._all: set[_Conn] = set()
        self._prefixes: dict[tuple[str, str, bool], bytes] = {}
        #: closed on purpose (its worker removed, or unhealthy: Upstreams.drop): a response finished later
        #: closes its connection instead of leaving it idle in a pool nobody uses, and a request whose
        #: connection that close broke fails, never re-sent to the worker on a fresh one
        self.closed = False

    def _discard(self, conn: _Conn) -> None:
        self._all.discard(conn)
        if conn in self._idle:
            self._idle.remove(conn)

    def _put_back(self, conn: _Conn) -> None:
        conn.state = "idle"
        conn.done = False
        conn.headers_fut = None
        conn.buf.clear()
        if self.closed or len(self._idle) >= self.max_idle:
            conn.close()
            return
        self._idle.append(conn)

    async def _get(self) -> tuple[_Conn, bool]:
        while self._idle:
            conn = self._idle.pop()
            if not conn.closed:
                return conn, True
        loop = asyncio.get_running_loop()
        try:
            if self.unix is not None:
                _, proto = await loop.create_unix_connection(lambda: _Conn(self), self.unix)
            else:
                _, proto = await loop.create_connection(lambda: _Conn(self), self.host, self.port)
        except OSError as exc:
            raise UpstreamError(f"cannot connect to {self.authority}: {exc.strerror or exc}") from None
        self._all.add(proto)
        return proto, False

    def _head(self, method: str, path: str, length: int, headers: dict[str, str] | None) -> bytes:
        """The request head; its fixed part is built once per (method, path): this runs twice per PD request."""
        # SGLang answers a body without `Content-Type: application/json` with 400 ("Unsupported Media
        # Type" on the OpenAI routes, a validation error on /generate): every body the router sends is JSON,
        # so it says so unless the caller passes its own type (the admin relay passes the client's).
        typed = bool(length) and not (headers and any(k.lower() == "content-type" for k in headers))
        prefix = self._prefixes.get((method, path, typed))
        if prefix is None:
            ctype = "Content-Type: application/json\r\n" if typed else ""
            prefix = self._prefixes[(method, path, typed)] = (
                f"{method} {path} HTTP/1.1\r\nHost: {self.authority}\r\n{ctype}".encode("latin-1"))
        extra = "".join([f"{k}: {v}\r\n" for k, v in headers.items()]).encode("latin-1") if headers else b""
        return b"%sContent-Length: %d\r\n%s\r\n" % (prefix, length, extra)

    async def request(self, method: str, path: str, body: bytes = b"", headers: dict[str, str] | None = None) -> Response:
        """Send a request; returns once the status line and headers arrived. A reused keep-alive
        connection that turns out closed by the worker is retried once on a fresh one (nothing was
        processed: the worker closed it while idle)."""
        for attempt in (0, 1):
            conn, reused = await self._get()
            conn.method = method
            conn.state = "headers"
            conn.status = 0
            conn.headers = {}
            conn.chunks.clear()
            conn.buffered = 0
            conn.error = None
            conn.done = False
            conn.keep_alive = True
            conn.headers_fut = asyncio.get_running_loop().create_future()
            assert conn.transport is not None
            if conn.closed or conn.transport.is_closing():
                conn.close()
                if attempt == 0:
                    continue
                raise UpstreamError(f"connection to {self.authority} closed")
            conn.transport.write(self._head(method, path, len(body), headers) + body)
            try:
                await conn.headers_fut
            except UpstreamError:
                conn.close()
                if reused and attempt == 0 and conn.status == 0 and not conn.buf and not self.closed:
                    continue
                raise
            except BaseException:
                conn.close()
                raise
            return Response(conn)
        raise UpstreamError(f"cannot reach {self.authority}")

    def close(self) -> None:
        self.closed = True
        for conn in list(self._all):
            conn.close()
        self._idle.clear()


class Upstreams:
    """One pool per worker URL."""

    def __init__(self) -> None:
        self._pools: dict[str, Pool] = {}

    def pool(self, url: str) -> Pool:
        pool = self._pools.get(url)
        if pool is None:
            parts = urlsplit(url)
            if parts.scheme not in ("http", "") or not parts.hostname:
                raise UpstreamError(f"unsupported worker URL {url!r}: use http://host:port")
            pool = self._pools[url] = Pool(parts.hostname, parts.port or 80)
        return pool

    def request(self, url: str, method: str, path: str, body: bytes = b"",
                headers: dict[str, str] | None = None) -> Awaitable[Response]:
        """The pool's own coroutine (no extra frame: two of these per PD request); raises UpstreamError
        at once for a URL it cannot serve."""
        return self.pool(url).request(method, path, body, headers)

    async def fetch(self, url: str, method: str, path: str, body: bytes = b"",
                    headers: dict[str, str] | None = None) -> tuple[int, bytes]:
        resp = await self.request(url, method, path, body, headers)
        try:
            return resp.status, await resp.read()
        finally:
            resp.close()

    def drop(self, url: str) -> None:
        pool = self._pools.pop(url, None)
        if pool is not None:
            pool.close()

    def close(self) -> None:
        for pool in self._pools.values():
            pool.close()
        self._pools.clear()
