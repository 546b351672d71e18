"""UpstreamClient.open against real loopback servers (upstreams/client.py, upstreams/connection.py).

Why real sockets: the client is an asyncio Protocol fed by the kernel, and what
matters is how it behaves when bytes arrive split, late, cut off or not at all,
when a pooled connection dies while idle, and when the transport is paused.
Mocking the transport would only test our idea of asyncio.  So every test
starts a small `asyncio.start_server` on 127.0.0.1 whose handler writes exact
scripted bytes, records the raw requests it read and counts the TCP
connections it accepted; nothing of ours is mocked.

Every network wait is bounded (`asyncio.timeout`); no test asserts how long
anything took.
"""

from __future__ import annotations

import asyncio
import base64
import contextlib
import gzip
import random
import socket
import struct
import sys
import zlib
from pathlib import Path
from collections.abc import AsyncIterator, Callable, Sequence

import brotli
import pytest
from mitmproxy import http

from switchyard_core.upstreams.client import UpstreamClient
from switchyard_core.upstreams.connection import UpstreamAnswer
from switchyard_core.exchange import OriginalRequest
from switchyard_core.upstreams.messages import (ConnectionBroke, ConnectTimeout, UpstreamRequest, build_request, redact_query,
                                          target_url, transport_failure)
from switchyard_core.rules import Upstream

from tests.support.mitm import refused_port

if sys.version_info >= (3, 14):
    from compression import zstd
else:
    from backports import zstd
from tests.support.scripted_server import LAST_CHUNK, WAIT_S, Peer, Server, answering, chunk, chunked_head, response


# ---------------------------------------------------------------------------
# the client's side


@pytest.fixture
async def client() -> AsyncIterator[UpstreamClient]:
    upstream = UpstreamClient()
    yield upstream
    upstream.close()


def request(url: str, method: str = "GET", headers: Sequence[tuple[str, str]] = (),
            body: bytes = b"") -> UpstreamRequest:
    return UpstreamRequest(method, url, tuple(headers), body)


async def open_answer(client: UpstreamClient, url: str, method: str = "GET",
                      headers: Sequence[tuple[str, str]] = (), body: bytes = b"",
                      connect_timeout_s: float = WAIT_S) -> UpstreamAnswer:
    async with asyncio.timeout(WAIT_S):
        return await client.open(request(url, method, headers, body), connect_timeout_s=connect_timeout_s)


async def read_all(answer: UpstreamAnswer) -> tuple[bytes, BaseException | None]:
    """The whole body by `read_some`, and how it ended."""
    chunks: list[bytes] = []
    async with asyncio.timeout(WAIT_S):
        while True:
            data, error = await answer.body.read_some()
            if not data:
                return b"".join(chunks), error
            chunks.append(data)


async def fetch(client: UpstreamClient, url: str) -> bytes:
    """GET `url` and read its body to a clean end."""
    answer = await open_answer(client, url)
    data, error = await read_all(answer)
    assert error is None
    return data


async def eventually(condition: Callable[[], bool]) -> None:
    """Until `condition` holds (bounded)."""
    async with asyncio.timeout(WAIT_S):
        while not condition():
            await asyncio.sleep(0.01)


def request_head(raw: bytes) -> tuple[str, dict[str, str], bytes]:
    """A recorded request as (request line, lower-cased headers, body)."""
    head, _, body = raw.partition(b"\r\n\r\n")
    line, *fields = head.decode().split("\r\n")
    headers: dict[str, str] = {}
    for field in fields:
        name, _, value = field.partition(":")
        assert name.lower() not in headers, f"duplicate header {name}"
        headers[name.lower()] = value.strip()
    return line, headers, body


SSE = (b'data: {"delta":"Hel"}\n\n', b'data: {"delta":"lo"}\n\n', b"event: done\ndata: [DONE]\n\n")


# ---------------------------------------------------------------------------
# 1-3: bodies and their framings


async def test_chunked_sse_body_reads_to_a_clean_end(client: UpstreamClient) -> None:
    async def handle(peer: Peer) -> None:
        await peer.read_request()
        await peer.send(chunked_head([("Content-Type", "text/event-stream"), ("X-Request-Id", "req-1")]),
                        *(chunk(frame) for frame in SSE), LAST_CHUNK)
        await peer.wait_closed_by_client()

    async with Server(handle) as server:
        answer = await open_answer(client, server.url("/v1/chat/completions"))
        assert answer.status == 200
        assert answer.headers["content-type"] == "text/event-stream"
        assert answer.headers["CONTENT-TYPE"] == "text/event-stream"
        assert answer.headers["x-request-id"] == "req-1"
        assert await read_all(answer) == (b"".join(SSE), None)
        assert await answer.body.read_some() == (b"", None)  # and stays ended


@pytest.mark.parametrize("sloppy", [
    b"HTTP/1.1 200 OK\nContent-Type: text/event-stream\nContent-Length: %d\n\n%b",
    b"HTTP/1.1 200 OK\r\nContent-Type: text/event-stream\r\nTransfer-Encoding: chunked\r\n\r\n%x  \r\n%b\r\n0\r\n\r\n",
], ids=["bare-lf-head", "spaces-after-chunk-size"])
async def test_sloppy_framing_mitmproxy_accepts_is_accepted_too(client: UpstreamClient, sloppy: bytes) -> None:
    """A small local server's answer that mitmproxy alone would take must not become a
    failure only because Switchyard is in the path."""
    frames = b"".join(SSE)
    async with Server(answering(sloppy % (len(frames), frames))) as server:
        answer = await open_answer(client, server.url("/v1/chat/completions"))
        assert answer.status == 200
        assert await read_all(answer) == (frames, None)


