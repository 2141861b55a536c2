"""The router's HTTP/1.1 server for the data plane: asyncio.Protocol + httptools (llhttp, the parser
uvicorn uses).

Why not aiohttp's server: on this project's 2-core machine a hello-world aiohttp server answers 4-8k
requests/s where this protocol answers ~20k (docs/router.md, "HTTP stack"); in the router that
difference is 15-25 % of the CPU of a routed request. The router needs a small subset of HTTP, which
this module implements completely:

- `Expect: 100-continue` (curl sends it for bodies over 1 KiB) answered at once; HEAD without a body;
- keep-alive (HTTP/1.1 default, HTTP/1.0 with `Connection: keep-alive`) and pipelining: requests are
  answered one at a time in order; reading pauses while more than a few are queued;
- request bodies by Content-Length or chunked; a body over `max_body` is answered 413 as soon as that is
  known (from the Content-Length header, before any body byte is read), then the rest is discarded for a
  moment and the connection closed (a lingering close, so the client sees the 413 rather than a reset);
- malformed HTTP, a URL or headers over 64 KiB, protocol upgrades (Upgrade, CONNECT): 400 with a JSON
  body, then close;
- a header that must appear once (`_SINGLE`: Authorization, Host) sent more than once: 400 with a JSON
  body naming it, for every path, before the handler sees the request (the headers dict keeps one value:
  which token was checked must not depend on which copy a later hop, such as the admin relay, reads);
- responses in one write (`Response`) or streamed with chunked encoding (`StreamResponse`), with
  back-pressure: `write` waits while the socket's write buffer is over its high-water mark, for at most
  WRITE_TIMEOUT_S; a client that stops reading for longer is aborted like one that disconnected;
- a client that disconnects cancels the task handling its request (which closes the upstream
  connections, which makes SGLang abort the request);
- `close_all()` for shutdown.

The API mirrors the subset of aiohttp's that the router uses (`Response`, `StreamResponse.prepare/
write/write_eof/prepared`), so handlers read the same either way.
"""

from __future__ import annotations

import asyncio
import fcntl
import socket
import struct
import termios
from collections import deque
from collections.abc import Awaitable, Callable
from http import HTTPStatus
from typing import Any

import httptools

from infer_ctl.router.http.jsonio import JSON_TYPE, error_body

_REASONS = {s.value: s.phrase.encode() for s in HTTPStatus}
_MAX_PIPELINED = 8
_LINGER_S = 1.0
_MAX_HEAD = 64 * 1024
#: headers a request may carry once (RFC 9110 11.6.2 gives Authorization one set of credentials; RFC
#: 9112 3.2: more than one Host is a 400), lower-case
_SINGLE = frozenset({"authorization", "host"})
_NONE: frozenset[str] = frozenset()
#: idle keep-alive connections are closed after this long (aiohttp's default too)
KEEPALIVE_S = 75.0
#: a request's head and body must arrive within this long of its first byte (slowloris: a client that
#: trickles a byte at a time would otherwise hold a connection and its buffers forever); answered 408
READ_TIMEOUT_S = 60.0
#: the longest a response may wait for the client to drain the socket (write back-pressure). A client that
#: keeps its connection open but stops reading would otherwise hold the handler, and with it the upstream
#: SGLang request and its KV slot, forever. After this the connection is aborted and the handler cancelled,
#: as when the client disconnects (the proxy counts it as 499). A module constant like the two above:
#: RouterConfig (router/config.py) has no client-write timeout (drain_timeout_s is the shutdown drain).
WRITE_TIMEOUT_S = 60.0


#: Linux's SIOCOUTQ: bytes the kernel still holds for the peer (not sent or not acknowledged)
_OUTQ = getattr(termios, "TIOCOUTQ", None)


def _reason(status: int) -> bytes:
    return _REASONS.get(status, b"Unknown")


