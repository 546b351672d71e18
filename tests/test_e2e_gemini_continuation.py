"""Finishing a cut Gemini answer, end to end: a real mitmdump, loopback upstreams that
speak Gemini's API and cut mid-answer, and Google's google-genai SDK streaming
(`generate_content_stream`) or curl.  The text the client assembles is the whole
answer, once; each upstream got exactly the body it should; the log says what was
continued and how."""

from __future__ import annotations

import json
from collections.abc import Iterator
from pathlib import Path

import pytest
from google import genai
from google.genai import types

from switchyard_core.apis import APIS
from switchyard_core.sse import FrameSplitter
from tests.conftest import BACKUP_SECRET, BODY_MARKER, Env
from tests.support import gemini_wire
from tests.support.fake_provider import NORMAL, RESET, FakeProvider, Reply
from tests.support.mitm import Mitmdump, mitmdump_on
from tests.test_e2e_gemini_cli import run_gemini_cli

CLIENT_KEY = "AIzaSy-client-GEMINI-c0ffee"
MODEL = "gemini-2.5-flash"
RULES = """\
version: 1
defaults:
  retries: 0
  backoff_ms: 1
  headers_timeout_s: 5
  idle_timeout_s: 0.5
  pre_answer_keepalive_s: 0
routes:
  - name: gc
    match: {{path: "/gc-primary/v1*/models/*"}}
    continue_after_cut: [prefill, regenerate]
    upstreams:
      - {{name: gc-primary, url: original}}
      - name: gc-backup
        url: "http://127.0.0.1:{p2}/gc-backup/v1beta/models/gemini-2.5-flash-lite:generateContent"
        prefill: true
        auth: {{header: x-goog-api-key, value: "${{SWY_TEST_GEMINI_KEY}}"}}
"""
FULL = "The quick brown fox jumps over the lazy dog, twice."
WORDS = gemini_wire.words(FULL)
SENT = "".join(WORDS[:3])  # what the client has when the cut comes
REST = FULL[len(SENT):]
CUT_ERROR = APIS["google-gemini"].error_event("switchyard: upstream connection broke after output", "stream_cut")
MODEL_TURN_REFUSED = Reply.json(400, gemini_wire.error_body(400, "INVALID_ARGUMENT",
                                                            "Requests ending with a model turn are not supported."))


@pytest.fixture(scope="module")
def gemini_continuing(provider: FakeProvider, tmp_path_factory: pytest.TempPathFactory) -> Iterator[Mitmdump]:
    with mitmdump_on(tmp_path_factory.mktemp("gemini-continuation"), RULES.format(p2=provider.ports[1]),
                     reverse_target=f"http://127.0.0.1:{provider.ports[0]}",
                     env={"SWY_TEST_GEMINI_KEY": BACKUP_SECRET}) as dump:
        yield dump


@pytest.fixture
def genv(provider: FakeProvider, gemini_continuing: Mitmdump) -> Iterator[Env]:
    provider.reset()
    yield Env(provider, gemini_continuing, Path(gemini_continuing.log_path).parent / "rules.yaml")
    provider.reset()


def cut_after(words: int, then: float | str) -> Reply:
    """The original answer: `words` chunks, then a reset or a stall of `then` seconds."""
    frames = gemini_wire.stream(FULL, "orig")
    return Reply.sse(*frames[:words], then, *frames[words:])


def sdk_stream(genv: Env) -> tuple[str, list[types.GenerateContentResponse]]:
    """The text google-genai assembled from `generate_content_stream`, and its chunks."""
    client = genai.Client(api_key=CLIENT_KEY,
                          http_options=types.HttpOptions(base_url=f"{genv.mitm.reverse_url}/gc-primary"))
    chunks = list(client.models.generate_content_stream(
        model=MODEL, contents=f"say it {BODY_MARKER}", config=types.GenerateContentConfig(temperature=0)))
    return "".join(chunk.text or "" for chunk in chunks), chunks


def curl(genv: Env) -> bytes:
    body = json.dumps({"contents": [{"role": "user", "parts": [{"text": f"say it {BODY_MARKER}"}]}]}).encode()
    result = genv.curl(f"{genv.mitm.reverse_url}/gc-primary/v1beta/models/{MODEL}:streamGenerateContent?alt=sse",
                       body, headers={"x-goog-api-key": CLIENT_KEY}, via_proxy=False)
    assert result.status == 200
    return result.body


