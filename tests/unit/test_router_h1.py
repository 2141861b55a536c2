"""The router's data-plane HTTP/1.1 server (router/http/h1.py) over real loopback sockets: keep-alive, pipelining,
chunked request bodies, 413 before the body is read, JSON 400s on malformed HTTP (a URL over the limit,
protocol upgrades), the 500 safety net, streaming, and cancellation of the request's task when the client
disconnects. The handler here is a test one; the router's own behaviour on top of it is covered in
tests/router."""

from __future__ import annotations

import asyncio
import json
import socket
import threading
from collections.abc import Iterator

import pytest

from infer_ctl.aio import new_event_loop
from infer_ctl.router.http.h1 import H1Server, Request, Response, StreamResponse


class Served:
    def __init__(self) -> None:
        self.loop = new_event_loop()
        self.cancelled = threading.Event()
        self.firehose_ended: list[str] = []
        self.seen: list[tuple[str, str, bytes]] = []
        self.server = H1Server(self.handle, max_body=1000)
        threading.Thread(target=self.loop.run_forever, daemon=True).start()
        self.port = asyncio.run_coroutine_threadsafe(self.server.listen("127.0.0.1", 0), self.loop).result(5)

    async def handle(self, req: Request) -> Response | StreamResponse:
        self.seen.append((req.method, req.path, req.body))
        if req.too_large:
            return Response(413, b'{"error":"too large"}')
        if req.path == "/slow":
            await asyncio.sleep(0.2)
        if req.path == "/boom":  # a handler bug: the server's own safety net must still answer
            raise RuntimeError("handler bug")
        if req.path == "/boom_in_stream":  # a handler bug after its stream's head went out
            resp = StreamResponse(200, {"Content-Type": "text/event-stream"})
            await resp.prepare(req)
            await resp.write(b"data: 0\n\n")
            raise RuntimeError("handler bug")
        if req.path == "/boom_after_stream":  # a handler bug after its stream ended
            resp = StreamResponse(200, {"Content-Type": "text/event-stream"})
            await resp.prepare(req)
            await resp.write(b"data: 0\n\n", last=True)
            raise RuntimeError("handler bug")
        if req.path == "/bigresp":
            return Response(200, b"x" * 65536)
        if req.path == "/hang":
            try:
                await asyncio.sleep(30)
            except asyncio.CancelledError:
                self.cancelled.set()
                raise
        if req.path == "/firehose":  # a stream that never ends on its own (a long generation)
            resp = StreamResponse(200, {"Content-Type": "text/event-stream"})
            await resp.prepare(req)
            try:
                while True:
                    await resp.write(b"data: " + b"x" * 16384 + b"\n\n")
            except BaseException as exc:
                self.firehose_ended.append(type(exc).__name__)
                self.cancelled.set()
                raise
        if req.path == "/stream":
            resp = StreamResponse(200, {"Content-Type": "text/event-stream"})
            await resp.prepare(req)
            for i in range(3):
                await resp.write(b"data: %d\n\n" % i)
            await resp.write_eof()
            return resp
        return Response(200, json.dumps({"path": req.path, "len": len(req.body)}).encode())

    def stop(self) -> None:
        asyncio.run_coroutine_threadsafe(self.server.close_all(), self.loop).result(10)
        self.loop.call_soon_threadsafe(self.loop.stop)


@pytest.fixture(scope="module")
def srv() -> Iterator[Served]:
    s = Served()
    yield s
    s.stop()


def connect(srv: Served) -> socket.socket:
    sock = socket.create_connection(("127.0.0.1", srv.port), timeout=5)
    return sock


def read_responses(sock: socket.socket, n: int) -> list[tuple[int, dict[str, str], bytes]]:
    """Reads n Content-Length or chunked responses."""
    buf = b""
    out: list[tuple[int, dict[str, str], bytes]] = []
    while len(out) < n:
        while b"\r\n\r\n" not in buf:
            data = sock.recv(65536)
            if not data:
                raise EOFError(buf)
            buf += data
        head, buf = buf.split(b"\r\n\r\n", 1)
        lines = head.decode().split("\r\n")
        headers = {k.lower(): v.strip() for k, _, v in (line.partition(":") for line in lines[1:])}
        status = int(lines[0].split()[1])
        if "content-length" in headers:
            size = int(headers["content-length"])
            while len(buf) < size:
                buf += sock.recv(65536)
            body, buf = buf[:size], buf[size:]
        else:
            while not buf.endswith(b"0\r\n\r\n"):
                buf += sock.recv(65536)
            body, buf = buf, b""
        out.append((status, headers, body))
    return out