class Request:
    """One parsed request. Header names are lower-case."""

    __slots__ = ("body", "conn", "content_length", "headers", "http10", "invalid", "method", "path", "query",
                 "repeated", "stream", "too_large")

    def __init__(self, method: str, path: str, query: str, headers: dict[str, str], conn: H1Connection) -> None:
        self.method = method
        self.path = path
        self.query = query
        self.headers = headers
        self.body = b""
        cl = headers.get("content-length")
        self.content_length: int | None = int(cl) if cl is not None and cl.isdigit() else None
        self.conn = conn
        self.too_large = False
        self.http10 = False
        #: why the request is answered 400 without reaching the handler (a repeated `_SINGLE` header)
        self.invalid: str | None = None
        #: header names the request carries more than once (`headers` holds the last value of each): a
        #: handler that needs one value refuses them (the tenant header, observe/tenants.py)
        self.repeated: frozenset[str] = _NONE
        #: the streamed response once one was prepared for this request: whether its content was delivered
        #: (`StreamResponse.delivered`) decides how a client's close is counted (proxy.py)
        self.stream: StreamResponse | None = None

    @property
    def peer(self) -> str | None:
        """The client's IP address (None on a unix socket)."""
        name = self.conn.transport.get_extra_info("peername") if self.conn.transport is not None else None
        return name[0] if isinstance(name, tuple) and name and isinstance(name[0], str) else None


class Response:
    """A whole response, written with one transport write."""

    __slots__ = ("body", "content_type", "headers", "status")
    prepared = False

    def __init__(self, status: int = 200, body: bytes = b"", content_type: str = JSON_TYPE,
                 headers: dict[str, str] | None = None) -> None:
        self.status = status
        self.body = body
        self.content_type = content_type
        self.headers = headers

    def encode(self, close: bool) -> bytes:
        head = b"HTTP/1.1 %d %s\r\nContent-Type: %s\r\nContent-Length: %d\r\n" % (
            self.status, _reason(self.status), self.content_type.encode("latin-1"), len(self.body))
        if self.headers:
            head += "".join(f"{k}: {v}\r\n" for k, v in self.headers.items()).encode("latin-1")
        if close:
            head += b"Connection: close\r\n"
        return head + b"\r\n" + self.body


class StreamResponse:
    """A response streamed with chunked transfer encoding (SSE relays)."""

    def __init__(self, status: int = 200, headers: dict[str, str] | None = None) -> None:
        self.status = status
        self.headers = headers or {}
        self.prepared = False
        self.finished = False
        #: False for an HTTP/1.0 client, which does not know chunked encoding: the close ends the stream
        self.chunked = True
        #: the content is complete at the client even if the chunked terminator never reaches it: an SSE
        #: stream's `data: [DONE]` was handed to the socket (set by the relay). The OpenAI SDK and
        #: `inferctl bench` close on [DONE], before the terminator: that is a success, not a 499.
        self.delivered = False
        #: the status the request ended with when not the head's: an error the router answered after the
        #: head went out (router/request/proxy.py `committed`), for the metrics and the request's log line
        self.outcome: int | None = None
        #: a body byte was handed to the socket (the head alone may go out first: relay.py `send_head`)
        self.body_started = False
        self._conn: H1Connection | None = None

    async def prepare(self, request: Request, first: bytes = b"") -> None:
        """Send the head; `first`: the body's first piece, sent with it in one write (a relayed stream
        has its first chunk before it commits: one socket write fewer per stream)."""
        conn = self._conn = request.conn
        request.stream = self
        self.chunked = not request.http10
        head = b"HTTP/1.1 %d %s\r\n" % (self.status, _reason(self.status))
        if self.chunked:
            head += b"Transfer-Encoding: chunked\r\n"
        head += "".join(f"{k}: {v}\r\n" for k, v in self.headers.items()).encode("latin-1")
        # pipelined requests may follow this one even when a later one asked for close
        if not self.chunked or (conn.close_after and not conn.pending):
            head += b"Connection: close\r\n"
        self.prepared = True
        self.body_started = bool(first)
        conn.out.write(head + b"\r\n" + (self._frame(first) if first else b""))
        await conn.out.drain()

    def _frame(self, data: bytes) -> bytes:
        return b"%x\r\n%b\r\n" % (len(data), data) if self.chunked else data

    async def write(self, data: bytes, last: bool = False) -> None:
        """Send one piece of the body; `last`: it is the final one, and the end of the stream goes in the
        same write (what `write_eof` would send next). Nothing is sent once the stream ended."""
        if self.finished or not (data or last):
            return
        assert self._conn is not None, "prepare() first"
        out = self._frame(data) if data else b""
        if data:
            self.body_started = True
        if last:
            self.finished = True
            if self.chunked:
                out += b"0\r\n\r\n"
        if out:
            self._conn.out.write(out)
        await self._conn.out.drain()

    async def write_eof(self) -> None:
        if self.finished or self._conn is None:
            return
        self.finished = True
        if not self.chunked:
            return
        self._conn.out.write(b"0\r\n\r\n")
        await self._conn.out.drain()


