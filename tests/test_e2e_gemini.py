"""Google Gemini through a real mitmdump, a loopback upstream that speaks Gemini's API,
Google's google-genai SDK and curl (routes and helpers: tests/support/gemini_env.py).

Each test scripts what the upstreams answer and asserts what a user would
notice: the bytes or text the client got, which upstreams were asked, how, and
with which key, and what was logged.  Wire shapes are Gemini's own, as
recorded or documented, and the fixtures beside the classifier tests.
"""

from __future__ import annotations

import json

import pytest
from google import genai
from google.genai import errors, types

from tests.conftest import BACKUP_SECRET, Env
from tests.support import gemini_wire
from tests.support.fake_provider import RESET, Reply
from tests.support.gemini_env import (  # noqa: F401 -- env and gemini_mitm are fixtures
    CLIENT_KEY,
    FIXTURES,
    MODEL,
    curl_stream,
    env,
    gemini_mitm,
    stream_bytes,
    text_of,
    unavailable,
    upstreams,
)


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
    """The SDK's HTTP client takes the proxy (here a plain-HTTP upstream)."""
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


@pytest.mark.parametrize("delay, then", [
    ({"seconds": int("9" * 400)}, "backup"),  # float() of it overflowed: a 502 internal error, the backup never asked
    ("1e999s", "primary"), ("-5s", "primary"), ({"seconds": "NaN"}, "primary"), ({"seconds": -30}, "primary"),
], ids=["400-digits", "exponent", "negative", "nan-string", "negative-seconds"])
def test_a_retry_delay_that_is_no_delay_is_clamped_or_ignored(env: Env, delay: object, then: str) -> None:
    """Huge: longer than max_backoff_ms, so the backup is asked; anything that is no delay
    is ignored, and the route's own backoff retries."""
    retry_info = [{"@type": "type.googleapis.com/google.rpc.RetryInfo", "retryDelay": delay}]
    body = gemini_wire.error_body(429, "RESOURCE_EXHAUSTED", "Resource has been exhausted.", retry_info)
    env.provider.script("primary", Reply.json(429, body))
    mark = env.mitm.log_mark()
    assert stream_text(env) == text_of(then)
    assert upstreams(env) == ["primary", then]
    assert "internal_error" not in env.mitm.log_since(mark)


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


def test_a_percent_encoded_model_takes_its_route_as_google_reads_it(env: Env) -> None:
    """`gemini%2D2.5-pro` is gemini-2.5-pro to Google, so its route takes it (it used to
    miss the route and reach the pro model unrouted); an encoded colon (`%3A`) starts no
    method there, and the path reaches the upstream as the client wrote it."""
    body = json.dumps({"contents": [{"role": "user", "parts": [{"text": "hi"}]}]}).encode()
    got = env.curl(f"{env.mitm.reverse_url}/routed/v1beta/models/gemini%2D2.5-pro:streamGenerateContent?alt=sse",
                   body, headers={"x-goog-api-key": CLIENT_KEY}, via_proxy=False)
    assert (got.status, got.headers.get("x-switchyard-upstream"), got.body) == (200, "routed", stream_bytes("routed"))
    (call,) = env.provider.calls
    assert call.path == "/v1beta/models/gemini-2.5-flash:streamGenerateContent" and call.query == "alt=sse"
    env.provider.reset()
    colon = "/v1beta/models/gemini-2.5-flash%3AstreamGenerateContent"
    got = env.curl(f"{env.mitm.reverse_url}/primary{colon}?alt=sse", body, headers={"x-goog-api-key": CLIENT_KEY},
                   via_proxy=False)
    (call,) = env.provider.calls
    assert call.raw_path == f"/primary{colon}?alt=sse"  # not re-written, not decoded
    assert got.headers.get("x-switchyard-upstream") == "primary"


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
