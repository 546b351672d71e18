"""mitmproxy's modes as users run them: HTTPS proxy with the CA, TLS upstreams, upstream-proxy mode.

Reverse mode is covered in test_e2e_chat.py (the shared mitmdump listens in both
regular and reverse mode).
"""

from __future__ import annotations

import ssl
import time
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path

import openai
import pytest

from tests.conftest import CLIENT_SECRET
from tests.support import wire
from tests.support.fake_provider import FakeProvider, Reply
from tests.support.mitm import Mitmdump, start_mitmdump
from tests.support.tls import make_tls_files, server_context

HEADLINE = wire.chat_error(503, "provider overloaded")

RULES = """\
version: 1
defaults: {{backoff_ms: 1, pre_answer_keepalive_s: 0, connect_timeout_s: 3, headers_timeout_s: 5}}
routes:
  - name: tls-chat
    match: {{path: /primary/v1/chat/completions}}
    upstreams:
      - {{name: primary, url: original, retries: 0}}
      - name: backup
        url: https://127.0.0.1:{tls}/backup/v1/chat/completions
        auth: {{header: Authorization, value: "Bearer sk-backup-over-tls"}}
  - name: tls-fail
    match: {{path: /tlsfail/v1/chat/completions}}
    upstreams:
      - {{name: notls, url: "https://127.0.0.1:{plain}/notls/v1/chat/completions", retries: 0}}
      - {{name: backup, url: "https://127.0.0.1:{tls}/backup/v1/chat/completions"}}
"""


@dataclass
class TlsSetup:
    provider: FakeProvider
    mitm: Mitmdump
    upstream_ca: Path

    @property
    def tls_port(self) -> int:
        return self.provider.ports[-1]

    def client(self, prefix: str = "primary") -> openai.OpenAI:
        """The openai SDK in proxy mode, trusting mitmproxy's CA and nothing else."""
        mitm_ca = Path(self.mitm.log_path).parent / "mitmproxy-conf" / "mitmproxy-ca-cert.pem"
        verify = ssl.create_default_context(cafile=str(mitm_ca))
        return openai.OpenAI(
            api_key=CLIENT_SECRET,
            base_url=f"https://127.0.0.1:{self.tls_port}/{prefix}/v1",
            max_retries=0,
            http_client=openai.DefaultHttpxClient(proxy=self.mitm.proxy_url, verify=verify, trust_env=False),
        )


def stream_text(client: openai.OpenAI) -> str:
    stream = client.chat.completions.create(model="gpt-4o", messages=[{"role": "user", "content": "hi"}], stream=True)
    return "".join(chunk.choices[0].delta.content or "" for chunk in stream if chunk.choices)


@pytest.fixture(scope="module")
def tls(tmp_path_factory: pytest.TempPathFactory) -> Iterator[TlsSetup]:
    workdir = tmp_path_factory.mktemp("tls")
    ca, cert, key = make_tls_files(workdir)
    provider = FakeProvider().start(ssl_context=server_context(cert, key))
    rules = workdir / "rules.yaml"
    rules.write_text(RULES.format(tls=provider.ports[-1], plain=provider.ports[0]))
    dump = start_mitmdump(rules, workdir / "mitmdump.log", extra_args=["--set", f"ssl_verify_upstream_trusted_ca={ca}"])
    yield TlsSetup(provider, dump, ca)
    dump.stop()
    provider.stop()


def test_https_proxy_mode_with_the_mitmproxy_ca_falls_back_over_tls(tls: TlsSetup) -> None:
    tls.provider.reset()
    tls.provider.script("primary", Reply.sse(HEADLINE))
    assert stream_text(tls.client()) == wire.answer_text("backup")
    primary, backup = tls.provider.calls
    assert (primary.upstream, primary.port) == ("primary", tls.tls_port)
    assert primary.headers["Authorization"] == f"Bearer {CLIENT_SECRET}"
    assert (backup.upstream, backup.port) == ("backup", tls.tls_port)
    # same host and port, so the same origin: https://127.0.0.1:<tls> both times; the
    # backup's own auth replaces the client's because the rule says so
    assert backup.headers["Authorization"] == "Bearer sk-backup-over-tls"


def test_https_upstream_verified_with_mitmproxys_trusted_ca_option(tls: TlsSetup) -> None:
    tls.provider.reset()
    assert stream_text(tls.client()) == wire.answer_text("primary")
    assert [c.upstream for c in tls.provider.calls] == ["primary"]