Handler = Callable[[Request], Awaitable["Response | StreamResponse"]]


class H1Server:
    """Owns the listening socket's connections; `handler` answers every request."""

    def __init__(self, handler: Handler, max_body: int, max_connections: int | None = None) -> None:
        self.handler = handler
        self.max_body = max_body
        self.conns: set[H1Connection] = set()
        #: past this many open connections a new one is answered 503 and closed (None: no cap)
        self.max_connections = max_connections
        #: connections refused by the cap so far, and those of them still lingering (below)
        self.refused = 0
        self.refusing = 0
        #: refused connections lingering at once (each holds a descriptor for up to _LINGER_S past the cap;
        #: the daemon sizes it beside the cap, daemon/nofile.py)
        self.max_refusing = 256
        self.server: asyncio.AbstractServer | None = None
        self._sweeper: asyncio.TimerHandle | None = None

    async def listen(self, host: str, port: int, backlog: int = 1024, reuse_port: bool = False) -> int:
        """`reuse_port`: SO_REUSEPORT, so several router processes bind the same address and the kernel
        spreads new connections over them (`router serve --processes N`)."""
        loop = asyncio.get_running_loop()
        self.server = await loop.create_server(lambda: H1Connection(self), host, port, backlog=backlog,
                                               reuse_address=True, reuse_port=reuse_port or None)
        self._sweep()
        return int(self.server.sockets[0].getsockname()[1])

    def _sweep(self) -> None:
        """Close keep-alive connections idle for KEEPALIVE_S, requests not received within READ_TIMEOUT_S and
        connections whose writes wait on the client for over WRITE_TIMEOUT_S (a sweep, not a timer per
        request: the timeouts hold to within half their length)."""
        loop = asyncio.get_running_loop()
        now = loop.time()
        for conn in list(self.conns):
            out = conn.out
            if out.paused_since is not None:
                if out.progressed():
                    out.paused_since = now  # a slow reader, but a reader: the wait starts over
                elif out.paused_since < now - WRITE_TIMEOUT_S:
                    out.timed_out()
            elif conn.reading_since is not None:
                if conn.reading_since < now - READ_TIMEOUT_S:
                    conn.read_timed_out()
            elif conn.task is None and not conn.pending and conn.last_active < now - KEEPALIVE_S:
                conn.close()
        self._sweeper = loop.call_later(min(15.0, KEEPALIVE_S / 2, READ_TIMEOUT_S / 2, WRITE_TIMEOUT_S / 2), self._sweep)

    def stop_listening(self) -> None:
        if self.server is not None:
            self.server.close()

    async def close_all(self) -> None:
        if self._sweeper is not None:
            self._sweeper.cancel()
        self.stop_listening()
        tasks = [c.task for c in self.conns if c.task is not None]
        for conn in list(self.conns):
            conn.close()
        if tasks:
            await asyncio.wait(tasks, timeout=5)
        if self.server is not None:
            await self.server.wait_closed()