def data_frames(body: bytes) -> list[dict[str, object]]:
    """Every frame's JSON, as Google's SDKs read them: only `data:` lines (an SSE comment
    would fail the test, as it fails google-genai)."""
    splitter = FrameSplitter()
    frames = [frame.event for frame in splitter.feed(body)]
    assert not splitter.pending
    assert not any(event.comment_only for event in frames)
    return [json.loads(event.data) for event in frames if event.data is not None]


def upstreams(genv: Env) -> list[str]:
    return [call.upstream for call in genv.provider.calls]


@pytest.mark.parametrize("then", [RESET, 2.0], ids=["cut", "stall"])
def test_a_cut_gemini_answer_is_finished_by_the_prefill_backup(genv: Env, then: float | str) -> None:
    genv.provider.script("gc-primary", cut_after(3, then))
    genv.provider.script("gc-backup", Reply.sse(*gemini_wire.stream(REST, "cont", "gemini-2.5-pro")))
    mark = genv.mitm.log_mark()
    text, chunks = sdk_stream(genv)
    assert text == FULL
    assert {chunk.response_id for chunk in chunks} == {"orig"}
    assert {chunk.model_version for chunk in chunks} == {gemini_wire.MODEL_VERSION}
    assert [c.candidates[0].finish_reason for c in chunks if c.candidates[0].finish_reason] == ["STOP"]
    assert upstreams(genv) == ["gc-primary", "gc-backup"]
    primary, backup = genv.provider.calls
    original = primary.json()
    assert isinstance(original, dict)
    assert backup.json() == {**original, "contents": [*original["contents"],
                                                      {"role": "model", "parts": [{"text": SENT}]}]}
    # its own model call with the request's method, as any attempt at it would be
    assert backup.path == "/v1beta/models/gemini-2.5-flash-lite:streamGenerateContent" and backup.query == "alt=sse"
    assert backup.headers["x-goog-api-key"] == BACKUP_SECRET
    assert CLIENT_KEY not in json.dumps(backup.headers)
    log = genv.mitm.wait_for_log("switchyard.continued_after_cut", mark)
    line = next(line for line in log.splitlines() if "switchyard.continued_after_cut" in line)
    assert "route=gc upstream=gc-backup attempt=2 strategy=prefill" in line and f"chars_sent={len(SENT)}" in line
    assert "stream_cut_after_output" not in log
    assert CLIENT_KEY not in log and BACKUP_SECRET not in log and BODY_MARKER not in log and SENT not in log


def test_a_backup_that_refuses_a_model_turn_leaves_it_to_regenerate(genv: Env) -> None:
    genv.provider.script("gc-primary", cut_after(3, RESET), Reply.sse(*gemini_wire.stream(FULL, "again")))
    genv.provider.script("gc-backup", MODEL_TURN_REFUSED)
    mark = genv.mitm.log_mark()
    text, chunks = sdk_stream(genv)
    assert text == FULL
    assert {chunk.response_id for chunk in chunks} == {"orig"}
    assert upstreams(genv) == ["gc-primary", "gc-backup", "gc-primary"]
    assert genv.provider.calls[2].body == genv.provider.calls[0].body  # the original request again
    log = genv.mitm.wait_for_log("switchyard.continued_after_cut", mark)
    failed = next(line for line in log.splitlines() if "switchyard.continuation_failed" in line)
    assert "upstream=gc-backup" in failed and "strategy=prefill" in failed and "status=400" in failed
    assert "code=INVALID_ARGUMENT" in failed
    continued = log.split("switchyard.continued_after_cut", 1)[1].splitlines()[0]
    assert "upstream=gc-primary attempt=3 strategy=regenerate" in continued


def test_the_client_gets_gemini_frames_only_with_one_end(genv: Env) -> None:
    genv.provider.script("gc-primary", cut_after(3, RESET), Reply.sse(*gemini_wire.stream(FULL, "again")))
    genv.provider.script("gc-backup", MODEL_TURN_REFUSED)
    body = curl(genv)
    assert body.startswith(b"".join(gemini_wire.stream(FULL, "orig")[:3]))
    got = data_frames(body)
    assert {frame["responseId"] for frame in got} == {"orig"}
    candidates = [frame["candidates"][0] for frame in got]  # type: ignore[index]
    assert "".join(p["text"] for c in candidates for p in c["content"]["parts"]) == FULL
    assert [c.get("finishReason") for c in candidates].count("STOP") == 1 and candidates[-1]["finishReason"] == "STOP"
    assert got[-1]["usageMetadata"] == gemini_wire.usage(len(WORDS))  # the regenerated answer's own