def post(path: str, body: bytes) -> bytes:
    return b"POST %s HTTP/1.1\r\nHost: x\r\nContent-Length: %d\r\n\r\n%s" % (path.encode(), len(body), body)


def test_keep_alive_and_pipelined_requests_answer_in_order(srv: Served) -> None:
    with connect(srv) as s:
        s.sendall(post("/a", b"{}"))
        assert read_responses(s, 1)[0][0] == 200
        # three requests in one write; the first is slow, the answers still come in order
        s.sendall(post("/slow", b"1") + post("/b", b"22") + b"GET /c HTTP/1.1\r\nHost: x\r\n\r\n")
        answers = read_responses(s, 3)
    assert [json.loads(b)["path"] for _, _, b in answers] == ["/slow", "/b", "/c"]
    assert [json.loads(b)["len"] for _, _, b in answers] == [1, 2, 0]


def test_chunked_request_body_is_reassembled(srv: Served) -> None:
    with connect(srv) as s:
        s.sendall(b"POST /chunked HTTP/1.1\r\nHost: x\r\nTransfer-Encoding: chunked\r\n\r\n"
                  b"3\r\nabc\r\n4\r\ndefg\r\n0\r\n\r\n")
        status, _, body = read_responses(s, 1)[0]
    assert status == 200 and json.loads(body)["len"] == 7
    assert ("POST", "/chunked", b"abcdefg") in srv.seen


def test_oversize_body_gets_413_before_the_body_is_sent(srv: Served) -> None:
    with connect(srv) as s:
        s.sendall(b"POST /big HTTP/1.1\r\nHost: x\r\nContent-Length: 1000000\r\n\r\n")  # no body byte sent
        status, headers, _ = read_responses(s, 1)[0]
        assert status == 413 and headers.get("connection") == "close"
        s.sendall(b"x" * 5000)  # the rest is discarded, not parsed as a request
        s.settimeout(3)
        tail = b""
        while chunk := s.recv(65536):
            tail += chunk
    assert tail == b""


def test_oversize_chunked_body_gets_413(srv: Served) -> None:
    with connect(srv) as s:
        s.sendall(b"POST /bigc HTTP/1.1\r\nHost: x\r\nTransfer-Encoding: chunked\r\n\r\n"
                  + (b"200\r\n" + b"y" * 512 + b"\r\n") * 3)
        assert read_responses(s, 1)[0][0] == 413


def test_malformed_request_gets_a_json_400_and_close(srv: Served) -> None:
    with connect(srv) as s:
        s.sendall(b"THIS IS NOT HTTP\r\n\r\n")
        status, _, body = read_responses(s, 1)[0]
        assert status == 400 and "error" in json.loads(body)
        assert s.recv(10) == b""


def test_stream_is_chunked_and_complete(srv: Served) -> None:
    with connect(srv) as s:
        s.sendall(b"GET /stream HTTP/1.1\r\nHost: x\r\n\r\n")
        status, headers, body = read_responses(s, 1)[0]
    assert status == 200 and headers["transfer-encoding"] == "chunked"
    assert b"data: 0" in body and b"data: 2" in body and body.endswith(b"0\r\n\r\n")


def test_client_disconnect_cancels_the_request_task(srv: Served) -> None:
    srv.cancelled.clear()
    s = connect(srv)
    s.sendall(b"GET /hang HTTP/1.1\r\nHost: x\r\n\r\n")
    deadline = 50
    while ("GET", "/hang", b"") not in srv.seen and deadline:
        threading.Event().wait(0.02)
        deadline -= 1
    s.close()
    assert srv.cancelled.wait(5)


