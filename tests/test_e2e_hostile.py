"""Hostile peers and careless settings, through a real mitmdump.

Each hostile input meets a stated bound (README, Security): the proxy's peak
memory (VmHWM of the real mitmdump process) stays under MEMORY_BOUND_MB while a
normal request through it is answered; credentials stay with their origin;
control characters never reach the terminal raw.  The hostile upstream is a
raw socket server of the test's own, speaking exactly the bytes each test
needs.
"""

from __future__ import annotations

import gzip
import hashlib
import json
import socket
import socketserver
import subprocess
import threading
import time
import zlib
from collections.abc import Iterator
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path

import pytest

from tests.conftest import CLIENT_SECRET, CurlResult, Env
from tests.support import wire
from tests.support.fake_provider import FakeProvider, Reply
from tests.support.mitm import ADDON, MITMDUMP, Mitmdump, start_mitmdump
from tests.test_load import memory_kib

MEMORY_BOUND_MB = 200  # the README's bound; each input below, unbounded, takes mitmdump far past it
HOSTILE_KEY = "sk-hostile-backup-KEY-5e6f7a8b"
BOMB_LINE = b'data: {"id":"c1","object":"chat.completion.chunk","choices":[{"index":0,"delta":{"content":"' + \
    b"a" * 1000 + b'"}}]}\n\n'
BOMB_FRAMES = 128 * 1024  # 128 MiB decoded, about 130 KB on the wire

RULES = """\
version: 1
defaults: {{retries: 0, backoff_ms: 1, headers_timeout_s: 10, idle_timeout_s: 5, pre_answer_keepalive_s: 0}}
routes:
  - name: normal
    match: {{path: /solo/v1/chat/completions}}
    upstreams:
      - {{name: solo, url: original}}
  - name: bomb
    match: {{path: /bomb/v1/chat/completions}}
    upstreams:
      - {{name: bomb, url: "http://127.0.0.1:{hostile}/bomb/v1/chat/completions"}}
      - {{name: backup, url: "http://127.0.0.1:{p2}/backup/v1/chat/completions"}}
  - name: flood
    match: {{path: /flood/v1/chat/completions}}
    upstreams:
      - {{name: flood, url: "http://127.0.0.1:{hostile}/flood/v1/chat/completions"}}
      - {{name: backup, url: "http://127.0.0.1:{p2}/backup/v1/chat/completions"}}
  - name: chat
    match: {{path: /primary/v1/chat/completions}}
    upstreams:
      - {{name: primary, url: original}}
      - name: backup
        url: http://127.0.0.1:{p2}/backup/v1/chat/completions
        model: backup-model
        auth: {{header: Authorization, value: "Bearer ${{SWY_HOSTILE_KEY}}"}}
  - name: forwarding
    match: {{path: /fwd/v1/chat/completions}}
    upstreams:
      - {{name: fwd, url: original}}
      - name: backup
        url: http://127.0.0.1:{p2}/backup/v1/chat/completions
        forward_headers: [X-Auth-Token]
        forward_query: [subscription-key]
  - name: pinger
    match: {{path: /pinger/v1/chat/completions}}
    request_timeout_s: 1
    upstreams:
      - {{name: pinger, url: original}}
      - {{name: backup, url: "http://127.0.0.1:{p2}/backup/v1/chat/completions"}}
  - name: echo
    match: {{path: /echo/v1/chat/completions}}
    upstreams:
      - name: backup
        url: http://127.0.0.1:{p2}/backup/v1/chat/completions
        auth: {{header: Authorization, value: "Bearer ${{SWY_HOSTILE_KEY}}"}}
"""

BACKUP_BYTES = b"".join(wire.chat_stream(wire.answer_text("backup")))
SOLO_BYTES = b"".join(wire.chat_stream(wire.answer_text("solo")))


BOMB_END = wire.chat_chunk({}, "stop") + wire.CHAT_DONE


def _gzip_stream(piece: bytes, count: int, tail: bytes = b"") -> bytes:
    """`piece` `count` times, then `tail`, gzip-compressed without holding it whole."""
    compressor = zlib.compressobj(9, zlib.DEFLATED, 16 + zlib.MAX_WBITS)
    return b"".join(compressor.compress(piece) for _ in range(count)) + compressor.compress(tail) + compressor.flush()