async def test_a_length_beside_chunked_is_refused_as_mitmproxy_refuses_it(client: UpstreamClient) -> None:
    """Two framings for one body is how responses are smuggled: mitmproxy refuses it,
    and so does the relay (the attempt fails; the connection is not reused)."""
    frames = b"".join(SSE)
    answer = (b"HTTP/1.1 200 OK\r\nContent-Type: text/event-stream\r\nTransfer-Encoding: chunked\r\n"
              b"Content-Length: 3\r\n\r\n%x\r\n%b\r\n0\r\n\r\n" % (len(frames), frames))
    async with Server(answering(answer)) as server:
        with pytest.raises(ConnectionBroke, match="malformed HTTP response"):
            await open_answer(client, server.url("/v1/chat/completions"))
    assert client.idle_connections == 0


async def test_content_length_body(client: UpstreamClient) -> None:
    body = b'{"id":"x","choices":[]}'
    async with Server(answering(response(headers=[("Content-Type", "application/json")], body=body))) as server:
        answer = await open_answer(client, server.url())
        assert (answer.status, answer.headers["Content-Length"]) == (200, str(len(body)))
        assert await read_all(answer) == (body, None)
        assert client.idle_connections == 1  # read to its end on keep-alive: pooled


async def test_close_delimited_body_ends_cleanly(client: UpstreamClient) -> None:
    pieces = (b"first part, ", b"second part, ", b"last part")

    async def handle(peer: Peer) -> None:
        await peer.read_request()
        await peer.send(response(headers=[("Content-Type", "text/plain")], length=False), *pieces)
        peer.close()

    async with Server(handle) as server:
        answer = await open_answer(client, server.url())
        assert answer.status == 200
        assert await read_all(answer) == (b"".join(pieces), None)
        assert client.idle_connections == 0  # its end was the connection's


async def test_head_answer_has_no_body(client: UpstreamClient) -> None:
    async with Server(answering(response(headers=[("Content-Length", "42")], length=False))) as server:
        answer = await open_answer(client, server.url(), "HEAD")
        assert (answer.status, answer.headers["content-length"]) == (200, "42")
        assert await read_all(answer) == (b"", None)
        assert request_head(server.requests[0])[0] == "HEAD / HTTP/1.1"


async def test_no_content_answer_ends_at_once_and_keeps_the_connection(client: UpstreamClient) -> None:
    replies = (response("204 No Content", length=False), response(body=b"after"))
    async with Server(answering(*replies, requests=2)) as server:
        answer = await open_answer(client, server.url())
        assert answer.status == 204
        assert await read_all(answer) == (b"", None)
        assert await fetch(client, server.url()) == b"after"
        assert server.accepts == 1


def _gzip(data: bytes) -> bytes:
    return gzip.compress(data)


def _zlib_deflate(data: bytes) -> bytes:
    return zlib.compress(data)


def _raw_deflate(data: bytes) -> bytes:
    compressor = zlib.compressobj(wbits=-zlib.MAX_WBITS)
    return compressor.compress(data) + compressor.flush()


def _brotli(data: bytes) -> bytes:
    return brotli.compress(data)


def _zstd_two_frames(data: bytes) -> bytes:
    half = len(data) // 2
    return zstd.compress(data[:half]) + zstd.compress(data[half:])


@pytest.mark.parametrize("coding, compress", [
    pytest.param("gzip", _gzip, id="gzip"),
    pytest.param("deflate", _zlib_deflate, id="deflate-zlib"),
    pytest.param("deflate", _raw_deflate, id="deflate-raw"),
    pytest.param("br", _brotli, id="br"),  # not asked for, but sent by some
    pytest.param("zstd", _zstd_two_frames, id="zstd-two-frames"),
])
@pytest.mark.parametrize("split", [
    pytest.param(lambda data: [data], id="one-chunk"),
    pytest.param(lambda data: [data[:1], data[1:]], id="first-byte-alone"),
    pytest.param(lambda data: [data[i:i + 7] for i in range(0, len(data), 7)], id="7-byte-chunks"),
])
async def test_compressed_body_is_decoded(client: UpstreamClient, coding: str, compress: Callable[[bytes], bytes],
                                          split: Callable[[bytes], list[bytes]]) -> None:
    plain = b"".join(b'data: {"n":%d,"text":"compressible text"}\n\n' % n for n in range(50))
    encoded = compress(plain)

    async def handle(peer: Peer) -> None:
        await peer.read_request()
        await peer.send(chunked_head([("Content-Encoding", coding)]) + b"".join(chunk(p) for p in split(encoded))
                        + LAST_CHUNK)
        await peer.wait_closed_by_client()

    async with Server(handle) as server:
        answer = await open_answer(client, server.url())
        assert await read_all(answer) == (plain, None)