def test_http10_without_keep_alive_is_closed_after_the_answer(srv: Served) -> None:
    with connect(srv) as s:
        s.sendall(b"GET /x HTTP/1.0\r\n\r\n")
        status, headers, _ = read_responses(s, 1)[0]
        assert status == 200 and headers.get("connection") == "close"
        assert s.recv(10) == b""


def test_expect_100_continue_is_answered_before_the_body(srv: Served) -> None:
    with connect(srv) as s:
        s.sendall(b"POST /e HTTP/1.1\r\nHost: x\r\nContent-Length: 5\r\nExpect: 100-continue\r\n\r\n")
        s.settimeout(2)
        assert s.recv(100).startswith(b"HTTP/1.1 100 Continue\r\n\r\n")
        s.sendall(b"hello")
        status, _, body = read_responses(s, 1)[0]
    assert status == 200 and json.loads(body)["len"] == 5


def test_head_gets_the_headers_without_a_body(srv: Served) -> None:
    with connect(srv) as s:
        s.sendall(b"HEAD /h HTTP/1.1\r\nHost: x\r\n\r\nGET /g HTTP/1.1\r\nHost: x\r\n\r\n")
        s.settimeout(3)
        buf = b""
        while buf.count(b"HTTP/1.1 200") < 2 or not buf.endswith(b"}"):
            buf += s.recv(65536)
    head_part, get_part = buf.split(b"HTTP/1.1 200", 2)[1:]
    assert head_part.endswith(b"\r\n\r\n") and b'"path"' not in head_part
    assert b'"path": "/g"' in get_part


def test_oversized_headers_get_a_400(srv: Served) -> None:
    with connect(srv) as s:
        s.sendall(b"GET /x HTTP/1.1\r\nHost: x\r\nX-Big: " + b"a" * 70000 + b"\r\n\r\n")
        status, _, _ = read_responses(s, 1)[0]
    assert status == 400


def test_idle_keep_alive_connections_are_closed(monkeypatch: pytest.MonkeyPatch) -> None:
    import infer_ctl.router.http.h1 as h1

    monkeypatch.setattr(h1, "KEEPALIVE_S", 0.2)
    served = Served()
    try:
        with connect(served) as s:
            s.sendall(b"GET /x HTTP/1.1\r\nHost: x\r\n\r\n")
            assert read_responses(s, 1)[0][0] == 200
            s.settimeout(5)
            assert s.recv(10) == b""  # closed by the sweep after ~0.2-0.4 s idle
    finally:
        served.stop()


def test_stream_in_a_pipeline_is_not_marked_close_while_requests_follow(srv: Served) -> None:
    # the last request asks for close; the streamed answer in the middle must not say "Connection: close"
    with connect(srv) as s:
        s.sendall(b"GET /a HTTP/1.1\r\n\r\nGET /stream HTTP/1.1\r\n\r\nGET /b HTTP/1.1\r\nConnection: close\r\n\r\n")
        s.settimeout(3)
        buf = b""
        while chunk := s.recv(65536):
            buf += chunk
    answers = buf.split(b"HTTP/1.1 200 OK")[1:]
    assert [b"Connection: close" in a for a in answers] == [False, False, True]
    assert answers[1].endswith(b"0\r\n\r\n")


def test_http10_stream_is_close_delimited_not_chunked(srv: Served) -> None:
    # an HTTP/1.0 client does not know chunked encoding: the stream ends with the connection
    with connect(srv) as s:
        s.sendall(b"GET /stream HTTP/1.0\r\nConnection: keep-alive\r\n\r\n")
        s.settimeout(3)
        buf = b""
        while chunk := s.recv(65536):
            buf += chunk
    head, _, body = buf.partition(b"\r\n\r\n")
    assert b"transfer-encoding" not in head.lower() and b"connection: close" in head.lower()
    assert body == b"data: 0\n\ndata: 1\n\ndata: 2\n\n"