class _Hostile(socketserver.BaseRequestHandler):
    """`/bomb/...`: a 200 SSE answer that inflates a thousandfold; `/flood/...`: a status
    line, then header lines until the reader gives up."""

    server: "HostileServer"

    def handle(self) -> None:
        sock: socket.socket = self.request
        sock.settimeout(10)
        head = b""
        while b"\r\n\r\n" not in head and len(head) < 1 << 20:
            data = sock.recv(65536)
            if not data:
                return
            head += data
        path = head.split(b" ", 2)[1]
        try:
            if path.startswith(b"/bomb/"):
                body = self.server.bomb
                sock.sendall(b"HTTP/1.1 200 OK\r\nContent-Type: text/event-stream\r\nContent-Encoding: gzip\r\n"
                             b"Content-Length: %d\r\n\r\n" % len(body))
                for start in range(0, len(body), 16384):
                    sock.sendall(body[start:start + 16384])
                sock.recv(1)  # until the reader closes
            elif path.startswith(b"/flood/"):
                sock.sendall(b"HTTP/1.1 200 OK\r\n")
                line = b"X-Flood: " + b"f" * 1000 + b"\r\n"
                for _ in range(2_000_000):  # 2 GB at most; the reader closes long before
                    sock.sendall(line)
                    self.server.flood_sent += len(line)
        except OSError:
            pass


class HostileServer(socketserver.ThreadingTCPServer):
    daemon_threads = True
    allow_reuse_address = True

    def __init__(self) -> None:
        super().__init__(("127.0.0.1", 0), _Hostile)
        self.bomb = _gzip_stream(BOMB_LINE, BOMB_FRAMES, BOMB_END)
        self.flood_sent = 0
        self.port = self.server_address[1]


@pytest.fixture(scope="module")
def hostile() -> Iterator[HostileServer]:
    server = HostileServer()
    thread = threading.Thread(target=server.serve_forever, daemon=True)
    thread.start()
    yield server
    server.shutdown()
    server.server_close()


@pytest.fixture(scope="module")
def proxy(provider: FakeProvider, hostile: HostileServer, tmp_path_factory: pytest.TempPathFactory) -> Iterator[Mitmdump]:
    workdir = tmp_path_factory.mktemp("hostile")
    rules = workdir / "rules.yaml"
    rules.write_text(RULES.format(p2=provider.ports[1], hostile=hostile.port))
    dump = start_mitmdump(rules, workdir / "mitmdump.log", env={"SWY_HOSTILE_KEY": HOSTILE_KEY})
    yield dump
    dump.stop()


@pytest.fixture
def env(provider: FakeProvider, proxy: Mitmdump) -> Iterator[Env]:
    provider.reset()
    yield Env(provider, proxy, proxy.log_path.parent / "rules.yaml")
    provider.reset()


def url(env: Env, prefix: str, query: str = "") -> str:
    return env.provider.url(prefix, "/v1/chat/completions") + query


def peak_mb(dump: Mitmdump) -> float:
    return memory_kib(dump.process.pid, "VmHWM") / 1024


def curl_file(env: Env, target: str, body: Path, headers: dict[str, str], *, out: Path | None = None) -> CurlResult:
    """curl with the body from a file (large), its answer body to `out` if given."""
    args = ["curl", "-sS", "-N", "--max-time", "60", "-x", env.mitm.proxy_url, "--noproxy", "", "-X", "POST",
            "--data-binary", f"@{body}", "-H", "Content-Type: application/json",
            "-H", f"Authorization: Bearer {CLIENT_SECRET}", "-D", "-"]
    for name, value in headers.items():
        args += ["-H", f"{name}: {value}"]
    if out is not None:
        args += ["-o", str(out)]
    done = subprocess.run([*args, target], capture_output=True, timeout=90)
    return CurlResult.parse(done.stdout, done.returncode, done.stderr)


def answered_meanwhile(env: Env) -> bytes:
    """A normal request, sent while a hostile one is in flight: what its client got."""
    return env.curl(url(env, "solo"), env.chat_body()).body


# --- memory a peer controls -------------------------------------------------------------


