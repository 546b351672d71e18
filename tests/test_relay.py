"""The loopback relay on its own: real sockets on both sides, no mitmproxy.

The client here is a raw socket speaking to the relay as mitmproxy does (one
request with the token header, HTTP/1.1, reading the chunked answer); the
upstream is a scripted loopback server.  These cover what needs exact control
of timing and buffers on the client's side, which a real mitmproxy in between
would blur: a client that stops reading, a request that never completes, an
error body that breaks off.  Every wait is bounded; nothing asserts a duration.
"""

from __future__ import annotations

import asyncio
import json
import logging
import re
import socket
import struct
from collections.abc import AsyncIterator

import pytest

from switchyard_core.relay import TOKEN_HEADER, Relay, connection as relay_connection
from switchyard_core.exchange import OriginalRequest
from switchyard_core.relay.direct_line import ClientEnd
from switchyard_core.relay.ticket import Ticket
from switchyard_core.upstreams.client import UpstreamClient
from switchyard_core.rules.loader import AttemptSettings, Route, Upstream
from tests.support.scripted_server import (LAST_CHUNK, WAIT_S, Flood, Peer, Server, answering, chunk, chunked_head,
                                          dechunk)

BODY = json.dumps({"model": "gpt-4o", "stream": True, "messages": []}).encode()
DONE = b'data: {"choices":[{"index":0,"delta":{},"finish_reason":"stop"}]}\n\ndata: [DONE]\n\n'


def content(text: str) -> bytes:
    return b'data: {"choices":[{"index":0,"delta":{"content":"%s"}}]}\n\n' % text.encode()


def route(url: str, **settings: object) -> Route:
    upstream = Upstream(name="primary", url=url, model=None, retries=0, auth=None, headers=())
    return Route(name="chat", api="openai-chat", upstreams=(upstream,),
                 settings=AttemptSettings(**settings))  # type: ignore[arg-type]


@pytest.fixture
async def relay() -> AsyncIterator[Relay]:
    relay = Relay(UpstreamClient())
    await relay.start()
    try:
        yield relay
    finally:
        relay.stop()


async def ask(relay: Relay, token: str) -> tuple[asyncio.StreamReader, asyncio.StreamWriter]:
    """What mitmproxy sends the relay for a routed flow."""
    reader, writer = await asyncio.open_connection("127.0.0.1", relay.port)
    writer.write(b"POST /v1/chat/completions HTTP/1.1\r\nHost: 127.0.0.1\r\nContent-Type: application/json\r\n"
                 b"%b: %b\r\nContent-Length: %d\r\n\r\n%b" % (TOKEN_HEADER.encode(), token.encode(), len(BODY), BODY))
    await writer.drain()
    return reader, writer


def register(relay: Relay, upstream: Server, *, provisional: bool = False, **settings: object) -> Ticket:
    url = upstream.url("/v1/chat/completions")
    request = OriginalRequest.of("POST", url, (("Content-Type", "application/json"),), BODY, json.loads(BODY))
    return relay.register(route(url, **settings), request, provisional_head=provisional)


async def read_until_closed(reader: asyncio.StreamReader) -> bytes:
    data = b""
    async with asyncio.timeout(WAIT_S * 4):
        while chunk_ := await reader.read(1 << 20):
            data += chunk_
            if data.endswith(LAST_CHUNK):
                break
    return data


async def test_a_client_that_stops_reading_is_not_an_upstream_stall(relay: Relay) -> None:
    """The relay pauses the upstream while the client is not reading; that quiet
    is the client's, and must not end a healthy stream as `stream_stalled`."""
    frame = content("x" * 1000)
    frames = 20_000  # ~21 MB: far more than the kernel buffers hold

    async with Server(Flood(frame, frames, DONE)) as up:
        ticket = register(relay, up, idle_timeout_s=0.3)
        reader, writer = await ask(relay, ticket.token)
        async with asyncio.timeout(WAIT_S):
            head = await reader.readuntil(b"\r\n\r\n")
        connection = next(iter(relay.connections))
        buffered = 0
        for _ in range(30):  # the client stops reading for five idle bounds
            await asyncio.sleep(0.05)
            assert connection.transport is not None
            buffered = max(buffered, connection.transport.get_write_buffer_size())
        body = await read_until_closed(reader)
        writer.close()
    assert head.startswith(b"HTTP/1.1 200")
    assert buffered < 2 * 1024 * 1024  # the upstream waited: the relay did not take the answer in
    assert body.endswith(LAST_CHUNK)
    answer = dechunk(body)
    assert b"stream_stalled" not in answer
    assert answer == frame * frames + DONE


