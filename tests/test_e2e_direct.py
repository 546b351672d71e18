"""The relay's answers reach mitmproxy in-process (relay/direct_line.py), or through
the loopback socket with `switchyard_direct_relay=false`: a client cannot tell.

Each behaviour runs on both: the shared mitmdump (in-process, the default) and one
started here with the option off (and debug verbosity).  What differs is only the bytes
that cross the loopback interface (/proc/net/dev: asyncio's send and recv are not in
/proc/<pid>/io).  The figure is machine-wide: the suite expects no other heavy loopback
traffic while it runs.
"""

from __future__ import annotations

import asyncio
from collections.abc import Iterator
from pathlib import Path

import pytest

from tests.conftest import BACKUP_SECRET, E2E_RULES, Env
from tests.support import wire
from tests.support.fake_provider import RESET, FakeProvider, Reply
from tests.support.mitm import Mitmdump, refused_port, start_mitmdump
from tests.support.scripted_server import LAST_CHUNK, WAIT_S, Flood, Server, dechunk

FRAME = wire.chat_chunk({"content": "y" * 1000})


@pytest.fixture(scope="module")
def socket_mitm(provider: FakeProvider, tmp_path_factory: pytest.TempPathFactory) -> Iterator[Mitmdump]:
    workdir = tmp_path_factory.mktemp("mitm-socket")
    rules = workdir / "rules.yaml"
    rules.write_text(E2E_RULES.format(p2=provider.ports[1], dead=refused_port()))
    dump = start_mitmdump(rules, workdir / "mitmdump.log",
                          extra_args=["--set", "switchyard_direct_relay=false", "--set", "termlog_verbosity=debug"],
                          env={"SWY_TEST_BACKUP_KEY": BACKUP_SECRET, "SWY_TEST_BACKUP_HOST": "127.0.0.1"})
    yield dump
    dump.stop()


@pytest.fixture(params=["in-process", "socket"])
def any_env(request: pytest.FixtureRequest, env: Env) -> Env:
    if request.param == "in-process":
        return env
    mitm: Mitmdump = request.getfixturevalue("socket_mitm")
    return Env(env.provider, mitm, Path(mitm.log_path).parent / "rules.yaml")


def loopback_bytes() -> int:
    """Bytes sent over the loopback interface so far (every test talks over it only)."""
    for line in Path("/proc/net/dev").read_text().splitlines():
        name, _, counters = line.partition(":")
        if name.strip() == "lo":
            return int(counters.split()[8])  # transmit bytes
    raise AssertionError("no loopback interface in /proc/net/dev")


def rss_mb(pid: int) -> float:
    for line in Path(f"/proc/{pid}/status").read_text().splitlines():
        if line.startswith("VmRSS:"):
            return int(line.split()[1]) / 1024
    raise AssertionError("no VmRSS in /proc/<pid>/status")


def test_in_process_answers_skip_the_relay_socket(any_env: Env, socket_mitm: Mitmdump) -> None:
    """The same bytes either way.  The answer crosses loopback from the upstream to
    the relay and from mitmproxy to the client; through the socket, also from the
    relay to mitmproxy."""
    frames = [wire.CHAT_ROLE, *[FRAME] * 4000, wire.CHAT_DONE]
    expected = b"".join(frames)
    crossings = []
    for _ in range(3):  # other loopback traffic on the machine only adds bytes: the least is this answer's
        any_env.provider.script("solo", Reply.sse(*frames))
        before = loopback_bytes()
        result = any_env.curl(any_env.provider.url("solo", "/v1/chat/completions"), any_env.chat_body())
        crossings.append(loopback_bytes() - before)
        assert result.status == 200
        assert result.body == expected
    crossed = min(crossings)
    assert [c.upstream for c in any_env.provider.calls] == ["solo"] * 3
    if any_env.mitm is socket_mitm:
        assert crossed > 2.9 * len(expected)
    else:
        assert 1.9 * len(expected) < crossed < 2.5 * len(expected)


def test_an_answer_cut_by_the_relay_reaches_the_client_whole_then_cut(any_env: Env) -> None:
    """A large error body that broke off is written to the client in one go, then
    cut: every byte before the cut arrives (not only what mitmproxy reads at once),
    then the end that tells the client it is not whole."""
    partial = b'{"error": {"message": "' + b"x" * 500_000
    any_env.provider.script("solo", Reply(400, [partial, RESET], content_type="application/json"))
    result = any_env.curl(any_env.provider.url("solo", "/v1/chat/completions"), any_env.chat_body())
    assert result.status == 400
    assert result.body == partial
    assert result.returncode == 18, result.stderr  # curl: the answer ended before it was whole (not a timeout)
    assert [c.upstream for c in any_env.provider.calls] == ["solo"]


