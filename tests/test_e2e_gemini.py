"""Google Gemini through a real mitmdump, a loopback upstream that speaks Gemini's API,
Google's google-genai SDK, curl, and the real Gemini CLI.

The `gemini` route: upstream `primary` is the request's own destination
(retries: 1, so two attempts); `backup` is on the fake provider's second port,
names its own model call in its URL (`gemini-2.5-flash-lite`), and carries its
own key in the query (`?key=${SWY_TEST_GEMINI_KEY}`), never the client's.  Wire
shapes come from reference/provider-sse-shapes.md §4 and the fixtures beside
the classifier tests.
"""

from __future__ import annotations

import json
import subprocess
from collections.abc import Iterator
from pathlib import Path

import pytest
from google import genai
from google.genai import errors, types

from tests.conftest import BACKUP_SECRET, Env
from tests.support import gemini_wire, wire
from tests.support.agents import agent_binary
from tests.support.fake_provider import NORMAL, RESET, FakeProvider, Reply
from tests.support.mitm import Mitmdump, start_mitmdump

FIXTURES = Path(__file__).parent / "fixtures"
CLIENT_KEY = "AIzaSy-client-GEMINI-5e6f7a"
MODEL = "gemini-2.5-flash"
STREAM_PATH = f"/v1beta/models/{MODEL}:streamGenerateContent"

RULES = """\
version: 1
defaults:
  retries: 1
  backoff_ms: 1
  max_backoff_ms: 3000
  headers_timeout_s: 5
  idle_timeout_s: 3
  pre_answer_keepalive_s: 0
routes:
  - name: gemini
    match: {{path: "/primary/v1*/models/*"}}
    upstreams:
      - {{name: primary, url: original}}
      - name: backup
        url: "http://127.0.0.1:{p2}/backup/v1beta/models/gemini-2.5-flash-lite:generateContent?key=${{SWY_TEST_GEMINI_KEY}}"
        retries: 0
  - name: gemini-pro
    match: {{path: "/routed/v1*/models/*", model: "gemini-2.5-pro*"}}
    upstreams:
      - {{name: routed, url: original, model: gemini-2.5-flash}}
  - name: gemini-faulty
    match: {{path: "/faulty/v1*/models/*"}}
    upstreams:
      - {{name: faulty, url: original, retries: 0}}
      - name: backup
        url: "http://127.0.0.1:{p2}/backup"
        auth: {{header: x-goog-api-key, value: "${{SWY_TEST_GEMINI_KEY}}"}}
  - name: gemini-keepalive
    match: {{path: "/keepalive/v1*/models/*"}}
    pre_answer_keepalive_s: 0.2
    upstreams:
      - {{name: keepalive, url: original, retries: 0}}
      - {{name: backup, url: "http://127.0.0.1:{p2}/backup"}}
faults:
  - {{route: gemini-faulty, upstream: faulty, kind: sse_error, status: 503, message: "The model is overloaded."}}
"""


@pytest.fixture(scope="module")
def gemini_mitm(provider: FakeProvider, tmp_path_factory: pytest.TempPathFactory) -> Iterator[Mitmdump]:
    workdir = tmp_path_factory.mktemp("mitm-gemini")
    rules = workdir / "rules.yaml"
    rules.write_text(RULES.format(p2=provider.ports[1]))
    dump = start_mitmdump(rules, workdir / "mitmdump.log", reverse_target=f"http://127.0.0.1:{provider.ports[0]}",
                          env={"SWY_TEST_GEMINI_KEY": BACKUP_SECRET})
    yield dump
    dump.stop()


@pytest.fixture
def env(provider: FakeProvider, gemini_mitm: Mitmdump) -> Iterator[Env]:
    provider.reset()
    yield Env(provider, gemini_mitm, Path(gemini_mitm.log_path).parent / "rules.yaml")
    provider.reset()


def client(env: Env, prefix: str = "primary") -> genai.Client:
    return genai.Client(api_key=CLIENT_KEY,
                        http_options=types.HttpOptions(base_url=f"{env.mitm.reverse_url}/{prefix}"))