@pytest.mark.parametrize("provisional", [False, True], ids=["real-head", "provisional-head"])
async def test_an_error_body_that_breaks_off_reaches_the_client_broken_off(relay: Relay, provisional: bool) -> None:
    """The last upstream's 400 is forwarded as the provider sent it; when its body
    broke off, the client must not get it with a length that claims it whole."""
    whole = b'{"error": {"message": "bad request: messages[0] is wrong", "type": "invalid_request_error"}}'

    async def upstream(peer: Peer) -> None:
        await peer.read_request()
        await peer.send(b"HTTP/1.1 400 Bad Request\r\nContent-Type: application/json\r\n"
                        b"Content-Length: %d\r\n\r\n%b" % (len(whole), whole[:40]))
        peer.writer.get_extra_info("socket").setsockopt(socket.SOL_SOCKET, socket.SO_LINGER, struct.pack("ii", 1, 0))
        peer.writer.transport.abort()  # a reset, mid-body

    async with Server(upstream) as up:
        ticket = register(relay, up, provisional=provisional)
        reader, writer = await ask(relay, ticket.token)
        async with asyncio.timeout(WAIT_S):
            received = await reader.read()  # until the relay closes the connection
        writer.close()
    head, _, body = received.partition(b"\r\n\r\n")
    if provisional:  # the head the Router puts in place of the provisional one
        assert head.startswith(b"HTTP/1.1 200") and b"x-switchyard-provisional: 1" in head
        assert ticket.head is not None and ticket.head.done()
        decided = ticket.head.result()
        assert decided.status == 400 and decided.streamed
        assert "content-length" not in {name.lower() for name, _ in decided.headers}
    else:
        assert ticket.head is None
        assert head.startswith(b"HTTP/1.1 400")
        assert b"content-length" not in head.lower() and b"transfer-encoding: chunked" in head.lower()
    assert body == chunk(whole[:40])  # what came, and no last chunk: visibly cut