def test_whole_responses_wait_for_a_client_that_does_not_read(srv: Served) -> None:
    # pipelined requests from a client that never reads must not pile responses up in memory
    async def buffered() -> int:
        return sum(c.transport.get_write_buffer_size() for c in list(srv.server.conns))

    with connect(srv) as s:
        s.settimeout(1)
        try:
            s.sendall(b"GET /bigresp HTTP/1.1\r\n\r\n" * 1500)
        except TimeoutError:
            pass
        threading.Event().wait(1.0)
        size = asyncio.run_coroutine_threadsafe(buffered(), srv.loop).result(5)
    assert size < 4 * 1024 * 1024  # was 1500 x 64 KiB = 96 MiB


def trickle(sock: socket.socket, data: bytes, gap: float) -> bytes:
    """Sends data a byte at a time; returns what the server answered (or b"" when it closed)."""
    sock.settimeout(gap)
    for i in range(len(data)):
        try:
            sock.sendall(data[i:i + 1])
        except OSError:
            break
        try:
            got = sock.recv(65536)
        except TimeoutError:
            continue
        return got
    return b"<sent it all>"


@pytest.mark.parametrize("data", [
    b"GET /x HTTP/1.1\r\nHost: x\r\nX-Slow: " + b"a" * 200 + b"\r\n\r\n",  # slow headers
    b"POST /x HTTP/1.1\r\nContent-Length: 200\r\n\r\n" + b"a" * 200,  # slow body
    b"\r\n" * 200,  # blank lines between requests keep nothing alive
], ids=["headers", "body", "crlf"])
def test_a_request_trickled_byte_by_byte_times_out(monkeypatch: pytest.MonkeyPatch, data: bytes) -> None:
    import infer_ctl.router.http.h1 as h1

    monkeypatch.setattr(h1, "READ_TIMEOUT_S", 0.3)
    monkeypatch.setattr(h1, "KEEPALIVE_S", 0.3)
    served = Served()
    try:
        with connect(served) as s:
            got = trickle(s, data, 0.02)  # 200 bytes x 20 ms = 4 s if never cut off
        assert got == b"" or got.startswith(b"HTTP/1.1 408")
    finally:
        served.stop()


def test_absolute_form_target_is_routed_by_its_path(srv: Served) -> None:
    with connect(srv) as s:
        s.sendall(b"GET http://router:8000/abs?q=1 HTTP/1.1\r\nHost: router\r\n\r\n")
        status, _, body = read_responses(s, 1)[0]
    assert status == 200 and json.loads(body)["path"] == "/abs"


@pytest.mark.parametrize("coding", [b"gzip, chunked", b"deflate,chunked"])
def test_a_transfer_coding_other_than_chunked_is_refused(srv: Served, coding: bytes) -> None:
    # llhttp frames "gzip, chunked" as chunked and drops the gzip: the handler would get compressed bytes
    with connect(srv) as s:
        s.sendall(b"POST /te HTTP/1.1\r\nHost: x\r\nTransfer-Encoding: " + coding + b"\r\n\r\n0\r\n\r\n")
        status, headers, body = read_responses(s, 1)[0]
    assert status == 400 and b"Transfer-Encoding" in body and headers.get("connection") == "close"
    assert ("POST", "/te", b"") not in srv.seen


def test_a_stream_to_a_client_that_stops_reading_is_aborted_after_the_write_timeout(monkeypatch: pytest.MonkeyPatch) -> None:
    # a client that keeps its connection open but never reads would hold the handler (and the upstream
    # request with its KV slot) forever, waiting on back-pressure; after WRITE_TIMEOUT_S the connection is
    # aborted and the handler cancelled, as for a client that disconnected
    import infer_ctl.router.http.h1 as h1

    monkeypatch.setattr(h1, "WRITE_TIMEOUT_S", 0.3)
    served = Served()
    try:
        s = socket.socket()
        s.setsockopt(socket.SOL_SOCKET, socket.SO_RCVBUF, 4096)  # fill the pipe quickly
        s.connect(("127.0.0.1", served.port))
        with s:
            s.sendall(b"POST /firehose HTTP/1.1\r\nHost: x\r\nContent-Length: 2\r\n\r\n{}")
            assert served.cancelled.wait(5), "the stalled stream was never ended"
            assert served.firehose_ended and served.firehose_ended[0] in ("CancelledError", "ConnectionResetError")
            s.settimeout(5)
            with pytest.raises(ConnectionResetError):  # aborted (RST), not a clean end of the stream
                while s.recv(1 << 20):
                    pass
        assert not served.server.conns
    finally:
        served.stop()