def stream_text(env: Env, collected: list[str] | None = None, prefix: str = "primary") -> str:
    """Stream with the SDK (python-genai checks every chunk for an error)."""
    pieces = collected if collected is not None else []
    sdk = client(env, prefix)  # held: a client collected mid-stream closes its connection
    for chunk in sdk.models.generate_content_stream(model=MODEL, contents="say hello"):
        pieces.append(chunk.text or "")
    return "".join(pieces)


def curl_stream(env: Env, prefix: str = "primary", query: str = "alt=sse",  # type: ignore[no-untyped-def]
                key_header: bool = True):
    body = json.dumps({"contents": [{"role": "user", "parts": [{"text": "say hello"}]}]}).encode()
    return env.curl(f"{env.mitm.reverse_url}/{prefix}{STREAM_PATH}?{query}", body,
                    headers={"x-goog-api-key": CLIENT_KEY} if key_header else {}, via_proxy=False)


def upstreams(env: Env) -> list[str]:
    return [call.upstream for call in env.provider.calls]


def unavailable() -> Reply:
    return Reply.sse(*[(FIXTURES / "gemini_unavailable_first.sse").read_bytes()])


def text_of(upstream: str) -> str:
    return wire.answer_text(upstream)


def stream_bytes(upstream: str) -> bytes:
    return b"".join(gemini_wire.stream(text_of(upstream)))


# --- google-genai, streaming ------------------------------------------------------


def test_in_stream_unavailable_before_output_is_retried(env: Env) -> None:
    env.provider.script("primary", unavailable())
    mark = env.mitm.log_mark()
    assert stream_text(env) == text_of("primary")
    assert upstreams(env) == ["primary", "primary"]
    assert [call.path for call in env.provider.calls] == [f"/v1/models/{MODEL}:streamGenerateContent"] * 2
    log = env.mitm.wait_for_log("switchyard.retry_answered", mark)
    assert "code=UNAVAILABLE" in log and "decision=retry" in log


def test_in_stream_unavailable_twice_falls_back_to_the_backup_with_its_own_key(env: Env) -> None:
    env.provider.script("primary", unavailable(), unavailable())
    assert stream_text(env) == text_of("backup")
    assert upstreams(env) == ["primary", "primary", "backup"]
    primary, backup = env.provider.calls[0], env.provider.calls[2]
    assert primary.headers["x-goog-api-key"] == CLIENT_KEY
    # the backup's own model call, the request's method, its own key, the client's alt=sse
    assert backup.path == "/v1beta/models/gemini-2.5-flash-lite:streamGenerateContent"
    assert backup.query == f"key={BACKUP_SECRET}&alt=sse"
    assert CLIENT_KEY not in json.dumps(backup.headers)
    assert backup.body == primary.body  # the model lives in the path: the body is the client's


def test_the_sdk_in_proxy_mode(env: Env) -> None:
    """As the README says: the SDK's HTTP client takes the proxy (here a plain-HTTP upstream)."""
    env.provider.script("primary", unavailable())
    options = types.HttpOptions(base_url=env.provider.url("primary", ""), client_args={"proxy": env.mitm.proxy_url})
    sdk = genai.Client(api_key=CLIENT_KEY, http_options=options)
    text = "".join(chunk.text or "" for chunk in sdk.models.generate_content_stream(model=MODEL, contents="hi"))
    assert text == text_of("primary")
    assert upstreams(env) == ["primary", "primary"]


def test_a_valid_stream_passes_through_byte_for_byte(env: Env) -> None:
    result = curl_stream(env)
    assert result.status == 200
    assert result.body == stream_bytes("primary")
    assert result.headers["x-switchyard-upstream"] == "primary"
    assert result.headers["x-switchyard-attempts"] == "1"
    assert upstreams(env) == ["primary"]


def test_the_client_gets_exactly_the_backups_stream(env: Env) -> None:
    env.provider.script("primary", unavailable(), unavailable())
    result = curl_stream(env, query=f"alt=sse&key={CLIENT_KEY}")
    assert result.body == stream_bytes("backup")
    assert b"UNAVAILABLE" not in result.body
    assert result.headers["x-switchyard-upstream"] == "backup"
    # the client's `key` query parameter reached its own origin only
    assert env.provider.calls[0].query == f"alt=sse&key={CLIENT_KEY}"
    assert env.provider.calls[2].query == f"key={BACKUP_SECRET}&alt=sse"