@pytest.mark.parametrize("coding, compress", [
    pytest.param("gzip", _gzip, id="gzip"),
    pytest.param("deflate", _raw_deflate, id="deflate-raw"),
    pytest.param("br", _brotli, id="br"),
    pytest.param("zstd", _zstd_two_frames, id="zstd"),
])
async def test_compressed_close_delimited_body_is_decoded(client: UpstreamClient, coding: str,
                                                          compress: Callable[[bytes], bytes]) -> None:
    plain = b"plain text, " * 200

    async def handle(peer: Peer) -> None:
        await peer.read_request()
        await peer.send(response(headers=[("Content-Encoding", coding)], length=False) + compress(plain))
        peer.close()

    async with Server(handle) as server:
        answer = await open_answer(client, server.url())
        assert await read_all(answer) == (plain, None)


@pytest.mark.parametrize("coding", ["compress", "gzip, gzip", "exi"])
async def test_a_coding_it_cannot_read_is_a_transport_failure_never_passed_on(client: UpstreamClient,
                                                                              coding: str) -> None:
    """Its bytes could not be classified, and the client never asked for them."""
    async with Server(answering(response(headers=[("Content-Encoding", coding)], body=b"\x1f\x9d..."))) as server:
        with pytest.raises(ConnectionBroke) as caught:
            await open_answer(client, server.url())
    assert transport_failure(caught.value).message == (
        f"upstream answered with Content-Encoding {coding!r}, which it was not asked for and Switchyard cannot read")


async def test_a_header_folded_onto_a_second_line_is_read_as_mitmproxy_reads_it(client: UpstreamClient) -> None:
    head = b"HTTP/1.1 200 OK\r\nX-Folded: first\r\n second-line\r\nContent-Length: 2\r\n\r\nok"
    async with Server(answering(head)) as server:
        answer = await open_answer(client, server.url())
        assert answer.headers["X-Folded"] == "first second-line"
        assert await read_all(answer) == (b"ok", None)


async def test_a_zstd_frame_per_chunk_is_decoded_frame_after_frame(client: UpstreamClient) -> None:
    """A frame may end exactly where a read does; the next read starts the next frame."""
    frames = [b"data: %d\n\n" % n for n in range(3)]

    async def handle(peer: Peer) -> None:
        await peer.read_request()
        await peer.send(chunked_head([("Content-Encoding", "zstd")]))
        for frame in frames:
            await peer.send(chunk(zstd.compress(frame)))
        await peer.send(LAST_CHUNK)
        await peer.wait_closed_by_client()

    async with Server(handle) as server:
        answer = await open_answer(client, server.url())
        assert await read_all(answer) == (b"".join(frames), None)


async def test_a_header_name_with_a_space_before_its_colon_is_refused(client: UpstreamClient) -> None:
    """The parser takes it (for folded values, it is lenient on headers); the framing
    checks would not see `Transfer-Encoding ` for what it is."""
    head = b"HTTP/1.1 200 OK\r\nTransfer-Encoding : chunked\r\n\r\n5\r\nhello\r\n0\r\n\r\n"
    async with Server(answering(head)) as server:
        with pytest.raises(ConnectionBroke) as caught:
            await open_answer(client, server.url())
    assert caught.value.what == "malformed HTTP response"


async def test_a_transfer_coding_besides_chunked_is_a_transport_failure(client: UpstreamClient) -> None:
    async def handle(peer: Peer) -> None:
        await peer.read_request()
        await peer.send(response(headers=[("Transfer-Encoding", "gzip, chunked")], length=False)
                        + chunk(gzip.compress(b"hidden")) + LAST_CHUNK)
        await peer.wait_closed_by_client()

    async with Server(handle) as server:
        with pytest.raises(ConnectionBroke) as caught:
            await open_answer(client, server.url())
    assert caught.value.what == "upstream answered with Transfer-Encoding 'gzip, chunked', which Switchyard cannot read"


