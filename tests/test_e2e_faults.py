"""`faults:` in rules.yaml: every kind, through a real mitmdump, on real upstream answers."""

from __future__ import annotations

import json
from collections.abc import Iterator
from pathlib import Path

import openai
import pytest

from tests.conftest import CLIENT_SECRET, Env
from tests.support import wire
from tests.support.fake_provider import FakeProvider, Reply
from tests.support.mitm import Mitmdump, start_mitmdump

FAULT_RULES = """\
version: 1
defaults: {{backoff_ms: 1, max_backoff_ms: 50, pre_answer_keepalive_s: 0, idle_timeout_s: 2}}
routes:
{routes}
faults:
  - {{route: f-sse, upstream: primary, kind: sse_error, status: 503, message: injected overload, after_frames: 1}}
  - {{route: f-http, upstream: primary, kind: http_error, status: 429, message: injected rate limit}}
  - {{route: f-failed, upstream: primary, kind: response_failed, status: 503}}
  - {{route: f-overload, upstream: primary, kind: overload_message}}
  - {{route: f-reset, upstream: primary, kind: reset, after_frames: 1}}
  - {{route: f-stall, upstream: primary, kind: stall}}
  - {{route: f-after, upstream: primary, kind: sse_error, status: 503, after_frames: 3}}
  - {{route: f-count, upstream: primary, kind: http_error, status: 503, count: 1}}
  - {{route: f-never, kind: http_error, rate: 0.0}}
  - {{route: f-anthropic, upstream: primary, kind: sse_error, status: 529, after_frames: 2}}
"""
ROUTE = """\
  - name: {name}
    match: {{path: /{name}/v1/{api_path}}}
    {extra}
    upstreams:
      - {{name: primary, url: original, retries: {retries}}}
      - {{name: backup, url: "http://127.0.0.1:{port}/backup/v1/{api_path}"}}
"""


@pytest.fixture(scope="module")
def faulty(provider: FakeProvider, tmp_path_factory: pytest.TempPathFactory) -> Iterator[Mitmdump]:
    workdir = tmp_path_factory.mktemp("faults")
    routes = []
    for name, api_path, retries, extra in [
        ("f-sse", "chat/completions", 1, ""),
        ("f-http", "chat/completions", 1, ""),
        ("f-failed", "responses", 0, ""),
        ("f-overload", "chat/completions", 0, ""),
        ("f-reset", "chat/completions", 0, ""),
        ("f-stall", "chat/completions", 0, "first_output_timeout_s: 0.5"),
        ("f-after", "chat/completions", 1, ""),
        ("f-count", "chat/completions", 1, ""),
        ("f-never", "chat/completions", 0, ""),
        ("f-anthropic", "messages", 0, ""),
    ]:
        routes.append(ROUTE.format(name=name, api_path=api_path, retries=retries, extra=extra, port=provider.ports[1]))
    rules = workdir / "rules.yaml"
    rules.write_text(FAULT_RULES.format(routes="".join(routes)))
    dump = start_mitmdump(rules, workdir / "mitmdump.log")
    yield dump
    dump.stop()


@pytest.fixture
def fenv(env: Env, faulty: Mitmdump) -> Env:
    return Env(env.provider, faulty, Path(faulty.log_path).parent / "rules.yaml")


def chat(fenv: Env, route: str) -> bytes:
    result = fenv.curl(fenv.provider.url(route, "/v1/chat/completions"), fenv.chat_body())
    assert result.status == 200
    return result.body


def answer(upstream: str) -> bytes:
    return b"".join(wire.chat_stream(wire.answer_text(upstream)))


def test_sse_error_after_one_frame_is_retried_until_the_next_upstream(fenv: Env) -> None:
    mark = fenv.mitm.log_mark()
    assert chat(fenv, "f-sse") == answer("backup")
    # the fault truncates real answers: the real upstream was called each time
    assert [c.upstream for c in fenv.provider.calls] == ["f-sse", "f-sse", "backup"]
    log = fenv.mitm.wait_for_log("switchyard.fallback_answered", mark)
    assert "switchyard.fault_injected route=f-sse upstream=primary attempt=1 kind=sse_error after_frames=1" in log
    assert 'fault=sse_error decision=retry' in log and 'message="injected overload"' in log