def test_http_429_with_retry_delay_is_honoured(env: Env) -> None:
    retry_info = [{"@type": "type.googleapis.com/google.rpc.RetryInfo", "retryDelay": "1.5s"}]
    body = gemini_wire.error_body(429, "RESOURCE_EXHAUSTED", "Resource has been exhausted (e.g. check quota).",
                                  retry_info)
    env.provider.script("primary", Reply.json(429, body))
    mark = env.mitm.log_mark()
    assert stream_text(env) == text_of("primary")
    assert upstreams(env) == ["primary", "primary"]
    log = env.mitm.wait_for_log("switchyard.retry_answered", mark)
    failed = next(line for line in log.splitlines() if "switchyard.attempt_failed" in line)
    assert "status=429 code=RESOURCE_EXHAUSTED" in failed
    assert "decision=retry delay_s=1.5 " in failed  # the body's RetryInfo, not the route's 1 ms backoff


def test_a_retry_delay_longer_than_max_backoff_moves_on_to_the_backup(env: Env) -> None:
    env.provider.script("primary", Reply.json(429, (FIXTURES / "gemini_http_429_per_minute.json").read_bytes()))
    mark = env.mitm.log_mark()
    assert stream_text(env) == text_of("backup")
    assert upstreams(env) == ["primary", "backup"]  # no 38 s wait, no second try of primary
    assert "decision=next_upstream" in env.mitm.wait_for_log("switchyard.fallback_answered", mark)


@pytest.mark.parametrize("fixture", ["gemini_http_429_per_day.json", "gemini_http_400_token_limit.json"])
def test_a_daily_quota_or_an_overlong_prompt_goes_to_the_next_upstream_only(env: Env, fixture: str) -> None:
    status = json.loads((FIXTURES / fixture).read_bytes())["error"]["code"]
    env.provider.script("primary", Reply.json(status, (FIXTURES / fixture).read_bytes()))
    assert stream_text(env) == text_of("backup")
    assert upstreams(env) == ["primary", "backup"]


def test_invalid_argument_is_returned_as_sent(env: Env) -> None:
    sent = (FIXTURES / "gemini_http_400_api_key_invalid.json").read_bytes()
    env.provider.script("primary", Reply.json(400, sent))
    with pytest.raises(errors.ClientError) as raised:
        stream_text(env)
    assert raised.value.code == 400 and raised.value.status == "INVALID_ARGUMENT"
    assert raised.value.message == "API key not valid. Please pass a valid API key."
    assert upstreams(env) == ["primary"]  # fatal: nothing else tried
    env.provider.reset()
    env.provider.script("primary", Reply.json(400, sent))
    result = curl_stream(env)
    assert (result.status, result.body) == (400, sent)
    assert result.headers["x-switchyard-upstream"] == "primary"


def test_a_key_an_error_echoes_is_never_logged(env: Env) -> None:
    """Google's 403 for a suspended key names the key (google/generative-ai-docs #356)."""
    message = f"Permission denied: Consumer 'api_key:{CLIENT_KEY}' has been suspended."
    env.provider.script("primary", Reply.json(403, gemini_wire.error_body(403, "PERMISSION_DENIED", message)))
    mark = env.mitm.log_mark()
    result = curl_stream(env, query=f"alt=sse&key={CLIENT_KEY}", key_header=False)
    assert result.status == 403 and CLIENT_KEY.encode() in result.body  # the client's own answer, as sent
    log = env.mitm.wait_for_log("decision=fatal", mark)
    assert "Consumer 'api_key:[redacted]' has been suspended." in log
    ours = [line for line in env.mitm.log_since(mark).splitlines() if "switchyard." in line]
    assert ours and all(CLIENT_KEY not in line for line in ours)