async def test_a_client_that_stops_reading_stops_the_upstream(any_env: Env) -> None:
    """While the client does not read, the upstream is paused and nothing piles up
    in the proxy's memory (what the kernel's socket buffers hold, a few MB per hop
    as they grow, is not the proxy's); once the client reads again it gets every byte."""
    total_frames = 60_000  # ~61 MB: far beyond what the sockets of three hops hold
    flood = Flood(FRAME, total_frames, wire.CHAT_DONE)
    pid = any_env.mitm.process.pid
    async with Server(flood) as up:
        rss_before = rss_mb(pid)
        reader, writer = await asyncio.open_connection("127.0.0.1", any_env.mitm.proxy_port)
        body = any_env.chat_body()
        writer.write(b"POST %b HTTP/1.1\r\nHost: 127.0.0.1:%d\r\nContent-Type: application/json\r\n"
                     b"Content-Length: %d\r\n\r\n%b" % (up.url("/solo/v1/chat/completions").encode(), up.port,
                                                       len(body), body))
        async with asyncio.timeout(WAIT_S):
            head = await reader.readuntil(b"\r\n\r\n")
        # the client reads nothing more; wait until the upstream is held (bounded)
        rss = [rss_before]
        held_at = await flood.until_held(lambda: rss.append(rss_mb(pid)))
        rss_held = max(rss)
        received = bytearray()
        async with asyncio.timeout(WAIT_S * 6):
            while not received.endswith(LAST_CHUNK):
                data = await reader.read(1 << 20)
                assert data, "the proxy closed the connection early"
                received += data
        writer.close()
    assert head.startswith(b"HTTP/1.1 200")
    assert held_at < total_frames  # the upstream waited for the client
    assert rss_held - rss_before < 15  # MB; taking the answer in would have been ~60
    assert dechunk(bytes(received)) == FRAME * total_frames + wire.CHAT_DONE


def test_at_debug_verbosity_each_answer_gets_its_committed_line(env: Env, socket_mitm: Mitmdump) -> None:
    """The per-answer debug line is written only where it is shown: this mitmdump
    shows debug lines, so each first-attempt answer gets one, once it has ended."""
    debug = Env(env.provider, socket_mitm, Path(socket_mitm.log_path).parent / "rules.yaml")
    mark = socket_mitm.log_mark()
    result = debug.curl(env.provider.url("solo", "/v1/chat/completions"), debug.chat_body())
    assert result.status == 200
    line = socket_mitm.wait_for_log("switchyard.committed", mark)
    assert "switchyard.committed route=chat-solo upstream=solo attempt=1" in line
    assert "outcome=committed" in line


def test_a_real_mitmdump_has_every_private_part_switchyard_leans_on(socket_mitm: Mitmdump) -> None:
    """Checked once at start-up and said in one line: on the mitmproxy the project
    pins, the direct line, the held-back streaming note, the log-hook filter, the chunked
    reader and the hook dispatch are all on."""
    line = socket_mitm.wait_for_log("switchyard.mitmproxy_parts")
    assert ("direct_line=active streaming_note=active log_hook_filter=active chunked_reader=active "
            "hook_dispatch=active") in line


def test_a_real_mitmdump_keeps_full_collections_off_the_first_tokens_path(socket_mitm: Mitmdump) -> None:
    """The start-up heap frozen, and full collections moved to where no flow waits
    for its head (addons/heap.py; the policy itself in tests/test_heap.py)."""
    line = socket_mitm.wait_for_log("switchyard.heap")
    assert "startup_heap=frozen quiet_collections=active" in line


def test_what_mitmproxy_read_but_has_not_sent_yet_is_never_overtaken(env: Env) -> None:
    """A first answer write larger than mitmproxy reads at once (a big frame, held
    whole until it ends), then small frames, paced and all at once: mitmproxy may hold
    bytes it has read, with its reader empty, while it finishes the head (its event
    lock).  The body goes straight to the client only once mitmproxy has sent on every
    byte it was fed (counted by the display copy), so nothing overtakes them.  The
    interleaving that broke an earlier check (an empty reader) is timing-dependent: it
    was seen once in the whole suite, in test_e2e_continuation's staging-limit test;
    these answers are its shape, exact to the byte."""
    big = wire.chat_chunk({"content": "b" * 150_000})
    small = [wire.chat_chunk({"content": f"s{i} "}) for i in range(40)]
    frames = [wire.CHAT_ROLE, big, *small, wire.CHAT_DONE]
    for _ in range(8):
        env.provider.script("solo", Reply.sse(b"".join(frames[:2]), *frames[2:]), Reply.sse(b"".join(frames)))
        result = env.curl(env.provider.url("solo", "/v1/chat/completions"), env.chat_body())
        assert result.status == 200
        assert result.body == b"".join(frames)
        result = env.curl(env.provider.url("solo", "/v1/chat/completions"), env.chat_body())
        assert result.status == 200
        assert result.body == b"".join(frames)