def test_tls_handshake_failure_is_a_retryable_transport_failure(tls: TlsSetup) -> None:
    tls.provider.reset()
    mark = tls.mitm.log_mark()
    assert stream_text(tls.client("tlsfail")) == wire.answer_text("backup")
    log = tls.mitm.wait_for_log("switchyard.fallback_answered", mark)
    assert "upstream=notls attempt=1 phase=connect event=transport decision=next_upstream" in log
    assert 'message="TLS handshake failed (WRONG_VERSION_NUMBER)"' in log  # https to a port that speaks plain HTTP


def test_upstream_proxy_mode_sends_every_attempt_through_the_upstream_proxy(tmp_path: Path) -> None:
    """...and only the attempts of flows that came in on that listener: a second,
    regular listener of the same mitmproxy goes straight to the upstreams."""
    from tests.support.mitm import free_port

    provider = FakeProvider().start()
    # the upstream proxy wants credentials: the relay must send mitmproxy's upstream_auth
    upstream_proxy = start_mitmdump(tmp_path / "none.yaml", tmp_path / "upstream-proxy.log", bare=True,
                                    extra_args=["--set", "proxyauth=corp:hunter22"])
    rules = tmp_path / "rules.yaml"
    rules.write_text(f"""\
version: 1
defaults: {{backoff_ms: 1, pre_answer_keepalive_s: 0}}
routes:
  - name: chat
    match: {{path: /primary/v1/chat/completions}}
    upstreams:
      - {{name: primary, url: original, retries: 0}}
      - {{name: backup, url: "http://127.0.0.1:{provider.ports[1]}/backup/v1/chat/completions"}}
""")
    regular_port = free_port()
    dump = start_mitmdump(rules, tmp_path / "mitmdump.log", mode=f"upstream:{upstream_proxy.proxy_url}",
                          extra_args=["--set", "upstream_auth=corp:hunter22", "--mode", f"regular@{regular_port}"])
    try:
        provider.script("primary", Reply.sse(HEADLINE))
        client = openai.OpenAI(api_key=CLIENT_SECRET, base_url=provider.url("primary", "/v1"), max_retries=0,
                               http_client=openai.DefaultHttpxClient(proxy=dump.proxy_url, trust_env=False))
        assert stream_text(client) == wire.answer_text("backup")
        assert [c.upstream for c in provider.calls] == ["primary", "backup"]
        deadline = time.monotonic() + 10
        while time.monotonic() < deadline:
            seen = upstream_proxy.log()
            if "/primary/v1/chat/completions" in seen and "/backup/v1/chat/completions" in seen:
                break
            time.sleep(0.05)
        seen = upstream_proxy.log()
        assert f"POST http://127.0.0.1:{provider.ports[0]}/primary/v1/chat/completions" in seen
        assert f"POST http://127.0.0.1:{provider.ports[1]}/backup/v1/chat/completions" in seen

        provider.reset()
        provider.script("primary", Reply.sse(HEADLINE))
        direct = openai.OpenAI(api_key=CLIENT_SECRET, base_url=provider.url("primary", "/v1"), max_retries=0,
                               http_client=openai.DefaultHttpxClient(proxy=f"http://127.0.0.1:{regular_port}",
                                                                     trust_env=False))
        assert stream_text(direct) == wire.answer_text("backup")
        assert [c.upstream for c in provider.calls] == ["primary", "backup"]
        assert "proxy-authorization" not in {k.lower() for k in provider.calls[0].headers}
        time.sleep(0.3)  # anything sent through the upstream proxy would be in its log by now
        assert upstream_proxy.log().count("/primary/v1/chat/completions") == seen.count("/primary/v1/chat/completions")
    finally:
        dump.stop()
        upstream_proxy.stop()
        provider.stop()


def test_http2_client_gets_the_fallback_stream_byte_for_byte(tls: TlsSetup) -> None:
    import subprocess

    tls.provider.reset()
    tls.provider.script("primary", Reply.sse(HEADLINE))
    mitm_ca = Path(tls.mitm.log_path).parent / "mitmproxy-conf" / "mitmproxy-ca-cert.pem"
    done = subprocess.run(
        ["curl", "-sS", "-N", "--http2", "--max-time", "20", "--cacert", str(mitm_ca), "-x", tls.mitm.proxy_url,
         "--noproxy", "", "-w", "\\nversion=%{http_version}", "-H", f"Authorization: Bearer {CLIENT_SECRET}",
         "--data-binary", '{"model":"gpt-4o","stream":true,"messages":[]}',
         f"https://127.0.0.1:{tls.tls_port}/primary/v1/chat/completions"],
        capture_output=True, timeout=30,
    )
    body, _, version = done.stdout.rpartition(b"\nversion=")
    assert version == b"2", done.stderr
    assert body == b"".join(wire.chat_stream(wire.answer_text("backup")))