def test_a_blocked_prompt_is_returned_as_sent(env: Env) -> None:
    blocked = (FIXTURES / "gemini_prompt_blocked.sse").read_bytes()
    env.provider.script("primary", Reply.sse(blocked))
    result = curl_stream(env)
    assert (result.status, result.body) == (200, blocked)
    assert upstreams(env) == ["primary"]


def test_an_error_after_output_is_forwarded_and_never_replayed(env: Env) -> None:
    first = gemini_wire.chunk("Hello")
    error = gemini_wire.error_frame(503, "UNAVAILABLE", "This model is currently experiencing high demand.")
    env.provider.script("primary", Reply.sse(first, error))
    mark = env.mitm.log_mark()
    pieces: list[str] = []
    with pytest.raises(errors.ServerError) as raised:
        stream_text(env, pieces)
    assert pieces == ["Hello"]
    assert raised.value.code == 503
    assert upstreams(env) == ["primary"]
    log = env.mitm.wait_for_log("switchyard.failover_suppressed_after_semantic_output", mark)
    assert "api=google-gemini" in log and "code=UNAVAILABLE" in log
    env.provider.reset()
    env.provider.script("primary", Reply.sse(first, error))
    assert curl_stream(env).body == first + error
    assert upstreams(env) == ["primary"]


def test_a_cut_after_output_ends_with_geminis_own_error(env: Env) -> None:
    first = gemini_wire.chunk("Hello")
    env.provider.script("primary", Reply.sse(first, RESET))
    result = curl_stream(env)
    assert result.body.startswith(first)
    rest = result.body[len(first):]
    assert rest.startswith(b"data: ") and rest.endswith(b"\r\n\r\n")
    error = json.loads(rest[len(b"data: "):])["error"]
    assert (error["code"], error["status"]) == (503, "UNAVAILABLE")
    assert error["details"][0]["reason"] == "stream_cut"
    assert upstreams(env) == ["primary"]
    env.provider.reset()
    env.provider.script("primary", Reply.sse(first, RESET))
    pieces: list[str] = []
    with pytest.raises(errors.ServerError):
        stream_text(env, pieces)
    assert pieces == ["Hello"]


# --- whole answers, routes by model, faults ----------------------------------------


def test_generate_content_whole_answer_is_retried(env: Env) -> None:
    env.provider.script("primary", Reply.json(503, (FIXTURES / "gemini_http_503_overloaded.json").read_bytes()))
    sdk = client(env)
    answer = sdk.models.generate_content(model=MODEL, contents="say hello")
    assert answer.text == text_of("primary")
    assert upstreams(env) == ["primary", "primary"]
    assert [call.path for call in env.provider.calls] == [f"/v1/models/{MODEL}:generateContent"] * 2


def test_routes_match_the_model_in_the_path_and_rewrite_it_there(env: Env) -> None:
    pieces: list[str] = []
    sdk = client(env, "routed")
    for chunk in sdk.models.generate_content_stream(model="gemini-2.5-pro", contents="hi"):
        pieces.append(chunk.text or "")
    assert "".join(pieces) == text_of("routed")
    (call,) = env.provider.calls
    assert call.path == "/v1/models/gemini-2.5-flash:streamGenerateContent" and call.query == "alt=sse"
    assert "model" not in call.json()  # type: ignore[operator]
    env.provider.reset()
    other = sdk.models.generate_content(model="gemini-2.0-flash", contents="hi")
    assert other.text == text_of("routed")
    (call,) = env.provider.calls
    assert call.path == "/v1/models/gemini-2.0-flash:generateContent"  # no route: untouched
    assert "x-switchyard-upstream" not in {name.lower() for name in other.sdk_http_response.headers or {}}


def test_a_fault_on_purpose_speaks_gemini(env: Env) -> None:
    assert stream_text(env, prefix="faulty") == text_of("backup")
    assert upstreams(env) == ["faulty", "backup"]
    backup = env.provider.calls[1]
    # a base URL: the request's path follows it; the upstream's own auth header, not the client's key
    assert backup.path == f"/faulty/v1/models/{MODEL}:streamGenerateContent"
    assert backup.headers["x-goog-api-key"] == BACKUP_SECRET