class H1Connection(asyncio.Protocol):
    def __init__(self, server: H1Server) -> None:
        self.srv = server
        self.transport: Any = None
        self.parser = httptools.HttpRequestParser(self)
        self.url = b""
        self.hdrs: list[tuple[bytes, bytes]] = []
        self.parts: list[bytes] = []
        self.size = 0
        self.cur: Request | None = None
        self.pending: deque[Request] = deque()
        self.task: asyncio.Task[None] | None = None
        self.close_after = False
        self.discarding = False
        self.closed = False
        self.paused_reading = False
        #: the response bytes' way to the client, with back-pressure
        self.out = ClientWriter(self)
        self.head_bytes = 0
        self.last_active = 0.0
        #: loop time of the first byte of the request being received; None between requests
        self.reading_since: float | None = None
        #: answered 503 by the connection cap (`_refuse`), and whether it lingers (counted in srv.refusing)
        self.refused = False
        self.lingers = False

    # ---- transport events ------------------------------------------------------------------------
    def connection_made(self, transport: asyncio.BaseTransport) -> None:
        self.transport = transport
        srv = self.srv
        if srv.max_connections is not None and len(srv.conns) >= srv.max_connections:
            self._refuse()
            return
        self.last_active = asyncio.get_running_loop().time()
        sock = transport.get_extra_info("socket")
        if sock is not None:
            try:
                sock.setsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY, 1)
            except OSError:  # pragma: no cover - not a TCP socket
                pass
        self.srv.conns.add(self)

    def _refuse(self) -> None:
        """Over the connection cap: 503 with Retry-After, then close. Answered at once, before the client's
        request is read, so a client past the cap gets an answer its HTTP library retries, not a reset
        (an accept failing on EMFILE resets every new client). The refused connection is not in `conns`,
        so it never counts against the cap nor reaches a handler. Like the 413 it lingers, reading and
        dropping what the client sends (closing with unread data resets the connection before the client
        reads the 503) - up to `max_refusing` of them at a time, beyond which it is closed at once."""
        srv = self.srv
        srv.refused += 1
        self.refused = True
        self.discarding = True
        resp = Response(503, error_body(503, f"the router is at its limit of {srv.max_connections} open "
                                             "connections; retry in a second"), headers={"Retry-After": "1"})
        self.transport.write(resp.encode(True))
        if srv.refusing < srv.max_refusing:
            srv.refusing += 1
            self.lingers = True
            self._finish_close(True)
        else:
            self.close()

    def connection_lost(self, exc: Exception | None) -> None:
        if self.refused:
            self.closed = True
            if self.lingers:
                self.srv.refusing -= 1
            return
        self.closed = True
        self.srv.conns.discard(self)
        self.pending.clear()
        if self.task is not None and not self.task.done():
            self.task.cancel()  # the client went away: cancel its request (and so the upstream calls)
        self.out.wake(ConnectionResetError("client disconnected"))

    def data_received(self, data: bytes) -> None:
        # last_active is not refreshed here: only a request (on_message_begin) or an answer counts as
        # activity, so bytes that start no request (blank lines, a trickle) do not keep a connection open
        if self.discarding:
            return
        try:
            self.parser.feed_data(data)
        except httptools.HttpParserUpgrade:
            self._fatal(400, "protocol upgrades are not supported")
        except httptools.HttpParserError as exc:
            if not self.discarding:
                # a limit raised in a callback arrives wrapped ("User callback error"): report the limit
                cause = exc.__cause__ or exc.__context__
                self._fatal(400, f"malformed HTTP request: {cause if isinstance(cause, httptools.HttpParserError) else exc}")

    def pause_writing(self) -> None:
        self.out.pause()

    def resume_writing(self) -> None:
        self.out.resume()

    # ---- parser callbacks ------------------------------------------------------------------------
    def on_message_begin(self) -> None:
        self.url = b""
        self.hdrs = []
        self.parts = []
        self.size = 0
        self.cur = None
        self.head_bytes = 0
        self.reading_since = self.last_active = asyncio.get_running_loop().time()

    def on_url(self, url: bytes) -> None:
        self.url += url
        if len(self.url) > _MAX_HEAD:
            raise httptools.HttpParserError("URL too long")

    def on_header(self, name: bytes, value: bytes) -> None:
        self.hdrs.append((name, value))
        self.head_bytes += len(name) + len(value)
        if len(self.hdrs) > 200 or self.head_bytes > _MAX_HEAD:
            raise httptools.HttpParserError("request headers too large")

    def on_headers_complete(self) -> None:
        url = self.url.decode("latin-1")
        if not url.startswith("/") and "://" in url:
            # absolute form (RFC 9112 3.2.2: servers must accept it): route by its path
            url = "/" + url.partition("://")[2].partition("/")[2]
        path, _, query = url.partition("?")
        headers = {k.decode("latin-1").lower(): v.decode("latin-1") for k, v in self.hdrs}
        te = headers.get("transfer-encoding")
        if te is not None and te.strip().lower() != "chunked":
            # llhttp frames "gzip, chunked" as chunked and drops the gzip; the router only takes plain bodies
            raise httptools.HttpParserError(f"Transfer-Encoding {te!r} is not supported; send chunked or Content-Length")
        req = self.cur = Request(self.parser.get_method().decode("ascii"), path, query, headers, self)
        req.http10 = self.parser.get_http_version() == "1.0"
        if len(headers) < len(self.hdrs):  # some name repeats: a single-valued one must not
            names = [k.decode("latin-1").lower() for k, _ in self.hdrs]
            req.repeated = frozenset(n for n in names if names.count(n) > 1)
            dup = next((n for n in names if n in _SINGLE and n in req.repeated), None)
            if dup is not None:
                req.invalid = f"more than one {dup.title()} header; send it once"
        if req.content_length is not None and req.content_length > self.srv.max_body:
            self._too_large(req)
        elif headers.get("expect", "").lower() == "100-continue" and not self.closed:
            # curl sends this for bodies over 1 KiB and waits a second for it before sending the body
            self.transport.write(b"HTTP/1.1 100 Continue\r\n\r\n")

    def on_body(self, body: bytes) -> None:
        req = self.cur
        if req is None or req.too_large:
            return
        self.size += len(body)
        if self.size > self.srv.max_body:
            self.parts = []
            self._too_large(req)
            return
        self.parts.append(body)

    def on_message_complete(self) -> None:
        req = self.cur
        self.cur = None
        self.reading_since = None
        if req is None or req.too_large:
            return
        if self.parser.should_upgrade():
            return  # not handled: feed_data raises HttpParserUpgrade next, answered 400 (data_received)
        if self.parts:
            req.body = self.parts[0] if len(self.parts) == 1 else b"".join(self.parts)
            self.parts = []
        if not self.parser.should_keep_alive():
            self.close_after = True
        self._enqueue(req)

    # ---- request handling ------------------------------------------------------------------------
    def _too_large(self, req: Request) -> None:
        """Answer 413 now and stop reading the body (the handler produces the JSON error)."""
        req.too_large = True
        self.reading_since = None  # answered now; what is still sent is discarded until the close
        self.close_after = True
        self.discarding = True  # nothing after this request is parsed
        self._enqueue(req)

    def _enqueue(self, req: Request) -> None:
        if self.task is None:
            self.task = asyncio.get_running_loop().create_task(self._run(req))
        else:
            self.pending.append(req)
            if len(self.pending) >= _MAX_PIPELINED and not self.paused_reading and not self.closed:
                self.transport.pause_reading()
                self.paused_reading = True

    async def _run(self, req: Request | None) -> None:
        try:
            while req is not None:
                try:
                    resp: Response | StreamResponse
                    if req.invalid is not None and not req.too_large:
                        resp = Response(400, error_body(400, req.invalid))
                    else:
                        resp = await self.srv.handler(req)
                except asyncio.CancelledError:
                    raise
                except Exception:  # the handler's own safety net failed: still answer
                    stream = req.stream
                    if stream is None or not stream.prepared:
                        resp = Response(500, error_body(500, "internal router error; see the router's log"))
                    elif stream.finished:
                        resp = stream  # it was answered in full: nothing more to send
                    else:
                        # its stream's head went out: a second head would be read as a chunk of its body.
                        # The close leaves the body unfinished, which the client reports as incomplete
                        self.close()
                        return
                if self.closed:
                    return
                if isinstance(resp, Response):
                    close = self.close_after and not self.pending
                    data = resp.encode(close or req.too_large)
                    if req.method == "HEAD":
                        data = data[: len(data) - len(resp.body)]
                    self.out.write(data)
                    if self.out.paused:  # a client that does not read: wait before answering more
                        await self.out.drain()
                elif not resp.finished:  # a stream the handler did not end: end it
                    await resp.write_eof()
                if isinstance(resp, StreamResponse) and not resp.chunked:
                    self.pending.clear()  # close-delimited (HTTP/1.0): the close ends the response
                    self.close_after = True
                if self.close_after and not self.pending:
                    self._finish_close(req.too_large)
                    return
                req = self.pending.popleft() if self.pending else None
                if self.paused_reading and len(self.pending) < _MAX_PIPELINED // 2 and not self.closed:
                    self.transport.resume_reading()
                    self.paused_reading = False
        except (ConnectionError, asyncio.CancelledError):
            pass
        finally:
            self.task = None
            self.last_active = asyncio.get_running_loop().time()

    def _finish_close(self, linger: bool) -> None:
        if self.closed:
            return
        if linger:
            # Keep reading (and dropping) what the client is still sending, so that it reads the 413
            # instead of a connection reset; then close.
            self.discarding = True
            asyncio.get_running_loop().call_later(_LINGER_S, self.close)
            try:
                self.transport.write_eof()
            except (OSError, RuntimeError, NotImplementedError):
                self.close()
        else:
            self.close()

    def read_timed_out(self) -> None:
        """A request not received within READ_TIMEOUT_S: 408 when nothing is being answered, then close."""
        self.reading_since = None
        if self.task is None and not self.pending:
            self._fatal(408, f"request not received within {READ_TIMEOUT_S:g} s")
        else:
            self.discarding = True
            self.close_after = True  # answer what is in progress, then close

    def _fatal(self, status: int, message: str) -> None:
        self.discarding = True
        if self.task is None and not self.closed:
            self.out.write(Response(status, error_body(status, message)).encode(True))
            self._finish_close(True)  # lingering: the client may still be sending
        else:
            self.close_after = True  # answer what is in progress, then close

    def close(self) -> None:
        if not self.closed and self.transport is not None:
            self.transport.close()