def test_a_slow_reader_that_keeps_draining_is_not_cut_off(monkeypatch: pytest.MonkeyPatch) -> None:
    # the timeout bounds one wait for the client to drain, not the length of the stream
    import infer_ctl.router.http.h1 as h1

    monkeypatch.setattr(h1, "WRITE_TIMEOUT_S", 0.5)
    served = Served()
    try:
        s = socket.socket()
        s.setsockopt(socket.SOL_SOCKET, socket.SO_RCVBUF, 4096)
        s.connect(("127.0.0.1", served.port))
        with s:
            s.sendall(b"POST /firehose HTTP/1.1\r\nHost: x\r\nContent-Length: 2\r\n\r\n{}")
            s.settimeout(5)
            got = 0
            for _ in range(15):  # 1.5 s in all, 3 x the timeout, reading a little at a time
                threading.Event().wait(0.1)
                got += len(s.recv(4096))
            assert got > 0 and not served.cancelled.is_set()
    finally:
        served.stop()


def error_doc(status: int, message: str, kind: str = "invalid_request_error") -> dict[str, object]:
    return {"error": {"message": message, "type": kind, "code": status}}


@pytest.mark.parametrize("raw", [
    b"GET /ws HTTP/1.1\r\nHost: x\r\nConnection: Upgrade\r\nUpgrade: websocket\r\n\r\n",
    b"POST /h2c HTTP/1.1\r\nHost: x\r\nConnection: Upgrade, HTTP2-Settings\r\nUpgrade: h2c\r\n"
    b"Content-Length: 2\r\n\r\n{}",
    b"CONNECT example.com:443 HTTP/1.1\r\nHost: example.com:443\r\n\r\n",
])
def test_a_protocol_upgrade_is_refused_with_a_json_400_and_never_handled(srv: Served, raw: bytes) -> None:
    before = len(srv.seen)
    with connect(srv) as s:
        s.sendall(raw)
        status, headers, body = read_responses(s, 1)[0]
        assert s.recv(10) == b""  # then closed: the bytes after an upgrade request are another protocol
    assert status == 400 and headers.get("connection") == "close"
    assert json.loads(body) == error_doc(400, "protocol upgrades are not supported")
    assert len(srv.seen) == before  # the handler never saw it (it used to answer it, then close)


def test_a_url_over_64_kib_gets_a_json_400_naming_the_limit(srv: Served) -> None:
    before = len(srv.seen)
    with connect(srv) as s:
        s.sendall(b"GET /" + b"a" * (64 * 1024 + 1) + b" HTTP/1.1\r\nHost: x\r\n\r\n")
        status, headers, body = read_responses(s, 1)[0]
    assert status == 400 and headers.get("connection") == "close"
    assert json.loads(body) == error_doc(400, "malformed HTTP request: URL too long")
    assert len(srv.seen) == before


def test_a_handler_that_raises_still_gets_a_json_500_and_the_connection_lives_on(srv: Served) -> None:
    with connect(srv) as s:
        s.sendall(post("/boom", b"{}") + post("/after", b"{}"))
        (status, headers, body), (status2, _, body2) = read_responses(s, 2)
    assert status == 500 and headers.get("connection") is None
    assert json.loads(body) == error_doc(500, "internal router error; see the router's log", "server_error")
    assert status2 == 200 and json.loads(body2)["path"] == "/after"


def test_a_handler_that_raises_after_its_streams_head_ends_the_connection_not_a_second_head(srv: Served) -> None:
    with connect(srv) as s:
        s.sendall(post("/boom_in_stream", b"{}") + post("/after", b"{}"))
        raw = b""
        while data := s.recv(65536):
            raw += data
    # the stream's head and what it sent, then the close: an unfinished chunked body the client reports
    # as incomplete - a 500 head written after them would be read as a chunk size (a garbled answer)
    assert raw == (b"HTTP/1.1 200 OK\r\nTransfer-Encoding: chunked\r\nContent-Type: text/event-stream\r\n\r\n"
                   b"9\r\ndata: 0\n\n\r\n")