def test_a_routed_request_body_that_inflates_to_a_gibibyte_goes_unrouted_in_bounded_memory(
        env: Env, tmp_path: Path) -> None:
    head = b'{"model":"gpt-4o","stream":true,"messages":[],"padding":"'
    body = tmp_path / "bomb.json.gz"
    body.write_bytes(_gzip_stream(head, 1) + _gzip_stream(b" " * (1 << 20), 1024))  # two gzip members, 1 GiB in all
    assert body.stat().st_size < 2 * 1024 * 1024
    mark = env.mitm.log_mark()
    with ThreadPoolExecutor(2) as pool:
        bomb = pool.submit(curl_file, env, url(env, "primary"), body, {"Content-Encoding": "gzip"})
        meanwhile = pool.submit(answered_meanwhile, env)
        result = bomb.result(timeout=120)
        assert meanwhile.result(timeout=60) == SOLO_BYTES
    # unrouted: the origin itself answered (its server refuses a body that large), no Switchyard headers
    assert result.status == 413 and "x-switchyard-upstream" not in result.headers
    log = env.mitm.wait_for_log("switchyard.not_routed", mark)
    assert log.count("switchyard.not_routed") == 1
    assert ('switchyard.not_routed route=chat reason="request body is over 32 MiB (decoded); sent to its '
            'destination unrouted"') in log
    assert env.provider.calls_to("backup") == []
    assert peak_mb(env.mitm) < MEMORY_BOUND_MB


def test_an_answer_that_inflates_a_thousandfold_flows_whole_in_bounded_memory(
        env: Env, hostile: HostileServer, tmp_path: Path) -> None:
    request = tmp_path / "request.json"
    request.write_bytes(env.chat_body())
    out = tmp_path / "answer.sse"
    with ThreadPoolExecutor(2) as pool:
        bomb = pool.submit(curl_file, env, url(env, "bomb"), request, {}, out=out)
        meanwhile = pool.submit(answered_meanwhile, env)
        result = bomb.result(timeout=120)
        assert meanwhile.result(timeout=60) == SOLO_BYTES
    assert result.status == 200 and result.headers["x-switchyard-upstream"] == "bomb"
    assert "content-encoding" not in result.headers
    # every decoded byte, in order
    expected = hashlib.sha256()
    for _ in range(BOMB_FRAMES):
        expected.update(BOMB_LINE)
    expected.update(BOMB_END)
    assert out.stat().st_size == len(BOMB_LINE) * BOMB_FRAMES + len(BOMB_END)
    assert hashlib.sha256(out.read_bytes()).hexdigest() == expected.hexdigest()
    assert peak_mb(env.mitm) < MEMORY_BOUND_MB


def test_an_error_body_that_inflates_a_thousandfold_is_read_to_its_bound_and_the_backup_answers(env: Env) -> None:
    bomb = Reply(503, [_gzip_stream(b'{"error":{"message":"' + b"o" * 1000, 512 * 1024)],
                 content_type="application/json", headers={"Content-Encoding": "gzip"})
    env.provider.script("primary", bomb)
    mark = env.mitm.log_mark()
    result = env.curl(url(env, "primary"), env.chat_body())
    assert result.body == BACKUP_BYTES and result.headers["x-switchyard-upstream"] == "backup"
    assert "upstream=primary attempt=1 phase=headers status=503" in env.mitm.wait_for_log("switchyard.fallback_answered",
                                                                                          mark)
    assert peak_mb(env.mitm) < MEMORY_BOUND_MB


def test_an_upstream_sending_header_lines_forever_fails_at_the_bound_and_the_backup_answers(
        env: Env, hostile: HostileServer) -> None:
    mark = env.mitm.log_mark()
    with ThreadPoolExecutor(2) as pool:
        flood = pool.submit(env.curl, url(env, "flood"), env.chat_body())
        meanwhile = pool.submit(answered_meanwhile, env)
        result = flood.result(timeout=60)
        assert meanwhile.result(timeout=60) == SOLO_BYTES
    assert result.body == BACKUP_BYTES
    log = env.mitm.wait_for_log("switchyard.fallback_answered", mark)
    assert ('upstream=flood attempt=1 phase=headers event=transport decision=next_upstream '
            'message="upstream sent more than 64 KiB of response head"') in log
    assert hostile.flood_sent < 16 * 1024 * 1024  # the reader left at its bound (plus what the sockets buffered)
    assert peak_mb(env.mitm) < MEMORY_BOUND_MB


# --- timeouts a peer cannot stretch -------------------------------------------------------


def test_comments_before_output_do_not_stretch_request_timeout(env: Env) -> None:
    """An upstream sending `: ping` forever and nothing else is given up on
    `request_timeout_s` after the attempt began (first_output_timeout_s off)."""
    env.provider.script("pinger", Reply.sse(*[b": ping\n\n", 0.05] * 600))  # 30 s of pings
    mark = env.mitm.log_mark()
    result = env.curl(url(env, "pinger"), env.chat_body(), max_time=15)
    assert result.body == BACKUP_BYTES and result.headers["x-switchyard-upstream"] == "backup"
    log = env.mitm.wait_for_log("switchyard.fallback_answered", mark)
    assert ('upstream=pinger attempt=1 phase=staging status=504 event=timeout decision=next_upstream '
            'message="no output within 1s"') in log


