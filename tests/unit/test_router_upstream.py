"""The upstream client's response parser (router/http/upstream.py `_Conn`), fed bytes as a worker's socket
would deliver them: status line, header names and values (whitespace, latin-1 bytes, 1xx heads), framing.
Pure: no socket; the connection's pool is a real Pool that is never connected."""

from __future__ import annotations

import asyncio

import pytest

from infer_ctl.router.http.upstream import Pool, UpstreamError, _Conn


def fed(*pieces: bytes) -> _Conn:
    conn = _Conn(Pool("127.0.0.1", 9))
    conn.state = "headers"
    for p in pieces:
        conn.data_received(p)
    return conn


def test_header_names_are_lowercased_and_values_trimmed_as_bytes_strip_trims() -> None:
    conn = fed(b"HTTP/1.1 201 Created\r\nContent-Type:  application/json \r\nX-Odd:\tv\xe9\xa0\t\r\n"
               b"CONTENT-LENGTH: 2\r\nconnection: Close\r\n\r\nok")
    assert conn.status == 201
    # \xa0 (a latin-1 no-break space) is no ASCII whitespace: bytes.strip() kept it, so does the parser
    assert conn.headers == {"content-type": "application/json", "x-odd": "v\xe9\xa0", "content-length": "2",
                            "connection": "Close"}
    assert conn.done and not conn.keep_alive and list(conn.chunks) == [b"ok"]


def test_a_1xx_head_is_skipped_and_the_head_may_arrive_in_pieces() -> None:
    conn = fed(b"HTTP/1.1 100 Continue\r\n\r\nHTTP/1.1 200 OK\r\nTransfer-Enc", b"oding: chunked\r\n\r\n3\r\nabc\r\n",
               b"0\r\n\r\n")
    assert conn.status == 200 and conn.headers == {"transfer-encoding": "chunked"}
    assert conn.done and conn.keep_alive and list(conn.chunks) == [b"abc"]


@pytest.mark.parametrize("head", [b"HTTP/1.1\r\n\r\n", b"HTTP/1.1 2x0 OK\r\n\r\n", b"garbage\r\n\r\n"])
def test_a_bad_status_line_fails_the_response(head: bytes) -> None:
    async def go() -> None:
        conn = _Conn(Pool("127.0.0.1", 9))
        conn.state = "headers"
        conn.headers_fut = asyncio.get_running_loop().create_future()
        conn.data_received(head)
        with pytest.raises(UpstreamError, match="bad status line from worker"):
            await conn.headers_fut

    asyncio.run(go())


def test_pieces_that_arrived_together_are_taken_in_one() -> None:
    conn = fed(b"HTTP/1.1 200 OK\r\nTransfer-Encoding: chunked\r\n\r\n2\r\nab\r\n", b"2\r\ncd\r\n", b"0\r\n\r\n")

    async def go() -> list[bytes | None]:
        return [await conn.next_chunk(), await conn.next_chunk()]

    assert asyncio.run(go()) == [b"abcd", None]


def test_a_response_finished_after_its_pool_closed_closes_its_connection() -> None:
    """A worker dropped (removed, or unhealthy) while a response of it was still read: the connection is
    closed when that response is released, not left idle in the dropped pool (open to the worker, and
    never used or closed again)."""
    from infer_ctl.router.http.upstream import Response

    class Transport:
        closed = False

        def close(self) -> None:
            self.closed = True

        def is_closing(self) -> bool:
            return self.closed

    pool = Pool("127.0.0.1", 9)
    conn = fed(b"HTTP/1.1 200 OK\r\nContent-Length: 2\r\n\r\nok")
    conn.pool, conn.transport = pool, Transport()  # type: ignore[assignment]
    conn.chunks.clear()  # the body was read
    pool._all.add(conn)
    resp = Response(conn)
    pool._all.discard(conn)  # its connect was in progress during the close: only the release can close it
    pool.close()
    resp.release()
    assert pool._idle == [] and conn.transport.closed  # type: ignore[union-attr]
    # an open pool takes a finished connection back
    pool2 = Pool("127.0.0.1", 9)
    conn2 = fed(b"HTTP/1.1 200 OK\r\nContent-Length: 2\r\n\r\nok")
    conn2.pool, conn2.transport = pool2, Transport()  # type: ignore[assignment]
    conn2.chunks.clear()
    pool2._all.add(conn2)
    Response(conn2).release()
    assert pool2._idle == [conn2] and not conn2.transport.closed  # type: ignore[union-attr]