def test_the_pre_answer_keepalive_is_blank_lines_that_geminis_sdks_skip(env: Env) -> None:
    """google-genai and Gemini's JS SDK read only `data:` lines and blank lines: an SSE
    comment would be a JSON error to one and stop the other's parser for good."""
    env.provider.script("keepalive", Reply.sse(0.7, *unavailable().pieces))
    result = curl_stream(env, prefix="keepalive")
    assert result.headers["x-switchyard-upstream"] == "pending"  # headers left before any upstream answered
    kept_alive, answer = result.body[:-len(stream_bytes("backup"))], result.body[-len(stream_bytes("backup")):]
    assert answer == stream_bytes("backup")
    assert kept_alive and set(kept_alive) <= set(b"\r\n")
    env.provider.reset()
    env.provider.script("keepalive", Reply.sse(0.7, *unavailable().pieces))
    assert stream_text(env, prefix="keepalive") == text_of("backup")


def test_a_stream_asked_without_alt_sse_is_a_json_array_held_whole(env: Env) -> None:
    """No keepalive (it would announce an event stream), and an error in the array,
    even after content, is retried: the client has seen nothing yet."""
    overloaded = [json.loads(gemini_wire.chunk("Hello")[len(b"data: "):]),
                  gemini_wire.error(503, "UNAVAILABLE", "The model is overloaded. Please try again later.")]
    env.provider.script("keepalive", Reply(200, [0.7, json.dumps(overloaded).encode()], content_type="application/json"))
    answer = json.dumps([gemini_wire.response(text_of("backup"))], indent=2).encode()
    env.provider.script("backup", Reply(200, [answer], content_type="application/json"))
    result = curl_stream(env, prefix="keepalive", query="")
    assert (result.status, result.body) == (200, answer)
    assert result.headers["content-type"].startswith("application/json")
    assert result.headers["x-switchyard-upstream"] == "backup"
    assert upstreams(env) == ["keepalive", "backup"]


# --- the real Gemini CLI ------------------------------------------------------------


def run_gemini_cli(env: Env, tmp_path: Path, prefix: str = "primary") -> subprocess.CompletedProcess[str]:
    """`gemini -p` with its own HOME, pointed at Switchyard (reverse mode)."""
    home = tmp_path / "home"
    (home / ".gemini").mkdir(parents=True)
    (home / ".gemini" / "settings.json").write_text(
        json.dumps({"security": {"auth": {"selectedType": "gemini-api-key"}}}))
    cli_env = {"PATH": "/usr/local/bin:/usr/bin:/bin", "HOME": str(home), "GEMINI_API_KEY": CLIENT_KEY,
               "GOOGLE_GEMINI_BASE_URL": f"{env.mitm.reverse_url}/{prefix}", "GEMINI_CLI_TRUST_WORKSPACE": "true"}
    return subprocess.run([str(agent_binary("gemini")), "-p", "say hello"], env=cli_env, cwd=home,
                          capture_output=True, text=True, timeout=120)


def cli_calls(env: Env) -> list[tuple[str, str]]:
    return [(call.upstream, call.path.rsplit(":", 1)[1]) for call in env.provider.calls]


def assert_cli_asked_twice(env: Env, mark: int) -> str:
    """The CLI sent two requests (its router's, then the stream) and no retry of its own
    (it retries an in-stream 503 itself): mitmdump prints each client flow once done."""
    log = env.mitm.wait_for_log(": POST http", mark, count=2)
    assert log.count(": POST http") == 2, log
    return log


def test_gemini_cli_in_stream_unavailable_is_retried(env: Env, tmp_path: Path) -> None:
    # its model router's :generateContent first (answered normally), then the stream
    env.provider.script("primary", NORMAL, unavailable())
    mark = env.mitm.log_mark()
    done = run_gemini_cli(env, tmp_path)
    assert done.returncode == 0, done.stderr[-3000:]
    assert done.stdout.strip() == text_of("primary")
    assert "switchyard.retry_answered route=gemini" in assert_cli_asked_twice(env, mark)
    assert cli_calls(env) == [("primary", "generateContent"), ("primary", "streamGenerateContent"),
                              ("primary", "streamGenerateContent")]