async def test_a_request_that_never_completes_does_not_hold_the_connection(
        relay: Relay, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(relay_connection, "REQUEST_READ_S", 0.3)
    reader, writer = await asyncio.open_connection("127.0.0.1", relay.port)
    writer.write(b"POST /v1/chat/completions HTTP/1.1\r\nHost: x\r\n")  # and never the rest
    await writer.drain()
    async with asyncio.timeout(WAIT_S):
        assert await reader.read() == b""  # closed by the relay
    writer.close()
    assert not relay.connections


async def test_an_unknown_token_gets_403_and_reaches_no_upstream(relay: Relay) -> None:
    async def upstream(peer: Peer) -> None:
        await peer.read_request()

    async with Server(upstream) as up:
        reader, writer = await ask(relay, "not-a-token")
        async with asyncio.timeout(WAIT_S):
            head = await reader.readuntil(b"\r\n\r\n")
        writer.close()
    assert head.startswith(b"HTTP/1.1 403")
    assert up.accepts == 0


async def test_a_connection_serves_one_request_after_another_even_under_an_eager_task_factory(relay: Relay) -> None:
    """mitmproxy runs new tasks eagerly and reuses its relay connection for the
    next flow of the same client connection; a 403 is served at once."""
    asyncio.get_running_loop().set_task_factory(asyncio.eager_task_factory)
    try:
        reader, writer = await ask(relay, "not-a-token")
        for _ in range(2):
            async with asyncio.timeout(WAIT_S):
                head = await reader.readuntil(b"\r\n\r\n")
                length = int(head.lower().split(b"content-length: ")[1].split(b"\r\n")[0])
                await reader.readexactly(length)
            assert head.startswith(b"HTTP/1.1 403")
            writer.write(b"POST /v1/chat/completions HTTP/1.1\r\nHost: 127.0.0.1\r\nContent-Length: 0\r\n\r\n")
            await writer.drain()
        writer.close()
    finally:
        asyncio.get_running_loop().set_task_factory(None)


async def test_an_answer_to_head_is_a_head_only_and_the_connection_stays_usable(relay: Relay) -> None:
    async def upstream(peer: Peer) -> None:
        raw = await peer.read_request()
        assert raw.startswith(b"HEAD ")
        await peer.send(b"HTTP/1.1 200 OK\r\nContent-Type: application/json\r\nContent-Length: 10\r\n\r\n")
        await peer.wait_closed_by_client()

    async with Server(upstream) as up:
        url = up.url("/v1/chat/completions")
        request = OriginalRequest.of("HEAD", url, (), b"", None)
        ticket = relay.register(route(url), request, provisional_head=True)
        reader, writer = await asyncio.open_connection("127.0.0.1", relay.port)
        writer.write(b"HEAD /v1/chat/completions HTTP/1.1\r\nHost: 127.0.0.1\r\n%b: %b\r\n\r\n"
                     % (TOKEN_HEADER.encode(), ticket.token.encode()))
        async with asyncio.timeout(WAIT_S):
            head = await reader.readuntil(b"\r\n\r\n")
        assert head.startswith(b"HTTP/1.1 200")
        # the next request on the connection is read as such: no body bytes were left behind
        writer.write(b"POST /v1/chat/completions HTTP/1.1\r\nHost: 127.0.0.1\r\nContent-Length: 0\r\n\r\n")
        async with asyncio.timeout(WAIT_S):
            after = await reader.readuntil(b"\r\n\r\n")
        writer.close()
    assert after.startswith(b"HTTP/1.1 403")


@pytest.mark.parametrize("method, upstream_head", [
    ("HEAD", b"HTTP/1.1 200 OK\r\nContent-Type: application/json\r\nContent-Length: 10\r\n\r\n"),
    ("POST", b"HTTP/1.1 204 No Content\r\n\r\n"),
    ("POST", b"HTTP/1.1 304 Not Modified\r\nETag: x\r\n\r\n"),
], ids=["head", "204", "304"])
async def test_an_answer_without_a_body_claims_no_length(relay: Relay, method: str, upstream_head: bytes) -> None:
    """204 and 304 must not carry a Content-Length, and an answer to HEAD must not claim 0."""
    async with Server(answering(upstream_head)) as up:
        url = up.url("/v1/chat/completions")
        ticket = relay.register(route(url), OriginalRequest.of(method, url, (), b"", None))
        reader, writer = await asyncio.open_connection("127.0.0.1", relay.port)
        writer.write(b"%b /v1/chat/completions HTTP/1.1\r\nHost: 127.0.0.1\r\n%b: %b\r\nContent-Length: 0\r\n\r\n"
                     % (method.encode(), TOKEN_HEADER.encode(), ticket.token.encode()))
        async with asyncio.timeout(WAIT_S):
            head = await reader.readuntil(b"\r\n\r\n")
        writer.close()
    status = upstream_head.split(b" ", 2)[1]
    assert head.startswith(b"HTTP/1.1 " + status)
    assert b"content-length" not in head.lower()


async def test_a_first_answer_is_logged_as_committed_once_the_exchange_ends(
        relay: Relay, caplog: pytest.LogCaptureFixture) -> None:
    """The first token's moment gets no log line: `switchyard.committed` comes at
    the end, with how the ticket ended."""
    caplog.set_level(logging.DEBUG, logger="switchyard")
    seen_before_end: list[str] = []
    client_has_it = asyncio.Event()

    async def upstream(peer: Peer) -> None:
        await peer.read_request()
        await peer.send(chunked_head([("Content-Type", "text/event-stream")]), chunk(content("hi")))
        async with asyncio.timeout(WAIT_S):
            await client_has_it.wait()  # the client has the first token
        seen_before_end.extend(r.getMessage() for r in caplog.records)
        await peer.send(chunk(DONE), LAST_CHUNK)
        await peer.wait_closed_by_client()

    async with Server(upstream) as up:
        ticket = register(relay, up)
        reader, writer = await ask(relay, ticket.token)
        first = b""
        async with asyncio.timeout(WAIT_S):
            while content("hi") not in first:  # whole inside its chunk
                more = await reader.read(65536)
                assert more, "the relay closed before the first token"
                first += more
        client_has_it.set()
        body = first + await read_until_closed(reader)
        writer.close()
    assert dechunk(body.split(b"\r\n\r\n", 1)[1]) == content("hi") + DONE
    assert not [m for m in seen_before_end if m.startswith("switchyard.committed")]
    committed = [r.getMessage() for r in caplog.records if r.getMessage().startswith("switchyard.committed")]
    assert len(committed) == 1
    assert re.fullmatch(r"switchyard\.committed route=chat upstream=primary attempt=1 first_event=chunk "
                        r"first_output_after_s=[0-9.]+ outcome=committed", committed[0])


async def test_a_client_that_leaves_after_output_is_logged_as_gone(
        relay: Relay, caplog: pytest.LogCaptureFixture) -> None:
    caplog.set_level(logging.DEBUG, logger="switchyard")
    client_left = asyncio.Event()

    async def upstream(peer: Peer) -> None:
        await peer.read_request()
        await peer.send(chunked_head([("Content-Type", "text/event-stream")]), chunk(content("hi")))
        async with asyncio.timeout(WAIT_S):
            await client_left.wait()
        await peer.wait_closed_by_client()  # the relay lets the upstream go too

    async with Server(upstream) as up:
        ticket = register(relay, up)
        reader, writer = await ask(relay, ticket.token)
        async with asyncio.timeout(WAIT_S):
            await reader.readuntil(b'"hi"')
        writer.close()
        client_left.set()
        async with asyncio.timeout(WAIT_S):
            while not any(r.getMessage().startswith("switchyard.committed") for r in caplog.records):
                await asyncio.sleep(0.01)
    lines = [r.getMessage() for r in caplog.records
             if r.getMessage().startswith(("switchyard.client_gone", "switchyard.committed"))]
    assert lines[0].startswith("switchyard.client_gone route=chat attempts=1")
    assert lines[1].startswith("switchyard.committed route=chat upstream=primary attempt=1")
    assert lines[1].endswith("outcome=client_gone")


async def open_streams(relay: Relay) -> tuple[asyncio.StreamReader, asyncio.StreamWriter]:
    return await asyncio.open_connection("127.0.0.1", relay.port)


def send_request(writer: asyncio.StreamWriter, token: str) -> None:
    writer.write(b"POST /v1/chat/completions HTTP/1.1\r\nHost: 127.0.0.1\r\nContent-Type: application/json\r\n"
                 b"%b: %b\r\nContent-Length: %d\r\n\r\n%b" % (TOKEN_HEADER.encode(), token.encode(), len(BODY), BODY))


async def test_an_answer_goes_in_process_to_the_reader_of_its_own_connection(relay: Relay) -> None:
    """Given mitmproxy's reader and writer of the connection an ticket comes on
    (here: this test's, the same asyncio streams), the relay feeds its answer to
    that reader; the bytes are the same as through the socket."""
    async with Server(answering(chunked_head([("Content-Type", "text/event-stream")])
                                + chunk(content("hi")) + chunk(DONE) + LAST_CHUNK)) as up:
        ticket = register(relay, up)
        reader, writer = await open_streams(relay)
        ticket.mitmproxy_streams = lambda: (reader, writer)
        send_request(writer, ticket.token)
        received = await read_until_closed(reader)
        writer.close()
    assert relay.direct_answers == 1 and relay.answers == 1
    head, _, body = received.partition(b"\r\n\r\n")
    assert head.startswith(b"HTTP/1.1 200")
    assert dechunk(body) == content("hi") + DONE


async def test_once_mitmproxy_has_sent_all_it_was_fed_the_body_goes_straight_to_the_client(relay: Relay) -> None:
    """The way to the client is asked for with the body bytes fed to mitmproxy so far
    (the Router's gives it once mitmproxy has sent that many on); here, once this test
    has read the head and the first chunk.  Until then chunks reach the reader; after,
    they go to the client's transport framed as mitmproxy frames them, each shown in
    the display copy and told to mitmproxy's inactivity watchdog; the end goes to the
    reader, for mitmproxy to end the flow with."""
    go_on = asyncio.Event()

    async def upstream(peer: Peer) -> None:
        await peer.read_request()
        await peer.send(chunked_head([("Content-Type", "text/event-stream")]), chunk(content("a")))
        async with asyncio.timeout(WAIT_S):
            await go_on.wait()
        await peer.send(chunk(content("b")), chunk(content("c")), chunk(DONE), LAST_CHUNK)

    got = bytearray()

    class Client(asyncio.Protocol):
        def data_received(self, data: bytes) -> None:
            got.extend(data)

    shown: list[bytes] = []
    activity: list[None] = []
    loop = asyncio.get_running_loop()
    client_server = await loop.create_server(Client, "127.0.0.1", 0)
    client_transport, _ = await loop.create_connection(asyncio.Protocol, "127.0.0.1",
                                                       client_server.sockets[0].getsockname()[1])
    try:
        async with Server(upstream) as up:
            ticket = register(relay, up)
            reader, writer = await open_streams(relay)
            ticket.mitmproxy_streams = lambda: (reader, writer)
            passed_on = 0  # body bytes this test has read: what mitmproxy would have sent on
            asked: list[tuple[int, int]] = []

            def client_end(fed: int) -> ClientEnd | None:
                asked.append((fed, passed_on))
                return ClientEnd(client_transport, lambda: activity.append(None), shown.append) if fed == passed_on else None

            ticket.client_end = client_end
            send_request(writer, ticket.token)
            async with asyncio.timeout(WAIT_S):
                early = await reader.readuntil(b'"a"}}]}\n\n\r\n')  # the head and the first chunk
            passed_on = len(content("a"))
            go_on.set()
            rest = await read_until_closed(reader)  # the end comes after everything before it
            writer.close()
            async with asyncio.timeout(WAIT_S):
                while not got.endswith(DONE + b"\r\n"):  # the last chunk, whole
                    await asyncio.sleep(0.01)
    finally:
        client_transport.close()
        client_server.close()
    assert relay.direct_answers == 1 and relay.client_answers == 1
    assert early.startswith(b"HTTP/1.1 200") and early.endswith(chunk(content("a")))
    assert dechunk(bytes(got) + LAST_CHUNK) == content("b") + content("c") + DONE  # in one chunk per upstream read
    assert b"".join(shown) == content("b") + content("c") + DONE and len(activity) == len(shown)
    assert rest == LAST_CHUNK
    assert asked[-1] == (len(content("a")), len(content("a")))  # asked again until mitmproxy had sent it all


async def test_an_answer_never_goes_to_the_reader_of_another_connection(relay: Relay) -> None:
    """Streams that are not mitmproxy's end of this very connection (a lookup gone
    wrong) are refused: the answer goes through the socket, the other reader gets nothing."""
    async with Server(answering(chunked_head([("Content-Type", "text/event-stream")])
                                + chunk(content("hi")) + chunk(DONE) + LAST_CHUNK)) as up:
        ticket = register(relay, up)
        other_reader, other_writer = await open_streams(relay)
        reader, writer = await open_streams(relay)
        ticket.mitmproxy_streams = lambda: (other_reader, other_writer)
        send_request(writer, ticket.token)
        received = await read_until_closed(reader)
        writer.close()
        other_writer.write_eof()  # the relay closes that idle connection: its reader ends
        async with asyncio.timeout(WAIT_S):
            stray = await other_reader.read()  # all it ever got
        other_writer.close()
    assert relay.direct_answers == 0 and relay.answers == 1
    assert dechunk(received.partition(b"\r\n\r\n")[2]) == content("hi") + DONE
    assert not stray


async def test_a_lookup_that_fails_leaves_the_answer_on_the_socket(relay: Relay, caplog: pytest.LogCaptureFixture) -> None:
    def broken() -> None:
        raise AttributeError("mitmproxy moved its internals")

    async with Server(answering(chunked_head([("Content-Type", "text/event-stream")])
                                + chunk(content("hi")) + chunk(DONE) + LAST_CHUNK)) as up:
        ticket = register(relay, up)
        ticket.mitmproxy_streams = broken  # type: ignore[assignment]
        reader, writer = await ask(relay, ticket.token)
        received = await read_until_closed(reader)
        writer.close()
    assert relay.direct_answers == 0
    assert dechunk(received.partition(b"\r\n\r\n")[2]) == content("hi") + DONE
    assert "switchyard.direct_line_unavailable error=\"AttributeError: mitmproxy moved its internals\"" in caplog.text


async def test_a_bug_in_the_lookup_costs_that_answer_and_is_logged_not_hidden(
        relay: Relay, caplog: pytest.LogCaptureFixture) -> None:
    def buggy() -> None:
        raise RuntimeError("a bug")

    async with Server(answering(chunked_head([("Content-Type", "text/event-stream")])
                                + chunk(content("hi")) + chunk(DONE) + LAST_CHUNK)) as up:
        ticket = register(relay, up)
        ticket.mitmproxy_streams = buggy  # type: ignore[assignment]
        reader, writer = await ask(relay, ticket.token)
        head, body = await read_answer(reader)
        writer.close()
    assert head.startswith(b"HTTP/1.1 502 ")
    assert b"switchyard: internal error (RuntimeError)" in body
    assert up.accepts == 1  # asked when routed, and let go
    assert "switchyard.internal_error" in caplog.text and "RuntimeError: a bug" in caplog.text


async def read_answer(reader: asyncio.StreamReader) -> tuple[bytes, bytes]:
    """One answer off a kept-alive connection: its head and its (de-chunked) body."""
    async with asyncio.timeout(WAIT_S):
        head = await reader.readuntil(b"\r\n\r\n")
        if b"transfer-encoding: chunked" in head.lower():
            return head, dechunk(await reader.readuntil(LAST_CHUNK))
        length = int(head.lower().split(b"content-length: ")[1].split(b"\r\n")[0])
        return head, await reader.readexactly(length)


async def test_one_connection_mixes_in_process_and_socket_answers_in_order(relay: Relay) -> None:
    """mitmproxy reuses its relay connection: an answer in-process, a 403 through
    the socket, another in-process, each whole and in its turn."""
    stream = (chunked_head([("Content-Type", "text/event-stream")]) + chunk(content("one")) + chunk(DONE) + LAST_CHUNK,
              chunked_head([("Content-Type", "text/event-stream")]) + chunk(content("two")) + chunk(DONE) + LAST_CHUNK)
    async with Server(answering(*stream, requests=2)) as up:
        reader, writer = await open_streams(relay)
        answers = []
        for which in ("first", "not-a-token", "second"):  # each routed when asked for: answered in order
            token = which
            if which != "not-a-token":
                ticket = register(relay, up)
                ticket.mitmproxy_streams = lambda: (reader, writer)
                token = ticket.token
            send_request(writer, token)
            answers.append(await read_answer(reader))
        writer.close()
    assert [head.split(b"\r\n")[0] for head, _ in answers] == [b"HTTP/1.1 200 OK", b"HTTP/1.1 403 Forbidden",
                                                              b"HTTP/1.1 200 OK"]
    assert answers[0][1] == content("one") + DONE and answers[2][1] == content("two") + DONE
    assert relay.direct_answers == 2 and relay.answers == 2  # the 403 is no ticket's answer


async def test_a_client_that_leaves_while_its_answer_is_held_releases_the_upstream(relay: Relay) -> None:
    """In-process, the upstream is held while mitmproxy does not read; when the
    client leaves instead, the upstream's connection is let go, not left paused."""
    total_frames = 40_000  # ~41 MB
    flood = Flood(content("x" * 1000), total_frames, DONE)

    async with Server(flood) as up:
        ticket = register(relay, up, idle_timeout_s=0.3)
        reader, writer = await open_streams(relay)
        ticket.mitmproxy_streams = lambda: (reader, writer)
        send_request(writer, ticket.token)
        held_at = await flood.until_held()
        writer.transport.abort()  # the client leaves; mitmproxy closes its relay connection
        async with asyncio.timeout(WAIT_S):
            await flood.ended.wait()  # the relay closed the connection (or, wrongly, read it all)
            while relay.in_flight or relay.connections:
                await asyncio.sleep(0.01)
    assert held_at < total_frames  # held: the kernel's buffers of one hop (a few MB as they grow) are not all of it
    assert flood.sent < total_frames  # let go part-way, not drained to the end
    assert relay.direct_answers == 1
    assert relay.in_flight == 0 and not relay.connections


async def test_a_request_offering_an_upgrade_is_served_as_an_ordinary_one(relay: Relay) -> None:
    """`Connection: Upgrade` (an h2c offer that reached the relay) is not taken up:
    the answer is the upstream's stream, and the offer does not travel upstream."""
    async with Server(answering(chunked_head([("Content-Type", "text/event-stream")])
                                + chunk(content("hi")) + chunk(DONE) + LAST_CHUNK)) as up:
        url = up.url("/v1/chat/completions")
        headers = (("Content-Type", "application/json"), ("Connection", "Upgrade, HTTP2-Settings"),
                   ("Upgrade", "h2c"), ("HTTP2-Settings", "AAMAAABkAARAAAAAAAIAAAAA"))
        ticket = relay.register(route(url), OriginalRequest.of("POST", url, headers, BODY, json.loads(BODY)))
        reader, writer = await open_streams(relay)
        writer.write(b"POST /v1/chat/completions HTTP/1.1\r\nHost: 127.0.0.1\r\nConnection: Upgrade, HTTP2-Settings\r\n"
                     b"Upgrade: h2c\r\nHTTP2-Settings: AAMAAABkAARAAAAAAAIAAAAA\r\nContent-Type: application/json\r\n"
                     b"%b: %b\r\nContent-Length: %d\r\n\r\n%b"
                     % (TOKEN_HEADER.encode(), ticket.token.encode(), len(BODY), BODY))
        head, body = await read_answer(reader)
        writer.close()
    assert head.startswith(b"HTTP/1.1 200")
    assert body == content("hi") + DONE
    sent = up.requests[0].split(b"\r\n\r\n")[0].lower()
    assert b"upgrade" not in sent and b"http2-settings" not in sent


async def test_a_first_attempt_sent_from_the_hook_is_the_one_the_relay_serves(relay: Relay) -> None:
    """The Router sends the first upstream its request before mitmproxy has passed the
    flow to the relay; serving the ticket then reads that answer, asking nothing twice."""
    async with Server(answering(chunked_head([("Content-Type", "text/event-stream")])
                                + chunk(content("hi")) + chunk(DONE) + LAST_CHUNK)) as up:
        ticket = register(relay, up)  # its first attempt is sent now
        async with asyncio.timeout(WAIT_S):
            while not up.requests:  # the upstream has it before the relay connection does
                await asyncio.sleep(0.01)
        reader, writer = await ask(relay, ticket.token)
        head, body = await read_answer(reader)
        writer.close()
    assert head.startswith(b"HTTP/1.1 200")
    assert body == content("hi") + DONE
    assert up.accepts == 1 and len(up.requests) == 1
    assert [record.outcome for record in ticket.exchange.attempts] == ["committed"]


async def test_a_flow_that_never_reaches_the_relay_lets_its_first_upstream_go(relay: Relay) -> None:
    """A flow killed (or whose client left) after the hook sent its first request:
    forgetting its token closes that upstream connection, and nothing is pooled."""
    asked, let_go = asyncio.Event(), asyncio.Event()

    async def upstream(peer: Peer) -> None:
        await peer.read_request()
        asked.set()
        await peer.wait_closed_by_client()  # never answers; returns once the relay hangs up
        let_go.set()

    async with Server(upstream) as up:
        ticket = register(relay, up)  # its first attempt is sent now
        async with asyncio.timeout(WAIT_S):
            await asked.wait()
        relay.forget(ticket.token)
        async with asyncio.timeout(WAIT_S):
            await let_go.wait()
    assert ticket.driver is not None and ticket.driver.done and relay.pending == 0
    assert relay.http.idle_connections == 0
    assert up.accepts == 1