# --- what a request carries ----------------------------------------------------------------


def test_half_a_surrogate_pair_survives_the_model_rewrite(env: Env) -> None:
    body = b'{"model":"gpt-4o","stream":true,"messages":[{"role":"user","content":"cut \\ud83d here \xc3\xa9"}]}'
    env.provider.script("primary", Reply.sse(wire.chat_error(503, "overloaded")))
    result = env.curl(url(env, "primary"), body)
    assert result.status == 200 and result.body == BACKUP_BYTES
    backup = env.provider.calls_to("backup")[0]
    assert backup.json() == {**json.loads(body), "model": "backup-model"}
    assert b"\\ud83d" in backup.body


def test_a_gzip_encoded_request_body_is_routed_by_its_model_and_rewritten_for_the_backup(env: Env) -> None:
    plain = env.chat_body(temperature=0.5)
    env.provider.script("primary", Reply.sse(wire.chat_error(503, "overloaded")))
    result = env.curl(url(env, "primary"), gzip.compress(plain), headers={"Content-Encoding": "gzip"})
    assert result.body == BACKUP_BYTES
    primary, backup = env.provider.calls
    # both get the body decoded, as the relay read it (a rewrite needs it so), never a stale coding
    assert primary.body == plain and "Content-Encoding" not in primary.headers
    assert backup.json() == {**json.loads(plain), "model": "backup-model"}
    assert "Content-Encoding" not in backup.headers


# --- credentials ---------------------------------------------------------------------------

CLIENT_CREDENTIALS = {
    "Ocp-Apim-Subscription-Key": "apim-CLIENT-SECRET-1",
    "X-Amz-Security-Token": "amz-CLIENT-SECRET-2",
    "X-Auth-Token": "auth-CLIENT-SECRET-3",
    "X-Vendor-Api-Key": "vendor-CLIENT-SECRET-4",
}
CREDENTIAL_QUERY = "?subscription-key=q-CLIENT-SECRET-5&access-token=q-CLIENT-SECRET-6&x-api-key=q-CLIENT-SECRET-7&alt=sse"


def test_credentials_not_on_any_list_never_reach_another_origin(env: Env) -> None:
    env.provider.script("primary", Reply.sse(wire.chat_error(503, "overloaded")))
    headers = {**CLIENT_CREDENTIALS, "X-Team": "dev"}
    result = env.curl(url(env, "primary", CREDENTIAL_QUERY), env.chat_body(), headers=headers)
    assert result.body == BACKUP_BYTES
    primary, backup = env.provider.calls
    assert all(primary.headers[name] == value for name, value in CLIENT_CREDENTIALS.items())  # its own origin
    assert backup.port == env.provider.ports[1]
    sent = {name.lower(): value for name, value in backup.headers.items()}
    assert not {name.lower() for name in CLIENT_CREDENTIALS} & set(sent)
    assert sent["x-team"] == "dev" and sent["authorization"] == f"Bearer {HOSTILE_KEY}"
    assert primary.query == CREDENTIAL_QUERY[1:]
    assert backup.query == "alt=sse"
    assert "CLIENT-SECRET" not in json.dumps(sent)


def test_an_upstream_gets_the_credentials_it_names_and_no_others(env: Env) -> None:
    env.provider.script("fwd", Reply.sse(wire.chat_error(503, "overloaded")))
    result = env.curl(url(env, "fwd", CREDENTIAL_QUERY), env.chat_body(), headers=CLIENT_CREDENTIALS)
    assert result.body == BACKUP_BYTES
    backup = env.provider.calls_to("backup")[0]
    sent = {name.lower(): value for name, value in backup.headers.items()}
    assert sent["x-auth-token"] == "auth-CLIENT-SECRET-3"
    assert not {"ocp-apim-subscription-key", "x-amz-security-token", "x-vendor-api-key", "authorization"} & set(sent)
    assert backup.query == "subscription-key=q-CLIENT-SECRET-5&alt=sse"