def test_a_handler_that_raises_after_its_stream_ended_leaves_the_answer_and_the_connection_as_they_are(
        srv: Served) -> None:
    with connect(srv) as s:
        s.sendall(post("/boom_after_stream", b"{}"))
        ((status, _, body),) = read_responses(s, 1)
        s.sendall(post("/after", b"{}"))  # the same connection
        ((status2, _, body2),) = read_responses(s, 1)
    assert status == 200 and body == b"9\r\ndata: 0\n\n\r\n0\r\n\r\n"
    assert status2 == 200 and json.loads(body2)["path"] == "/after"


@pytest.mark.parametrize(("head", "name"), [
    (b"Authorization: Bearer right\r\nAuthorization: Bearer wrong\r\n", "Authorization"),
    (b"authorization: Bearer a\r\nAUTHORIZATION: Bearer b\r\n", "Authorization"),  # names are case-insensitive
    (b"Host: y\r\n", "Host"),  # with post()'s own Host: x
])
def test_a_repeated_single_header_gets_a_json_400_naming_it_and_is_never_handled(srv: Served, head: bytes,
                                                                                 name: str) -> None:
    """h1 used to keep the last copy; a relay or check reading another copy would see another token."""
    before = len(srv.seen)
    with connect(srv) as s:
        req = post("/admin/status", b"{}").replace(b"\r\n\r\n", b"\r\n" + head + b"\r\n", 1)  # before the blank line
        s.sendall(req + post("/after", b"{}"))
        (status, headers, body), (status2, _, body2) = read_responses(s, 2)
    assert status == 400 and headers.get("connection") is None  # framing is fine: the connection lives on
    assert json.loads(body) == error_doc(400, f"more than one {name} header; send it once")
    assert status2 == 200 and json.loads(body2)["path"] == "/after"
    assert [p for _, p, _ in srv.seen[before:]] == ["/after"]


def test_repeated_headers_that_may_repeat_are_still_handled(srv: Served) -> None:
    with connect(srv) as s:
        s.sendall(b"GET /ok HTTP/1.1\r\nHost: x\r\nAccept: a\r\nAccept: b\r\nAuthorization: Bearer t\r\n\r\n")
        status, _, body = read_responses(s, 1)[0]
    assert status == 200 and json.loads(body)["path"] == "/ok"


class _Writes:
    """What a StreamResponse hands its connection (and the connection's writer, `out`): each transport
    write, as one item."""

    def __init__(self) -> None:
        self.writes: list[bytes] = []
        self.close_after = False
        self.pending: list[Request] = []
        self.out = self

    def write(self, data: bytes) -> None:
        self.writes.append(data)

    async def drain(self) -> None:
        return None


def test_a_relayed_stream_sends_its_head_with_the_first_piece_and_its_end_with_the_last() -> None:
    """One socket write per piece of the stream: the head goes with the first (prepare(first=...)), the
    terminating chunk with the last (write(last=True)); the bytes are those of separate writes, and
    nothing is sent once the stream ended (a late error event cannot follow the terminator)."""
    conn = _Writes()
    req = Request("POST", "/generate", "", {}, conn)  # type: ignore[arg-type]

    async def go() -> None:
        resp = StreamResponse(200, {"Content-Type": "text/event-stream"})
        await resp.prepare(req, b"data: 1\n\n")
        await resp.write(b"data: 2\n\n")
        await resp.write(b"data: [DONE]\n\n", last=True)
        await resp.write(b"data: late\n\n")
        await resp.write_eof()

    asyncio.run(go())
    assert conn.writes == [
        b"HTTP/1.1 200 OK\r\nTransfer-Encoding: chunked\r\nContent-Type: text/event-stream\r\n\r\n9\r\ndata: 1\n\n\r\n",
        b"9\r\ndata: 2\n\n\r\n",
        b"e\r\ndata: [DONE]\n\n\r\n0\r\n\r\n",
    ]