class ClientWriter:
    """A connection's writing side: the response bytes to the client, with back-pressure (`drain` waits
    while the transport's buffer is over its high-water mark) and the write timeout's measures (the server's
    sweep aborts a connection whose client has taken nothing for WRITE_TIMEOUT_S)."""

    def __init__(self, conn: H1Connection) -> None:
        self.conn = conn
        self.paused = False
        #: loop time the transport's write buffer went over its high-water mark; None while it is below
        self.paused_since: float | None = None
        #: unsent() when last looked at while paused (nothing is added while paused, so it only shrinks)
        self.paused_size = 0
        self.drain_waiter: asyncio.Future[None] | None = None

    def pause(self) -> None:
        self.paused = True
        self.paused_since = asyncio.get_running_loop().time()
        self.paused_size = self.unsent()

    def resume(self) -> None:
        self.paused = False
        self.paused_since = None
        self.wake(None)

    def write(self, data: bytes) -> None:
        conn = self.conn
        if conn.closed or conn.transport.is_closing():
            raise ConnectionResetError("client disconnected")
        conn.transport.write(data)

    async def drain(self) -> None:
        if self.conn.closed:
            raise ConnectionResetError("client disconnected")
        if not self.paused:
            return
        waiter = self.drain_waiter = asyncio.get_running_loop().create_future()
        await waiter

    def wake(self, exc: BaseException | None) -> None:
        waiter = self.drain_waiter
        self.drain_waiter = None
        if waiter is not None and not waiter.done():
            if exc is None:
                waiter.set_result(None)
            else:
                waiter.set_exception(exc)

    def unsent(self) -> int:
        """Bytes of response not yet taken by the client: the transport's buffer plus the kernel's send
        queue. The kernel's queue (megabytes on loopback) counts too because the transport's buffer only
        shrinks once the kernel has room for a large part of it: a slow reader that keeps taking data
        shows progress there first."""
        size = int(self.conn.transport.get_write_buffer_size())
        sock = self.conn.transport.get_extra_info("socket")
        if _OUTQ is not None and sock is not None:
            try:
                size += struct.unpack("i", fcntl.ioctl(sock.fileno(), _OUTQ, b"\0\0\0\0"))[0]
            except OSError:  # pragma: no cover - not a socket the ioctl knows
                pass
        return size

    def progressed(self) -> bool:
        """Whether the client took any of the buffered response since the last look."""
        size = self.unsent()
        progressed = size < self.paused_size
        self.paused_size = size
        return progressed

    def timed_out(self) -> None:
        """The client has taken nothing for WRITE_TIMEOUT_S: abort (a close would wait for the buffer to
        flush, which it never does). connection_lost then cancels the handler's task, which cancels the
        upstream request, exactly as for a client that disconnected."""
        self.paused_since = None
        self.conn.discarding = True
        sock = self.conn.transport.get_extra_info("socket")
        if sock is not None:
            # linger 0: the close sends a reset and drops what the kernel still holds for the client,
            # instead of keeping it (and retrying it) for a client that does not read
            try:
                sock.setsockopt(socket.SOL_SOCKET, socket.SO_LINGER, struct.pack("ii", 1, 0))
            except OSError:  # pragma: no cover - not a TCP socket
                pass
        self.conn.transport.abort()