def test_a_backups_own_key_echoed_in_its_error_never_reaches_the_client(env: Env) -> None:
    refusal = {"error": {"message": f"Incorrect API key provided: {HOSTILE_KEY}. You can find your API key at "
                                    "https://example.com.", "type": "invalid_request_error", "code": "invalid_api_key"}}
    env.provider.script("backup", Reply.json(401, refusal))
    mark = env.mitm.log_mark()
    result = env.curl(url(env, "echo"), env.chat_body())
    assert result.status == 401
    assert json.loads(result.body)["error"]["message"] == ("Incorrect API key provided: [redacted]. You can find your "
                                                           "API key at https://example.com.")
    assert HOSTILE_KEY not in env.mitm.wait_for_log("switchyard.attempt_failed", mark)


def test_a_backups_own_key_echoed_in_a_stream_error_never_reaches_the_client(env: Env) -> None:
    env.provider.script("backup", Reply.sse(wire.chat_error(503, f"key {HOSTILE_KEY} is overloaded")))
    result = env.curl(url(env, "echo"), env.chat_body())
    assert HOSTILE_KEY.encode() not in result.body
    assert b"key [redacted] is overloaded" in result.body


# --- the log -------------------------------------------------------------------------------


def test_control_characters_from_an_upstream_never_reach_the_terminal_raw(env: Env) -> None:
    message = "bad\x1b[2J\x1b[Hrequest\x08\x08\x9b31m\x07"
    env.provider.script("solo", Reply.json(400, {"error": {"message": message, "type": "invalid_request_error"}}))
    mark = env.mitm.log_mark()
    env.curl(url(env, "solo"), env.chat_body())
    log = env.mitm.wait_for_log("switchyard.attempt_failed", mark)
    assert 'message="bad\\u001b[2J\\u001b[Hrequest\\b\\b\\u009b31m\\u0007"' in log
    raw = env.mitm.log_path.read_bytes()
    assert b"\x1b" not in raw and b"\x08" not in raw and "\x9b".encode() not in raw


# --- flows from a file ---------------------------------------------------------------------


def test_flows_read_from_a_file_are_never_routed(tmp_path: Path, provider: FakeProvider) -> None:
    from mitmproxy import io
    from mitmproxy.test import tflow

    rules = tmp_path / "rules.yaml"
    rules.write_text(RULES.format(p2=provider.ports[1], hostile=1))
    flow = tflow.tflow()  # no answer: one loaded so is what a replay would send
    flow.request.url = provider.url("primary", "/v1/chat/completions")
    flow.request.method = "POST"
    flow.request.content = b'{"model":"gpt-4o","stream":true,"messages":[]}'
    with (tmp_path / "in.flows").open("wb") as handle:
        io.FlowWriter(handle).add(flow)
    done = subprocess.run(
        [str(MITMDUMP), "-n", "-r", str(tmp_path / "in.flows"), "-w", str(tmp_path / "out.flows"), "-s", str(ADDON),
         "--set", f"switchyard_rules={rules}", "--set", f"confdir={tmp_path / 'conf'}"],
        capture_output=True, timeout=60, cwd=tmp_path,
    )
    assert done.returncode == 0, done.stderr.decode()
    with (tmp_path / "out.flows").open("rb") as handle:
        [written] = list(io.FlowReader(handle).stream())
    assert written.request.url == provider.url("primary", "/v1/chat/completions")
    assert "x-switchyard-token" not in written.request.headers
    assert "switchyard" not in written.metadata
    assert provider.calls == []


# --- rules.yaml that would freeze the proxy --------------------------------------------------

LAUGHS = "".join(f"l{n}: &l{n} [{', '.join([f'*l{n - 1}'] * 9) if n else '1, 2, 3, 4, 5, 6, 7, 8, 9'}]\n"
                 for n in range(10))


def test_an_alias_bomb_saved_while_running_is_refused_and_the_last_good_rules_keep_answering(
        tmp_path: Path, provider: FakeProvider) -> None:
    rules = tmp_path / "rules.yaml"
    good = RULES.format(p2=provider.ports[1], hostile=1)
    rules.write_text(good)
    dump = start_mitmdump(rules, tmp_path / "mitmdump.log", env={"SWY_HOSTILE_KEY": HOSTILE_KEY})
    try:
        mark = dump.log_mark()
        time.sleep(1.1)  # a different mtime second for coarse file systems
        rules.write_text(good + LAUGHS)
        log = dump.wait_for_log("switchyard.rules_invalid", mark)
        assert f"{rules}:{good.count(chr(10)) + 6}: invalid YAML: more than 100,000 values once its aliases are expanded" \
            in log
        assert "kept=\"last good rules\"" in log
        provider.reset()
        provider.script("solo", Reply.sse(wire.chat_error(503, "overloaded")))
        env = Env(provider, dump, rules)
        result = env.curl(url(env, "solo"), env.chat_body())
        assert result.headers["x-switchyard-upstream"] == "solo"  # still routed, by the last good rules
        assert peak_mb(dump) < MEMORY_BOUND_MB
    finally:
        dump.stop()
        provider.reset()