def test_gemini_cli_falls_back_to_the_backup(env: Env, tmp_path: Path) -> None:
    env.provider.script("primary", NORMAL, unavailable(), unavailable())
    mark = env.mitm.log_mark()
    done = run_gemini_cli(env, tmp_path)
    assert done.returncode == 0, done.stderr[-3000:]
    assert done.stdout.strip() == text_of("backup")
    assert "switchyard.fallback_answered route=gemini upstream=backup" in assert_cli_asked_twice(env, mark)
    assert cli_calls(env) == [("primary", "generateContent"), ("primary", "streamGenerateContent"),
                              ("primary", "streamGenerateContent"), ("backup", "streamGenerateContent")]
    assert CLIENT_KEY not in json.dumps(env.provider.calls[-1].headers)


def test_gemini_cli_gets_invalid_argument_as_sent(env: Env, tmp_path: Path) -> None:
    sent = (FIXTURES / "gemini_http_400_api_key_invalid.json").read_bytes()
    env.provider.script("primary", NORMAL, Reply.json(400, sent))
    mark = env.mitm.log_mark()
    done = run_gemini_cli(env, tmp_path)
    assert done.returncode != 0
    assert "decision=fatal" in assert_cli_asked_twice(env, mark)
    assert "API key not valid. Please pass a valid API key." in done.stdout + done.stderr
    assert cli_calls(env) == [("primary", "generateContent"), ("primary", "streamGenerateContent")]


def test_gemini_cli_behind_the_pre_answer_keepalive(env: Env, tmp_path: Path) -> None:
    env.provider.script("keepalive", NORMAL, Reply.sse(0.7, *unavailable().pieces))
    done = run_gemini_cli(env, tmp_path, prefix="keepalive")
    assert done.returncode == 0, done.stderr[-3000:]
    assert done.stdout.strip() == text_of("backup")
    assert cli_calls(env) == [("keepalive", "generateContent"), ("keepalive", "streamGenerateContent"),
                              ("backup", "streamGenerateContent")]


def test_gemini_cli_gets_its_answer_after_a_429_retry_delay(env: Env, tmp_path: Path) -> None:
    retry_info = [{"@type": "type.googleapis.com/google.rpc.RetryInfo", "retryDelay": "1.5s"}]
    body = gemini_wire.error_body(429, "RESOURCE_EXHAUSTED", "Resource has been exhausted (e.g. check quota).",
                                  retry_info)
    env.provider.script("primary", NORMAL, Reply.json(429, body))
    mark = env.mitm.log_mark()
    done = run_gemini_cli(env, tmp_path)
    assert done.returncode == 0, done.stderr[-3000:]
    assert done.stdout.strip() == text_of("primary")
    log = assert_cli_asked_twice(env, mark)
    assert "status=429 code=RESOURCE_EXHAUSTED event=http decision=retry delay_s=1.5 " in log


def test_gemini_cli_error_after_output_is_forwarded_not_replayed(env: Env, tmp_path: Path) -> None:
    """Gemini CLI retries the in-stream 503 itself; Switchyard sends each of its
    requests upstream exactly once."""
    error = gemini_wire.error_frame(503, "UNAVAILABLE", "This model is currently experiencing high demand.")
    env.provider.script("primary", NORMAL, Reply.sse(gemini_wire.chunk("Hello"), error))
    mark = env.mitm.log_mark()
    done = run_gemini_cli(env, tmp_path)
    log = env.mitm.wait_for_log("switchyard.failover_suppressed_after_semantic_output route=gemini", mark)
    streams = [c for c in cli_calls(env) if c[1] == "streamGenerateContent"]
    client_streams = env.mitm.wait_for_log(": POST http", mark, count=1 + len(streams)).count(": POST http") - 1
    assert len(streams) == client_streams == 2, (streams, log)
    assert done.returncode == 0, done.stderr[-3000:]
    # its own retry's answer (after the "Hello" it had already printed)
    assert done.stdout.strip().endswith(text_of("primary"))