def test_http_error_replaces_the_real_answer(fenv: Env) -> None:
    assert chat(fenv, "f-http") == answer("backup")
    assert [c.upstream for c in fenv.provider.calls] == ["f-http", "f-http", "backup"]


def test_http_error_reaches_the_client_as_sent_when_nothing_else_is_left(fenv: Env) -> None:
    fenv.provider.script("backup", *[Reply.json(503, {"error": {"message": "backup down"}})] * 2)
    result = fenv.curl(fenv.provider.url("f-http", "/v1/chat/completions"), fenv.chat_body())
    assert result.status == 503 and json.loads(result.body) == {"error": {"message": "backup down"}}


def test_response_failed_on_the_responses_api_falls_back_for_the_openai_sdk(fenv: Env) -> None:
    client = openai.OpenAI(api_key=CLIENT_SECRET, base_url=fenv.provider.url("f-failed", "/v1"), max_retries=0,
                           http_client=openai.DefaultHttpxClient(proxy=fenv.mitm.proxy_url, trust_env=False))
    events = list(client.responses.create(model="gpt-4o", input="hi", stream=True))
    text = "".join(e.delta for e in events if e.type == "response.output_text.delta")
    assert text == wire.answer_text("backup")
    assert [e.type for e in events].count("response.failed") == 0
    assert [c.upstream for c in fenv.provider.calls] == ["f-failed", "backup"]


def test_overload_message_without_a_code_falls_back(fenv: Env) -> None:
    assert chat(fenv, "f-overload") == answer("backup")


def test_reset_after_a_frame_falls_back(fenv: Env) -> None:
    assert chat(fenv, "f-reset") == answer("backup")


def test_stall_falls_back_after_the_first_output_timeout(fenv: Env) -> None:
    assert chat(fenv, "f-stall") == answer("backup")
    assert [c.upstream for c in fenv.provider.calls] == ["f-stall", "backup"]


def test_fault_after_output_is_forwarded_not_retried(fenv: Env) -> None:
    body = chat(fenv, "f-after")
    real = wire.chat_stream(wire.answer_text("f-after"))
    # three real frames (role + two words), then the injected error, rewritten for clients
    assert body.startswith(b"".join(real[:3]))
    tail = json.loads(body[len(b"".join(real[:3])):].removeprefix(b"data: "))
    assert tail["error"] == {"code": 503, "message": "provider overloaded (switchyard fault)"}
    assert [c.upstream for c in fenv.provider.calls] == ["f-after"]


def test_count_caps_how_often_a_fault_fires(fenv: Env) -> None:
    assert chat(fenv, "f-count") == answer("f-count")  # fired once, the retry got the real answer
    assert chat(fenv, "f-count") == answer("f-count")  # cap reached: untouched
    assert [c.upstream for c in fenv.provider.calls] == ["f-count", "f-count", "f-count"]


def test_rate_zero_never_fires(fenv: Env) -> None:
    assert chat(fenv, "f-never") == answer("f-never")


def test_anthropic_fault_is_shaped_for_the_anthropic_sdk(fenv: Env) -> None:
    import anthropic

    client = anthropic.Anthropic(api_key=CLIENT_SECRET, base_url=fenv.provider.url("f-anthropic", ""), max_retries=0,
                                 http_client=anthropic.DefaultHttpxClient(proxy=fenv.mitm.proxy_url, trust_env=False))
    with client.messages.stream(model="claude-opus-4-7", max_tokens=64, messages=[{"role": "user", "content": "hi"}]) as stream:
        text = "".join(stream.text_stream)
    assert text == wire.answer_text("backup")
    assert [c.upstream for c in fenv.provider.calls] == ["f-anthropic", "backup"]