@pytest.mark.parametrize("text, line, problem", [
    ("version: 1\n" + LAUGHS, 7, "invalid YAML: more than 100,000 values once its aliases are expanded"),
    ("version: 1\nroutes: " + "[" * 20000 + "]" * 20000 + "\n", 2, "invalid YAML: nested more than 50 levels deep"),
], ids=["alias-bomb", "deep-nesting"])
def test_a_hostile_rules_file_stops_start_up_at_once_naming_its_line(tmp_path: Path, text: str, line: int,
                                                                     problem: str) -> None:
    rules = tmp_path / "rules.yaml"
    rules.write_text(text)
    done = subprocess.run(
        [str(MITMDUMP), "-s", str(ADDON), "--listen-host", "127.0.0.1", "-p", "0", "--set", f"switchyard_rules={rules}",
         "--set", f"confdir={tmp_path / 'conf'}"],
        capture_output=True, timeout=60, cwd=tmp_path,
    )
    output = (done.stdout + done.stderr).decode()
    assert done.returncode != 0
    assert f"{rules}:{line}: {problem}" in output
    assert "Traceback" not in output and "RecursionError" not in output


# --- what mitmweb keeps ---------------------------------------------------------------------


def test_mitmweb_keeps_a_mebibyte_of_each_failed_attempt_however_much_it_held(
        tmp_path: Path, provider: FakeProvider) -> None:
    """Each of 20 fallbacks follows a failed attempt that held 5 MB; mitmweb keeps 1 MiB
    of each (its attempt flow says it was cut), and grows by about that, not by all
    they held."""
    from tests.support.mitm import free_port
    import urllib.request

    rules = tmp_path / "rules.yaml"
    rules.write_text(RULES.format(p2=provider.ports[1], hostile=1))
    held = [wire.CHAT_ROLE] * 20_000
    web = start_mitmdump(rules, tmp_path / "mitmweb.log", web=True, env={"SWY_HOSTILE_KEY": HOSTILE_KEY},
                         extra_args=["--set", "web_open_browser=false", "--set", f"web_port={free_port()}"])
    try:
        provider.reset()
        env = Env(provider, web, rules)
        fallbacks = 20
        provider.script("primary", *[Reply.sse(*held, wire.chat_error(503, "overloaded"))] * (fallbacks + 1))
        assert env.curl(url(env, "primary"), env.chat_body()).body == BACKUP_BYTES  # warm: the relay is up
        before = memory_kib(web.process.pid, "VmRSS") / 1024
        for _ in range(fallbacks):
            assert env.curl(url(env, "primary"), env.chat_body()).body == BACKUP_BYTES
        grown = memory_kib(web.process.pid, "VmRSS") / 1024 - before
        assert grown < 75, f"mitmweb grew by {grown:.0f} MB for {fallbacks} fallbacks"
        base, _, token = web.web_url.partition("?")
        opener = urllib.request.build_opener(urllib.request.ProxyHandler({}))
        with opener.open(f"{base.rstrip('/')}/flows?{token}", timeout=10) as answer:
            flows = json.loads(answer.read())
        attempts = [f for f in flows if "; attempt 1 (chat: primary)" in f.get("comment", "")]
        assert len(attempts) == fallbacks + 1
        assert {f["response"]["contentLength"] for f in attempts} == {1024 * 1024}
        size = len(b"".join(held)) + len(wire.chat_error(503, "overloaded"))
        assert all(f["comment"].endswith(f"; answer cut to its first 1048576 of {size} bytes") for f in attempts)
    finally:
        web.stop()
        provider.reset()


def test_a_backups_own_key_echoed_in_its_answer_never_reaches_the_client(env: Env) -> None:
    env.provider.script("backup", Reply.sse(*wire.chat_stream(f"your key is {HOSTILE_KEY} ok")))
    result = env.curl(url(env, "echo"), env.chat_body())
    assert result.body == b"".join(wire.chat_stream(f"your key is {HOSTILE_KEY} ok")).replace(
        HOSTILE_KEY.encode(), b"[redacted]")