@pytest.mark.parametrize("coding", ["br", "zstd"])
async def test_a_cut_br_or_zstd_body_is_not_a_clean_end(client: UpstreamClient, coding: str) -> None:
    encoded = (_brotli if coding == "br" else zstd.compress)(b"plain text, " * 2000)

    async def handle(peer: Peer) -> None:
        await peer.read_request()
        await peer.send(response(headers=[("Content-Encoding", coding)], length=False), encoded[:len(encoded) // 2])
        peer.close()

    async with Server(handle) as server:
        answer = await open_answer(client, server.url())
        _, error = await read_all(answer)
    assert isinstance(error, ConnectionBroke)


async def test_corrupt_compressed_body_breaks(client: UpstreamClient) -> None:
    async with Server(answering(response(headers=[("Content-Encoding", "gzip")], body=b"not gzip at all"))) as server:
        answer = await open_answer(client, server.url())
        data, error = await read_all(answer)
        assert data == b""
        assert isinstance(error, ConnectionBroke)
        assert error.what == "malformed compressed body"


# ---------------------------------------------------------------------------
# 4-6: broken answers


@pytest.mark.parametrize("head, sent, received", [
    pytest.param(chunked_head(), chunk(b"hello ") + b"a\r\nwor", b"hello wor", id="chunked-mid-chunk"),
    pytest.param(response(headers=[("Content-Length", "100")], length=False),
                 b"only ten b", b"only ten b", id="content-length-short"),
])
async def test_body_cut_by_the_server(client: UpstreamClient, head: bytes, sent: bytes, received: bytes) -> None:
    async def handle(peer: Peer) -> None:
        await peer.read_request()
        await peer.send(head, sent)
        peer.close()

    async with Server(handle) as server:
        answer = await open_answer(client, server.url())
        data, error = await read_all(answer)
        assert data == received  # what arrived comes first ...
        assert isinstance(error, ConnectionBroke)  # ... then the break, never a clean end
        assert transport_failure(error).message == "connection reset"
        assert await answer.body.read_some() == (b"", error)
        assert client.idle_connections == 0


async def test_close_delimited_body_cut_by_a_reset_is_not_a_clean_end(client: UpstreamClient) -> None:
    """Without a length, a FIN ends the body; a RST (ECONNRESET) does not: it is a cut."""
    headers_read = asyncio.Event()
    sent = b"the first part of a longer answer"

    async def handle(peer: Peer) -> None:
        await peer.read_request()
        await peer.send(response(length=False), sent)
        async with asyncio.timeout(WAIT_S):
            await headers_read.wait()
        peer.writer.get_extra_info("socket").setsockopt(socket.SOL_SOCKET, socket.SO_LINGER, struct.pack("ii", 1, 0))
        peer.writer.transport.abort()  # linger 0: the close is a RST

    async with Server(handle) as server:
        answer = await open_answer(client, server.url())
        headers_read.set()
        data, error = await read_all(answer)
        assert sent.startswith(data)
        assert isinstance(error, ConnectionBroke), f"a reset ended the body cleanly after {data!r}"
        assert transport_failure(error).message == "connection reset"


async def test_close_delimited_gzip_body_cut_mid_stream_is_not_a_clean_end(client: UpstreamClient) -> None:
    """Without a length, only gzip's own end marker tells a whole body from a cut one."""
    plain = b"hello world " * 100
    encoded = gzip.compress(plain)

    async def handle(peer: Peer) -> None:
        await peer.read_request()
        await peer.send(response(headers=[("Content-Encoding", "gzip")], length=False), encoded[:len(encoded) // 2])
        peer.close()

    async with Server(handle) as server:
        answer = await open_answer(client, server.url())
        data, error = await read_all(answer)
        assert plain.startswith(data)
        assert isinstance(error, ConnectionBroke), f"half a gzip stream ended cleanly after {len(data)} bytes"
        assert error.what in ("connection reset", "malformed compressed body")


async def test_server_closes_before_answering(client: UpstreamClient) -> None:
    async def handle(peer: Peer) -> None:
        await peer.read_request()
        peer.close()

    async with Server(handle) as server:
        with pytest.raises(ConnectionBroke) as caught:
            await open_answer(client, server.url())
        assert transport_failure(caught.value).message == "connection reset"
        assert server.accepts == 1  # a fresh connection is not retried


async def test_connection_refused(client: UpstreamClient) -> None:
    with pytest.raises(OSError) as caught:
        await open_answer(client, f"http://127.0.0.1:{refused_port()}/")
    assert not isinstance(caught.value, ConnectionBroke)
    assert transport_failure(caught.value).message == "connection refused or unreachable"


@pytest.mark.parametrize("garbage", [
    pytest.param(b"SSH-2.0-OpenSSH_9.6\r\n", id="ssh-banner"),
    pytest.param(b"\x15\x03\x03\x00\x02\x02\x46", id="tls-alert"),
    pytest.param(b"HTTP/1.1 2x0 OK\r\n\r\n", id="bad-status"),
    pytest.param(b"HTTP/1.1 200 OK\r\nNo colon here\r\n\r\n", id="bad-header"),
])
async def test_garbage_instead_of_http(client: UpstreamClient, garbage: bytes) -> None:
    async def handle(peer: Peer) -> None:
        await peer.read_request()
        await peer.send(garbage)
        await peer.wait_closed_by_client()  # no close from here: the garbage alone must be enough

    async with Server(handle) as server:
        with pytest.raises(ConnectionBroke) as caught:
            await open_answer(client, server.url())
        assert caught.value.what == "malformed HTTP response"
        assert transport_failure(caught.value).message == "malformed HTTP response"


# ---------------------------------------------------------------------------
# 7: interim answers


INTERIM = (b"HTTP/1.1 100 Continue\r\n\r\n",
           b"HTTP/1.1 103 Early Hints\r\nLink: </style.css>; rel=preload\r\n\r\n")


@pytest.mark.parametrize("together", [pytest.param(True, id="one-write"), pytest.param(False, id="separate-writes")])
async def test_interim_answers_are_skipped(client: UpstreamClient, together: bool) -> None:
    final = response("201 Created", [("X-Final", "yes")], b"the real answer")

    async def handle(peer: Peer) -> None:
        await peer.read_request()
        if together:
            await peer.send(b"".join([*INTERIM, final]))
        else:
            await peer.send(*INTERIM, final)
        await peer.wait_closed_by_client()

    async with Server(handle) as server:
        answer = await open_answer(client, server.url(), "POST", body=b"{}")
        assert answer.status == 201
        assert answer.headers["x-final"] == "yes"
        assert "link" not in answer.headers  # the 103's headers are not the answer's
        assert await read_all(answer) == (b"the real answer", None)


# ---------------------------------------------------------------------------
# 8: keep-alive pooling


async def test_sequential_requests_share_one_connection(client: UpstreamClient) -> None:
    replies = (response(body=b"first"), response(body=b"second"), response(body=b"third"))
    async with Server(answering(*replies, requests=3)) as server:
        assert [await fetch(client, server.url(f"/{n}")) for n in range(3)] == [b"first", b"second", b"third"]
        assert server.accepts == 1
        assert [request_head(raw)[0] for raw in server.requests] == [f"GET /{n} HTTP/1.1" for n in range(3)]


async def test_connection_close_answer_is_not_reused(client: UpstreamClient) -> None:
    async with Server(answering(response(headers=[("Connection", "close")], body=b"bye"))) as server:
        assert await fetch(client, server.url()) == b"bye"
        assert client.idle_connections == 0
        assert await fetch(client, server.url()) == b"bye"
        assert server.accepts == 2


async def test_pooled_connection_closed_while_idle_is_replaced(client: UpstreamClient) -> None:
    async def answer_then_close(peer: Peer) -> None:
        await peer.read_request()
        await peer.send(response(body=b"first"))
        peer.close()  # an idle keep-alive connection the server drops

    async with Server(answer_then_close, answering(response(body=b"second"))) as server:
        assert await fetch(client, server.url()) == b"first"
        await eventually(lambda: client.idle_connections == 0)  # the client saw the close
        assert await fetch(client, server.url()) == b"second"
        assert server.accepts == 2


async def test_pooled_connection_closed_on_the_next_request_is_retried_once(client: UpstreamClient) -> None:
    """The race a pool cannot avoid: the server closes the idle connection as the
    next request goes out.  Nothing was received, so the request is sent again,
    once, on a fresh connection."""

    async def answer_once_then_drop(peer: Peer) -> None:
        await peer.read_request()
        await peer.send(response(body=b"first"))
        await peer.read_request()
        peer.close()  # read the second request, never answered it

    async with Server(answer_once_then_drop, answering(response(body=b"second"))) as server:
        assert await fetch(client, server.url("/one")) == b"first"
        answer = await open_answer(client, server.url("/two"), "POST", body=b"payload")
        assert await read_all(answer) == (b"second", None)
        assert server.accepts == 2
        assert len(server.requests) == 3 and server.requests[1] == server.requests[2]


async def test_pooled_connection_broken_after_answer_bytes_is_not_retried(client: UpstreamClient) -> None:
    async def answer_once_then_half_answer(peer: Peer) -> None:
        await peer.read_request()
        await peer.send(response(body=b"first"))
        await peer.read_request()
        await peer.send(b"HTTP/1.1 200 OK\r\nContent-")
        peer.close()

    async with Server(answer_once_then_half_answer, answering(response(body=b"never"))) as server:
        assert await fetch(client, server.url()) == b"first"
        with pytest.raises(ConnectionBroke) as caught:
            await open_answer(client, server.url(), "POST", body=b"payload")
        assert caught.value.what == "connection reset"
        assert server.accepts == 1  # the upstream may have acted on it: not sent twice


# ---------------------------------------------------------------------------
# 9: pipe


async def test_pipe_delivers_the_rest_of_the_body(client: UpstreamClient) -> None:
    go_on = asyncio.Event()
    later = (b"part two, ", b"part three")

    async def handle(peer: Peer) -> None:
        await peer.read_request()
        await peer.send(chunked_head() + chunk(b"part one, "))
        async with asyncio.timeout(WAIT_S):
            await go_on.wait()
        await peer.send(*(chunk(piece) for piece in later), LAST_CHUNK)
        await peer.wait_closed_by_client()

    async with Server(handle) as server:
        answer = await open_answer(client, server.url())
        received: list[bytes] = []
        finished = answer.body.pipe(received.append)
        go_on.set()
        async with asyncio.timeout(WAIT_S):
            assert await finished is None
        assert b"".join(received) == b"part one, part two, part three"


async def test_pipe_reports_a_cut(client: UpstreamClient) -> None:
    async def handle(peer: Peer) -> None:
        await peer.read_request()
        await peer.send(chunked_head(), chunk(b"partial"))
        peer.close()

    async with Server(handle) as server:
        answer = await open_answer(client, server.url())
        received: list[bytes] = []
        async with asyncio.timeout(WAIT_S):
            error = await answer.body.pipe(received.append)
        assert isinstance(error, ConnectionBroke) and error.what == "connection reset"
        assert b"".join(received) == b"partial"


async def test_pipe_raises_what_the_sink_raised(client: UpstreamClient) -> None:
    go_on = asyncio.Event()

    async def handle(peer: Peer) -> None:
        await peer.read_request()
        await peer.send(chunked_head())
        async with asyncio.timeout(WAIT_S):
            await go_on.wait()
        await peer.send(chunk(b"boom"), LAST_CHUNK)
        await peer.wait_closed_by_client()

    def sink(data: bytes) -> None:
        raise RuntimeError(f"sink refused {data!r}")

    async with Server(handle) as server:
        answer = await open_answer(client, server.url())
        finished = answer.body.pipe(sink)
        go_on.set()
        with pytest.raises(RuntimeError, match="sink refused b'boom'"):
            async with asyncio.timeout(WAIT_S):
                await finished


# ---------------------------------------------------------------------------
# 10: flow control


async def test_hold_pauses_reading_and_release_delivers_everything(client: UpstreamClient) -> None:
    size = 8 * 1024 * 1024  # far more than the kernel buffers on both sides hold for a reader that stopped
    body = random.Random(6).randbytes(size)
    written = asyncio.Event()

    async def handle(peer: Peer) -> None:
        sock = peer.writer.get_extra_info("socket")
        sock.setsockopt(socket.SOL_SOCKET, socket.SO_SNDBUF, 64 * 1024)  # no autotuning on our side
        await peer.read_request()
        peer.writer.write(response(body=body))
        async with asyncio.timeout(4 * WAIT_S):
            await peer.writer.drain()
        written.set()
        await peer.wait_closed_by_client()

    async with Server(handle) as server:
        answer = await open_answer(client, server.url())
        answer.body.hold(True)
        held: list[bytes] = []
        with contextlib.suppress(TimeoutError):  # what was already in flight, then nothing more
            while True:
                async with asyncio.timeout(0.5):
                    data, error = await answer.body.read_some()
                assert error is None and data, "the body ended while held"
                held.append(data)
        assert sum(map(len, held)) < size // 2
        assert not written.is_set()  # the server is blocked on its write

        answer.body.hold(False)
        rest, error = await read_all(answer)
        assert error is None
        assert b"".join(held) + rest == body
        async with asyncio.timeout(WAIT_S):
            await written.wait()


# ---------------------------------------------------------------------------
# 11: connect timeout includes the TLS handshake


async def test_tls_handshake_that_never_completes_is_a_connect_timeout(client: UpstreamClient) -> None:
    dropped = asyncio.Event()

    async def silent(peer: Peer) -> None:
        await peer.wait_closed_by_client()  # accept, never answer the ClientHello
        dropped.set()

    async with Server(silent) as server:
        with pytest.raises(ConnectTimeout, match="no connection within 0.3s"):
            await open_answer(client, server.url(scheme="https"), connect_timeout_s=0.3)
        assert server.accepts == 1  # TCP connected: it was the handshake that never finished
        async with asyncio.timeout(WAIT_S):
            await dropped.wait()  # and the half-open connection was closed, not leaked


async def test_an_untrusted_certificate_is_named_in_the_failure(client: UpstreamClient, tmp_path: Path) -> None:
    """What a user needs to fix it (a CA to trust), in the attempt's message."""
    from tests.support.tls import make_tls_files, server_context

    _, cert, key = make_tls_files(tmp_path)

    async def handshake(reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        with contextlib.suppress(OSError):
            await reader.read()
        writer.close()

    server = await asyncio.start_server(handshake, "127.0.0.1", 0, ssl=server_context(cert, key))
    port = server.sockets[0].getsockname()[1]
    try:
        with pytest.raises(OSError) as failed:
            await open_answer(client, f"https://127.0.0.1:{port}/v1/chat/completions")
    finally:
        server.close()
    assert transport_failure(failed.value).message.startswith("TLS handshake failed: certificate not trusted (")


# ---------------------------------------------------------------------------
# 12: request serialization


async def test_request_is_serialized_exactly(client: UpstreamClient) -> None:
    body = '{"model":"m","prompt":"héllo"}'.encode()
    async with Server(answering(response(body=b"ok"), requests=2)) as server:
        answer = await open_answer(client, server.url("/v1/chat/completions?stream=true"), "POST",
                                   [("Content-Type", "application/json"), ("X-Trace", "a b, c")], body)
        assert await read_all(answer) == (b"ok", None)
        line, headers, sent = request_head(server.requests[0])
        assert line == "POST /v1/chat/completions?stream=true HTTP/1.1"
        assert headers["host"] == f"127.0.0.1:{server.port}"
        assert headers["content-length"] == str(len(body))
        assert headers["content-type"] == "application/json"
        assert headers["x-trace"] == "a b, c"
        assert "proxy-authorization" not in headers
        assert sent == body

        await fetch(client, server.url(""))
        line, headers, sent = request_head(server.requests[1])
        assert line == "GET / HTTP/1.1"  # an empty path is "/"
        assert "content-length" not in headers and sent == b""


async def test_large_request_body_is_sent_whole(client: UpstreamClient) -> None:
    body = random.Random(12).randbytes(300 * 1024)
    async with Server(answering(response(body=b"ok"))) as server:
        answer = await open_answer(client, server.url("/upload"), "PUT", body=body)
        assert await read_all(answer) == (b"ok", None)
        assert request_head(server.requests[0])[2] == body


@pytest.mark.parametrize("name, value", [
    pytest.param("X-Note", "ok\r\nX-Injected: 1", id="crlf-in-value"),
    pytest.param("X-Note", "ok\nX-Injected: 1", id="lf-in-value"),
    pytest.param("X-Note", "ok\rX-Injected: 1", id="cr-in-value"),
    pytest.param("X-Bad\r\nX-Injected", "1", id="crlf-in-name"),
])
async def test_header_with_a_line_break_is_refused_before_sending(client: UpstreamClient, name: str,
                                                                   value: str) -> None:
    async with Server(answering(response(body=b"ok"))) as server:
        with pytest.raises(ValueError):
            await open_answer(client, server.url(), "POST", [(name, value)], b"{}")
        await asyncio.sleep(0.2)  # a connection made anyway would have been accepted by now
        assert server.accepts == 0 and server.requests == []


# ---------------------------------------------------------------------------
# 13: upstream proxy


async def test_http_through_an_upstream_proxy_uses_absolute_form_with_credentials() -> None:
    target_port = refused_port()  # never contacted: the proxy answers
    async with Server(answering(response(body=b"via proxy"))) as proxy:
        client = UpstreamClient(proxy=f"http://127.0.0.1:{proxy.port}", proxy_auth="user:pw")
        try:
            answer = await open_answer(client, f"http://127.0.0.1:{target_port}/path?q=1", "POST",
                                       [("Content-Type", "application/json")], b'{"a":1}')
            assert await read_all(answer) == (b"via proxy", None)
        finally:
            client.close()
        line, headers, sent = request_head(proxy.requests[0])
        assert line == f"POST http://127.0.0.1:{target_port}/path?q=1 HTTP/1.1"
        assert headers["proxy-authorization"] == "Basic " + base64.b64encode(b"user:pw").decode()
        assert headers["proxy-authorization"] == "Basic dXNlcjpwdw=="
        assert headers["host"] == f"127.0.0.1:{target_port}"
        assert sent == b'{"a":1}'


def test_a_malformed_upstream_auth_is_refused_not_ignored() -> None:
    from mitmproxy.exceptions import OptionsError

    with pytest.raises(OptionsError, match="Invalid upstream auth specification"):
        UpstreamClient(proxy="http://127.0.0.1:1", proxy_auth="no-colon")


async def test_https_through_an_upstream_proxy_sends_the_connect_mitmproxy_would() -> None:
    """Without mitmproxy's hook (no master), the CONNECT carries `upstream_auth` itself."""
    async with Server(answering(response("407 Proxy Authentication Required"))) as proxy:
        client = UpstreamClient(proxy=f"http://127.0.0.1:{proxy.port}", proxy_auth="user:pw")
        try:
            with pytest.raises(ConnectionRefusedError, match=r"refused CONNECT \(status 407\)"):
                await open_answer(client, "https://[::1]:8443/v1/chat/completions")
        finally:
            client.close()
    assert proxy.requests == [b"CONNECT [::1]:8443 HTTP/1.1\r\nHost: [::1]:8443\r\n"
                              b"Proxy-Authorization: Basic dXNlcjpwdw==\r\n\r\n"]


async def test_the_connect_is_what_mitmproxys_hook_made_of_it() -> None:
    seen: list[http.HTTPFlow] = []

    async def hook(flow: http.HTTPFlow) -> None:
        seen.append(flow)
        flow.request.headers["Proxy-Authorization"] = "Bearer from-the-hook"

    async with Server(answering(response("403 Forbidden"))) as proxy:
        client = UpstreamClient(proxy=f"http://127.0.0.1:{proxy.port}", proxy_auth="user:pw", connect_hook=hook,
                                connect_host_header=False)
        try:
            with pytest.raises(ConnectionRefusedError):
                await open_answer(client, "https://api.example.com/v1/chat/completions")
        finally:
            client.close()
    assert proxy.requests == [b"CONNECT api.example.com:443 HTTP/1.1\r\nProxy-Authorization: Bearer from-the-hook\r\n\r\n"]
    (flow,) = seen
    assert (flow.request.method, flow.request.authority, flow.server_conn.address) == (
        "CONNECT", "api.example.com:443", ("api.example.com", 443))


@pytest.mark.parametrize("reply", [
    pytest.param(b"HTTP/1.1 abc OK\r\n\r\n", id="no-status-code"),
    pytest.param(b"not a status line\r\n\r\n", id="no-status-line"),
    pytest.param(b"HTTP/1.1 200 OK\r\n\r\nhello", id="bytes-before-tls"),
])
async def test_a_malformed_reply_to_connect_is_a_transport_failure(reply: bytes) -> None:
    async def handle(peer: Peer) -> None:
        await peer.read_request()
        await peer.send(reply)
        await peer.wait_closed_by_client()

    async with Server(handle) as proxy:
        client = UpstreamClient(proxy=f"http://127.0.0.1:{proxy.port}")
        try:
            with pytest.raises(ConnectionBroke, match="malformed reply from the upstream proxy"):
                await open_answer(client, "https://api.example.com/v1/chat/completions")
        finally:
            client.close()


async def test_gzip_with_several_members_is_decoded_whole(client: UpstreamClient) -> None:
    """gzip allows members one after another (what `gzip.decompress` reads too)."""
    encoded = gzip.compress(b"part one;") + gzip.compress(b"part two")
    async with Server(answering(response(headers=[("Content-Encoding", "gzip")], body=encoded))) as server:
        assert await fetch(client, server.url()) == b"part one;part two"


# ---------------------------------------------------------------------------
# the client's query string on another origin, and as shown


def test_credential_query_parameters_never_cross_origins_and_the_rest_goes_as_written() -> None:
    original = ("https://api.example.com/v1/chat/completions"
                "?api-version=2024-10-21&key=sk-1&access_token=t-2&sig=s%2B3&stream&note=a%20b")
    same = target_url(original, "https://api.example.com/v1/chat/completions")
    assert same == original  # its own origin gets it all
    other = target_url(original, "https://backup.example.net/v1/chat/completions")
    assert other == "https://backup.example.net/v1/chat/completions?api-version=2024-10-21&stream&note=a%20b"
    assert redact_query(original) == ("https://api.example.com/v1/chat/completions?api-version=2024-10-21"
                                      "&key=[redacted]&access_token=[redacted]&sig=[redacted]&stream&note=a%20b")
    # an upstream's own query, from the rules, is its own: its key goes where it was written for
    own = "https://gateway.example.net/v1/chat/completions?key=gw-secret&x=1"
    assert target_url(original, own) == own


def test_behind_a_listener_that_knew_only_the_address_origins_are_told_by_name() -> None:
    """A local or transparent listener's flow: the URL holds the name the client meant,
    the address is where the original is reached.  A backup on that same name is the
    same origin: it gets the client's credentials, as it would in proxy mode."""
    original = OriginalRequest.of("POST", "https://api.openai.com/v1/chat/completions",
                                  (("Authorization", "Bearer sk-client"),), b"{}", {}, address="162.159.140.245")
    first = Upstream("openai", None, None, 1, None, ())
    cheaper = Upstream("openai-mini", "https://api.openai.com/v1/chat/completions", "gpt-4o-mini", 0, None, ())
    elsewhere = Upstream("backup", "https://backup.example.net/v1/chat/completions", None, 0, None, ())
    asked = build_request(original, first)
    assert (asked.url, asked.address) == ("https://api.openai.com/v1/chat/completions", "162.159.140.245")
    assert ("Authorization", "Bearer sk-client") in build_request(original, cheaper).headers
    assert build_request(original, cheaper).address is None  # reached by its name
    assert all(name != "Authorization" for name, _ in build_request(original, elsewhere).headers)


# ---------------------------------------------------------------------------
# what a hostile upstream can make the relay hold


@pytest.mark.parametrize("coding, compress", [
    pytest.param("gzip", _gzip, id="gzip"),
    pytest.param("deflate", zlib.compress, id="deflate"),
    pytest.param("br", _brotli, id="br"),
    pytest.param("zstd", zstd.compress, id="zstd"),
])
async def test_a_body_that_inflates_a_thousandfold_comes_out_whole_in_bounded_reads(
        client: UpstreamClient, coding: str, compress: Callable[[bytes], bytes]) -> None:
    plain = b"data: " + bytes(24 * 1024 * 1024) + b"\n\n" + b"data: [DONE]\n\n"
    encoded = compress(plain)
    assert len(encoded) < len(plain) // 300

    async with Server(answering(response(headers=[("Content-Encoding", coding)], body=encoded), requests=2)) as server:
        answer = await open_answer(client, server.url())
        chunks: list[bytes] = []
        async with asyncio.timeout(WAIT_S * 4):
            while True:
                data, error = await answer.body.read_some()
                if not data:
                    break
                chunks.append(data)
        assert error is None
        assert b"".join(chunks) == plain
        assert max(map(len, chunks)) <= 1024 * 1024 + 256 * 1024  # one decoding step (plus what came beside it)
        # whole and drained: the connection is reused for the next request
        assert await fetch(client, server.url()) == plain
    assert server.accepts == 1


async def test_an_endless_response_head_fails_the_attempt_at_its_bound(client: UpstreamClient) -> None:
    async def handle(peer: Peer) -> None:
        await peer.read_request()
        peer.writer.write(b"HTTP/1.1 200 OK\r\n")
        for n in range(4000):  # about 4 MB, far past the bound; the client leaves first
            peer.writer.write(b"X-Filler-%d: %s\r\n" % (n, b"v" * 1000))
            await peer.writer.drain()

    async with Server(handle) as server:
        with pytest.raises(ConnectionBroke) as caught:
            await open_answer(client, server.url())
    assert caught.value.what == "upstream sent more than 64 KiB of response head"


async def test_one_endless_header_line_fails_the_attempt_at_its_bound(client: UpstreamClient) -> None:
    async def handle(peer: Peer) -> None:
        await peer.read_request()
        peer.writer.write(b"HTTP/1.1 200 OK\r\nX-Long: ")
        for _ in range(4096):
            peer.writer.write(b"v" * 1024)
            await peer.writer.drain()

    async with Server(handle) as server:
        with pytest.raises(ConnectionBroke) as caught:
            await open_answer(client, server.url())
    assert caught.value.what == "upstream sent more than 64 KiB of response head"


async def test_too_many_header_lines_fail_the_attempt(client: UpstreamClient) -> None:
    head = b"HTTP/1.1 200 OK\r\n" + b"".join(b"X-%d: 1\r\n" % n for n in range(300)) + b"Content-Length: 0\r\n\r\n"
    async with Server(answering(head)) as server:
        with pytest.raises(ConnectionBroke) as caught:
            await open_answer(client, server.url())
    assert caught.value.what == "upstream sent more than 256 header lines"


async def test_endless_trailers_break_the_body_at_the_bound(client: UpstreamClient) -> None:
    async def handle(peer: Peer) -> None:
        await peer.read_request()
        peer.writer.write(chunked_head() + chunk(b"hello") + b"0\r\n")
        for n in range(100_000):
            peer.writer.write(b"X-Trailer-%d: %s\r\n" % (n, b"v" * 30))
            await peer.writer.drain()

    async with Server(handle) as server:
        answer = await open_answer(client, server.url())
        data, error = await read_all(answer)
    assert data == b"hello"
    assert isinstance(error, ConnectionBroke)
    assert error.what == "upstream sent more than 64 KiB of chunk framing or trailers"