def test_a_regenerated_answer_that_diverges_ends_with_the_original_cut(genv: Env) -> None:
    other = "The quick red fox sleeps."
    genv.provider.script("gc-primary", cut_after(3, RESET), Reply.sse(*gemini_wire.stream(other, "again")))
    genv.provider.script("gc-backup", MODEL_TURN_REFUSED, Reply.sse(*gemini_wire.stream(other, "again")))
    mark = genv.mitm.log_mark()
    body = curl(genv)
    assert body == b"".join(gemini_wire.stream(FULL, "orig")[:3]) + CUT_ERROR
    assert upstreams(genv) == ["gc-primary", "gc-backup", "gc-primary", "gc-backup"]
    log = genv.mitm.wait_for_log("switchyard.stream_cut_after_output", mark)
    assert log.count("switchyard.continuation_failed") == 3
    assert f"matched {len('The quick ')} of {len(SENT)} characters" in log
    assert "continued_after_cut" not in log


THOUGHT = gemini_wire.frame({"candidates": [{"content": {"parts": [{"text": "Planning.", "thought": True}],
                                                         "role": "model"}, "index": 0}], "responseId": "orig"})
CALL = gemini_wire.frame({"candidates": [{"content": {"parts": [{"functionCall": {"name": "get_weather",
                                                                                  "args": {"city": "Paris"}}}],
                                                      "role": "model"}, "index": 0}], "responseId": "orig"})


@pytest.mark.parametrize("sent,reason", [
    ([THOUGHT], "thinking (a thought part)"),
    ([THOUGHT, gemini_wire.chunk("The", "orig")], "thinking (a thought part)"),
    ([gemini_wire.chunk("The", "orig"), CALL], "a function call"),
], ids=["inside-thought", "after-thought", "function-call"])
def test_a_cut_in_or_after_thinking_or_a_function_call_is_not_continued(genv: Env, sent: list[bytes],
                                                                        reason: str) -> None:
    genv.provider.script("gc-primary", Reply.sse(*sent, RESET))
    mark = genv.mitm.log_mark()
    assert curl(genv) == b"".join(sent) + CUT_ERROR
    assert upstreams(genv) == ["gc-primary"]
    log = genv.mitm.wait_for_log("switchyard.stream_cut_after_output", mark)
    line = next(line for line in log.splitlines() if "switchyard.not_continued" in line)
    assert "route=gc upstream=gc-primary" in line and reason in line


# --- the real Gemini CLI ---------------------------------------------------------------


def test_gemini_cli_prints_the_whole_answer_once_after_a_cut(genv: Env, tmp_path: Path) -> None:
    """`gemini -p` asks its model router first (answered normally), then streams the
    answer, which is cut after three words and finished by the prefill backup: the CLI
    prints the answer once, and sends no retry of its own (it retries an error)."""
    genv.provider.script("gc-primary", NORMAL, cut_after(3, RESET))
    genv.provider.script("gc-backup", Reply.sse(*gemini_wire.stream(REST, "cont")))
    mark = genv.mitm.log_mark()
    done = run_gemini_cli(genv, tmp_path, prefix="gc-primary")
    assert done.returncode == 0, done.stderr[-3000:]
    assert done.stdout.strip() == FULL
    assert [(c.upstream, c.path.rsplit(":", 1)[1]) for c in genv.provider.calls] == [
        ("gc-primary", "generateContent"), ("gc-primary", "streamGenerateContent"),
        ("gc-backup", "streamGenerateContent")]
    original, backup = genv.provider.calls[1].json(), genv.provider.calls[2].json()
    assert isinstance(original, dict) and isinstance(backup, dict)
    assert backup == {**original, "contents": [*original["contents"], {"role": "model", "parts": [{"text": SENT}]}]}
    log = genv.mitm.wait_for_log(": POST http", mark, count=2)
    assert log.count(": POST http") == 2, log
    assert "switchyard.continued_after_cut route=gc upstream=gc-backup attempt=2 strategy=prefill" in log
