"""Continuation after a cut, end to end: a real mitmdump, the fake provider's
loopback upstreams, and the SDKs consuming the stream.  The text a client
assembles is the whole answer, exactly once, and every frame it got parses."""

from __future__ import annotations

import json
import time
from collections.abc import Iterator
from pathlib import Path

import anthropic
import openai
import pytest

from switchyard_core.apis import APIS
from switchyard_core.sse import FrameSplitter
from tests.conftest import BODY_MARKER, CLIENT_SECRET, Env
from tests.support import wire
from tests.support.fake_provider import RESET, FakeProvider, Reply
from tests.support.mitm import Mitmdump, start_mitmdump

RULES = """\
version: 1
defaults:
  retries: 0
  backoff_ms: 1
  headers_timeout_s: 5
  idle_timeout_s: 0.5
  pre_answer_keepalive_s: 0
routes:
{routes}
"""

ROUTE = """\
  - name: {name}
    match: {{path: /{prefix}/v1/{path}}}
{extra}    upstreams:
      - {{name: {prefix}, url: original}}
      - name: c-backup
        url: http://127.0.0.1:{port}/c-backup/v1/{path}
        prefill: true
{prefill}"""

CHAT_PREFILL = """\
        prefill_body: {continue_final_message: true, add_generation_prompt: false}
        prefill_message: {prefix: true}
"""

PATHS = {"openai-chat": "chat/completions", "openai-responses": "responses", "anthropic-messages": "messages"}
FULL = "The quick brown fox jumps over the lazy dog, twice."
WORDS = wire.chat_words(FULL)
SENT = "".join(WORDS[:3])  # what the client has when the cut comes
REST = FULL[len(SENT):]
SMALL = 64 * 1024  # the staging_limit of the route `c-small`
LIFECYCLE = {"openai-chat": 1, "openai-responses": 4, "anthropic-messages": 3}  # frames before the first text


@pytest.fixture(scope="module")
def continuing(provider: FakeProvider, tmp_path_factory: pytest.TempPathFactory) -> Iterator[Mitmdump]:
    workdir = tmp_path_factory.mktemp("continuation")
    port = provider.ports[1]
    routes = []
    for api, path in PATHS.items():
        routes.append(ROUTE.format(name=f"c-{api}", prefix="c-primary", path=path, port=port,
                                   extra="    continue_after_cut: [prefill, regenerate]\n",
                                   prefill=CHAT_PREFILL if api == "openai-chat" else ""))
        routes.append(ROUTE.format(name=f"off-{api}", prefix="c-off", path=path, port=port, extra="", prefill=""))
    routes.append(ROUTE.format(name="small-openai-chat", prefix="c-small", path=PATHS["openai-chat"], port=port,
                               extra=f"    continue_after_cut: [prefill, regenerate]\n    staging_limit: {SMALL}\n",
                               prefill=""))
    rules = workdir / "rules.yaml"
    rules.write_text(RULES.format(routes="".join(routes)))
    dump = start_mitmdump(rules, workdir / "mitmdump.log")
    yield dump
    dump.stop()


@pytest.fixture
def cenv(env: Env, continuing: Mitmdump) -> Env:
    return Env(env.provider, continuing, Path(continuing.log_path).parent / "rules.yaml")


# --- the upstreams' streams, in each API's shape -------------------------------------


def stream(api: str, text: str, ident: str) -> list[bytes]:
    if api == "openai-chat":
        return wire.chat_stream(text, cid=ident)
    if api == "openai-responses":
        return [f.replace(b'"msg_1"', f'"{ident}_item"'.encode()) for f in wire.responses_stream(text, rid=ident)]
    return wire.anthropic_stream(text, mid=ident)


def cut_after(api: str, content_frames: int, then: float | str) -> Reply:
    """The original answer: its lifecycle and `content_frames` text frames, then a
    reset or a stall of `then` seconds (the rest never arrives in time)."""
    frames = stream(api, FULL, "orig")
    head = frames[:LIFECYCLE[api] + content_frames]
    return Reply.sse(*head, then, *frames[LIFECYCLE[api] + content_frames:])


def continuation(api: str) -> Reply:
    """What a prefill-capable upstream answers: only the rest of the text."""
    return Reply.sse(*stream(api, REST, "cont"))


def regenerated(api: str, text: str = FULL) -> Reply:
    return Reply.sse(*stream(api, text, "again"))


# --- the clients ---------------------------------------------------------------------


def sdk_text(cenv: Env, api: str, prefix: str = "c-primary") -> str:
    """The text the API's SDK assembled (and, where the SDK keeps one, its final answer's)."""
    proxy = cenv.mitm.proxy_url
    prompt = f"say it {BODY_MARKER}"
    if api == "anthropic-messages":
        client = anthropic.Anthropic(api_key=CLIENT_SECRET, base_url=cenv.provider.url(prefix, ""), max_retries=0,
                                     http_client=anthropic.DefaultHttpxClient(proxy=proxy, trust_env=False))
        with client.messages.stream(model="claude-sonnet-4-5", max_tokens=64,
                                    messages=[{"role": "user", "content": prompt}]) as messages:
            streamed = "".join(messages.text_stream)
            final = messages.get_final_message()
        assert final.id == "orig" and final.stop_reason == "end_turn"
        assert [block.type for block in final.content] == ["text"]
        assert final.content[0].text == streamed  # type: ignore[union-attr]
        return streamed
    oai = openai.OpenAI(api_key=CLIENT_SECRET, base_url=cenv.provider.url(prefix, "/v1"), max_retries=0,
                        http_client=openai.DefaultHttpxClient(proxy=proxy, trust_env=False))
    if api == "openai-responses":
        with oai.responses.stream(model="gpt-4o", input=prompt) as events:
            streamed = "".join(e.delta for e in events if e.type == "response.output_text.delta")
            response = events.get_final_response()
        assert response.id == "orig" and response.status == "completed"
        assert response.output_text == streamed
        return streamed
    chunks = list(oai.chat.completions.create(model="gpt-4o", messages=[{"role": "user", "content": prompt}],
                                              stream=True))
    assert {chunk.id for chunk in chunks} == {"orig"}
    assert [c.choices[0].finish_reason for c in chunks if c.choices][-1] == "stop"
    return "".join(c.choices[0].delta.content or "" for c in chunks if c.choices)


def request_body(api: str) -> bytes:
    body: dict[str, object] = {"model": "m", "stream": True}
    if api == "openai-responses":
        body["input"] = f"say it {BODY_MARKER}"
    else:
        body["messages"] = [{"role": "user", "content": f"say it {BODY_MARKER}"}]
        if api == "anthropic-messages":
            body["max_tokens"] = 64
    return json.dumps(body).encode()


def curl(cenv: Env, api: str, prefix: str = "c-primary") -> bytes:
    result = cenv.curl(cenv.provider.url(prefix, f"/v1/{PATHS[api]}"), request_body(api))
    assert result.status == 200
    return result.body


def events(body: bytes) -> list[object]:
    """Every frame's data, parsed (a frame that does not parse fails the test)."""
    splitter = FrameSplitter()
    frames = splitter.feed(body)
    assert not splitter.pending
    out: list[object] = []
    for frame in frames:
        event = frame.event
        if event.comment_only:
            continue
        out.append(event.data if event.data == "[DONE]" else json.loads(event.data or ""))
    return out


def upstreams(cenv: Env) -> list[str]:
    return [call.upstream for call in cenv.provider.calls]


def last_assistant(call_body: object) -> object:
    assert isinstance(call_body, dict)
    return call_body["messages"][-1]


# --- prefill --------------------------------------------------------------------------


@pytest.mark.parametrize("then", [RESET, 2.0], ids=["cut", "stall"])
@pytest.mark.parametrize("api", list(PATHS))
def test_a_cut_answer_is_finished_by_the_prefill_backup(cenv: Env, api: str, then: float | str) -> None:
    cenv.provider.script("c-primary", cut_after(api, 3, then))
    cenv.provider.script("c-backup", continuation(api))
    mark = cenv.mitm.log_mark()
    assert sdk_text(cenv, api) == FULL
    assert upstreams(cenv) == ["c-primary", "c-backup"]
    asked = cenv.provider.calls_to("c-backup")[0].json()
    assert isinstance(asked, dict)
    if api == "openai-responses":
        original = cenv.provider.calls_to("c-primary")[0].json()
        assert isinstance(original, dict) and isinstance(original["input"], str)
        assert asked == {**original, "input": [
            {"role": "user", "content": original["input"]},
            {"type": "message", "role": "assistant", "content": [{"type": "output_text", "text": SENT}]}]}
    elif api == "openai-chat":
        assert last_assistant(asked) == {"role": "assistant", "content": SENT, "prefix": True}
        assert asked["continue_final_message"] is True and asked["add_generation_prompt"] is False  # type: ignore[index]
    else:
        assert last_assistant(asked) == {"role": "assistant", "content": SENT}
    if api != "openai-responses":
        assert asked["messages"][:-1] == cenv.provider.calls_to("c-primary")[0].json()["messages"]  # type: ignore[index]
    log = cenv.mitm.wait_for_log("switchyard.continued_after_cut", mark)
    line = next(line for line in log.splitlines() if "switchyard.continued_after_cut" in line)
    assert f"route=c-{api}" in line and "upstream=c-backup" in line and "strategy=prefill" in line
    assert f"chars_sent={len(SENT)}" in line and "first_char_after_s=" in line
    assert "stream_cut_after_output" not in cenv.mitm.log_since(mark)


def test_the_chat_client_gets_one_stream_with_the_original_ids_and_one_end(cenv: Env) -> None:
    cenv.provider.script("c-primary", cut_after("openai-chat", 3, RESET))
    cenv.provider.script("c-backup", continuation("openai-chat"))
    got = events(curl(cenv, "openai-chat"))
    assert got[-1] == "[DONE]" and got.count("[DONE]") == 1
    chunks = [e for e in got if isinstance(e, dict)]
    assert {c["id"] for c in chunks} == {"orig"}
    assert sum(1 for c in chunks for ch in c["choices"] if ch["delta"].get("role")) == 1
    assert [ch["finish_reason"] for c in chunks for ch in c["choices"] if ch["finish_reason"]] == ["stop"]
    assert sum(1 for c in chunks if c.get("usage")) == 1
    assert "".join(ch["delta"].get("content") or "" for c in chunks for ch in c["choices"]) == FULL


def test_the_anthropic_client_gets_one_message_start_and_one_end(cenv: Env) -> None:
    cenv.provider.script("c-primary", cut_after("anthropic-messages", 3, RESET))
    cenv.provider.script("c-backup", continuation("anthropic-messages"))
    got = [e for e in events(curl(cenv, "anthropic-messages")) if isinstance(e, dict)]
    kinds = [e["type"] for e in got]
    for once in ("message_start", "content_block_start", "content_block_stop", "message_delta", "message_stop"):
        assert kinds.count(once) == 1, kinds
    assert kinds[-2:] == ["message_delta", "message_stop"]
    assert {e["index"] for e in got if "index" in e} == {0}


# --- regenerate ----------------------------------------------------------------------


PREFILL_REJECTED = Reply.json(400, {"error": {"type": "invalid_request_error", "code": None, "param": "input",
                                             "message": "This model does not continue an assistant message."}})


@pytest.mark.parametrize("then", [RESET, 2.0], ids=["cut", "stall"])
def test_a_cut_responses_answer_is_regenerated_and_only_the_rest_forwarded(cenv: Env, then: float | str) -> None:
    cenv.provider.script("c-primary", cut_after("openai-responses", 3, then), regenerated("openai-responses"))
    cenv.provider.script("c-backup", PREFILL_REJECTED)
    mark = cenv.mitm.log_mark()
    assert sdk_text(cenv, "openai-responses") == FULL
    assert upstreams(cenv) == ["c-primary", "c-backup", "c-primary"]
    assert cenv.provider.calls[2].body == cenv.provider.calls[0].body
    log = cenv.mitm.wait_for_log("switchyard.continued_after_cut", mark)
    assert "strategy=regenerate" in log


def test_the_responses_client_gets_one_response_with_sequence_numbers_in_order(cenv: Env) -> None:
    cenv.provider.script("c-primary", cut_after("openai-responses", 3, RESET), regenerated("openai-responses"))
    cenv.provider.script("c-backup", PREFILL_REJECTED)
    got = [e for e in events(curl(cenv, "openai-responses")) if isinstance(e, dict)]
    kinds = [e["type"] for e in got]
    for once in ("response.created", "response.output_item.added", "response.content_part.added",
                 "response.output_item.done", "response.completed"):
        assert kinds.count(once) == 1, kinds
    assert [e["sequence_number"] for e in got] == list(range(len(got)))
    assert {e["item_id"] for e in got if "item_id" in e} == {"orig_item"}
    assert got[-1]["response"]["id"] == "orig"


@pytest.mark.parametrize("api", ["openai-chat", "anthropic-messages"])
def test_a_backup_that_rejects_prefill_leaves_it_to_regenerate(cenv: Env, api: str) -> None:
    rejected = Reply.json(400, {"type": "error", "error": {"type": "invalid_request_error",
                                                           "message": "This model does not support assistant message prefill."}})
    cenv.provider.script("c-primary", cut_after(api, 3, RESET), regenerated(api))
    cenv.provider.script("c-backup", rejected)
    mark = cenv.mitm.log_mark()
    assert sdk_text(cenv, api) == FULL
    assert upstreams(cenv) == ["c-primary", "c-backup", "c-primary"]
    log = cenv.mitm.wait_for_log("switchyard.continued_after_cut", mark)
    assert "switchyard.continuation_failed" in log and "status=400" in log
    assert "strategy=regenerate" in log.split("switchyard.continued_after_cut", 1)[1].splitlines()[0]


@pytest.mark.parametrize("api", ["openai-chat", "anthropic-messages"])
def test_a_regenerated_answer_that_diverges_ends_with_the_original_cut_not_the_400(cenv: Env, api: str) -> None:
    rejected = Reply.json(400, {"type": "error", "error": {"type": "invalid_request_error",
                                                           "message": "prefill is not supported"}})
    other = "The quick red fox sleeps."
    cenv.provider.script("c-primary", cut_after(api, 3, RESET), regenerated(api, other))
    cenv.provider.script("c-backup", rejected, regenerated(api, other))
    mark = cenv.mitm.log_mark()
    body = curl(cenv, api)
    sent = b"".join(stream(api, FULL, "orig")[:LIFECYCLE[api] + 3])
    original_cut = APIS[api].error_event("switchyard: upstream connection broke after output", "stream_cut")
    assert body == sent + original_cut  # nothing of the tries, only the original cut
    assert upstreams(cenv) == ["c-primary", "c-backup", "c-primary", "c-backup"]
    log = cenv.mitm.wait_for_log("switchyard.stream_cut_after_output", mark)
    assert log.count("switchyard.continuation_failed") == 3
    assert f"matched {len("The quick ")} of {len(SENT)} characters" in log
    assert "continued_after_cut" not in log


# --- what never continues ------------------------------------------------------------


TOOL_CALLS = {
    "openai-chat": [
        wire.CHAT_ROLE,
        wire.chat_chunk({"tool_calls": [{"index": 0, "id": "call_1", "type": "function",
                                         "function": {"name": "get_weather", "arguments": ""}}]}, cid="orig"),
        wire.chat_chunk({"tool_calls": [{"index": 0, "function": {"arguments": "{\"city\": \"Par"}}]}, cid="orig"),
    ],
    "openai-responses": [
        wire.event("response.created", {"type": "response.created", "sequence_number": 0,
                                        "response": {"id": "orig", "object": "response", "status": "in_progress",
                                                     "output": []}}),
        wire.event("response.output_item.added", {"type": "response.output_item.added", "sequence_number": 1,
                                                  "output_index": 0,
                                                  "item": {"id": "fc_1", "type": "function_call", "status": "in_progress",
                                                           "call_id": "call_1", "name": "get_weather",
                                                           "arguments": ""}}),
        wire.event("response.function_call_arguments.delta",
                   {"type": "response.function_call_arguments.delta", "sequence_number": 2, "item_id": "fc_1",
                    "output_index": 0, "delta": "{\"city\": \"Par"}),
    ],
    "anthropic-messages": [
        stream("anthropic-messages", FULL, "orig")[0],
        wire.event("content_block_start", {"type": "content_block_start", "index": 0,
                                           "content_block": {"type": "tool_use", "id": "toolu_1",
                                                             "name": "get_weather", "input": {}}}),
        wire.event("content_block_delta", {"type": "content_block_delta", "index": 0,
                                           "delta": {"type": "input_json_delta", "partial_json": "{\"city\": \"Par"}}),
    ],
}


@pytest.mark.parametrize("api", list(PATHS))
def test_a_cut_inside_a_tool_call_ends_with_the_clean_error_and_nothing_is_asked(cenv: Env, api: str) -> None:
    frames = TOOL_CALLS[api]
    cenv.provider.script("c-primary", Reply.sse(*frames, RESET))
    mark = cenv.mitm.log_mark()
    body = curl(cenv, api)
    assert body == b"".join(frames) + APIS[api].error_event(
        "switchyard: upstream connection broke after output", "stream_cut")
    assert upstreams(cenv) == ["c-primary"]
    log = cenv.mitm.wait_for_log("switchyard.stream_cut_after_output", mark)
    reason = {"openai-chat": "a tool call", "openai-responses": "function_call", "anthropic-messages": "tool_use"}[api]
    assert "switchyard.not_continued" in log and reason in log


@pytest.mark.parametrize("api", list(PATHS))
def test_without_continue_after_cut_a_cut_is_todays_clean_error(cenv: Env, api: str) -> None:
    cenv.provider.script("c-off", cut_after(api, 3, RESET))
    cenv.provider.script("c-backup", continuation(api))
    mark = cenv.mitm.log_mark()
    body = curl(cenv, api, prefix="c-off")
    sent = b"".join(stream(api, FULL, "orig")[:LIFECYCLE[api] + 3])
    assert body == sent + APIS[api].error_event("switchyard: upstream connection broke after output", "stream_cut")
    assert upstreams(cenv) == ["c-off"]
    log = cenv.mitm.wait_for_log("switchyard.stream_cut_after_output", mark)
    assert "continu" not in log


def test_a_continuation_cut_in_turn_is_finished_from_where_it_got_to(cenv: Env) -> None:
    api = "openai-chat"
    partial = stream(api, REST, "cont")[:3]  # its role chunk and two words, then it breaks too
    cenv.provider.script("c-primary", cut_after(api, 3, RESET), regenerated(api))
    cenv.provider.script("c-backup", Reply.sse(*partial, RESET))
    mark = cenv.mitm.log_mark()
    assert sdk_text(cenv, api) == FULL
    assert upstreams(cenv) == ["c-primary", "c-backup", "c-primary"]
    log = cenv.mitm.wait_for_log("switchyard.continued_after_cut", mark, count=2)
    regenerated_line = [line for line in log.splitlines() if "continued_after_cut" in line][1]
    assert "strategy=regenerate" in regenerated_line
    assert f"chars_sent={len(SENT) + len(''.join(wire.chat_words(REST)[:2]))}" in regenerated_line


# --- a cut right before the end ------------------------------------------------------


def test_a_continuation_that_only_adds_the_end_is_logged_as_one(cenv: Env) -> None:
    """The cut came after the last word: the backup's continuation is only the end
    (a finish reason, usage, `[DONE]`), and that is a continuation like any other."""
    api = "openai-chat"
    whole = stream(api, FULL, "orig")
    cenv.provider.script("c-primary", Reply.sse(*whole[:LIFECYCLE[api] + len(WORDS)], RESET))
    cenv.provider.script("c-backup", Reply.sse(*stream(api, "", "cont")[:1], *stream(api, "", "cont")[2:]))
    mark = cenv.mitm.log_mark()
    body = curl(cenv, api)
    got = events(body)
    assert got.count("[DONE]") == 1
    assert [ch["finish_reason"] for c in got if isinstance(c, dict) for ch in c["choices"] if ch["finish_reason"]] == ["stop"]
    assert b": switchyard continued upstream=c-backup strategy=prefill" in body
    log = cenv.mitm.wait_for_log("switchyard.continued_after_cut", mark)
    assert f"chars_sent={len(FULL)}" in log


def test_a_continuation_that_sent_the_end_and_broke_is_not_followed_by_another_end(cenv: Env) -> None:
    """The backup's continuation sent the finish reason, then broke: the client has
    an ended answer, and a regenerated one must not end it a second time."""
    api = "openai-chat"
    whole = stream(api, FULL, "orig")
    end_only = stream(api, "", "cont")
    cenv.provider.script("c-primary", Reply.sse(*whole[:LIFECYCLE[api] + len(WORDS)], RESET), regenerated(api))
    cenv.provider.script("c-backup", Reply.sse(end_only[0], end_only[2], RESET))  # role, finish; then a reset
    body = curl(cenv, api)
    got = events(body)
    finishes = [ch["finish_reason"] for c in got if isinstance(c, dict) and "choices" in c
                for ch in c["choices"] if ch["finish_reason"]]
    assert finishes == ["stop"]
    assert "[DONE]" not in got
    # what it had is whole text and one end; the stream still ends with the original cut
    assert body.endswith(APIS[api].error_event("switchyard: upstream connection broke after output", "stream_cut"))
    assert upstreams(cenv) == ["c-primary", "c-backup"]  # an ended answer is not regenerated


# --- bounds --------------------------------------------------------------------------


def test_an_answer_longer_than_staging_limit_is_not_continued_and_nothing_is_asked(cenv: Env) -> None:
    api = "openai-chat"
    long_words = [wire.chat_chunk({"content": "word " * 200}, cid="orig") for _ in range(SMALL // 1000 + 1)]
    sent = b"".join([wire.CHAT_ROLE, *long_words])
    assert len(sent) > SMALL
    cenv.provider.script("c-small", Reply.sse(sent, RESET))
    mark = cenv.mitm.log_mark()
    body = curl(cenv, api, prefix="c-small")
    assert body == sent + APIS[api].error_event("switchyard: upstream connection broke after output", "stream_cut")
    assert upstreams(cenv) == ["c-small"]
    log = cenv.mitm.wait_for_log("switchyard.not_continued", mark)
    assert "staging_limit" in log


def test_a_continuation_frame_larger_than_staging_limit_is_not_held_whole(cenv: Env) -> None:
    """A continuation is re-framed frame by frame, so a frame is held whole: one that
    never ends (or is larger than the route's staging_limit) ends the try, not the proxy."""
    api = "openai-chat"
    sent = b"".join(stream(api, FULL, "orig")[:LIFECYCLE[api] + 3])
    endless = [b'data: {"id":"cont","choices":[{"index":0,"delta":{"content":"'] + [b"a" * 65536] * 64
    cenv.provider.script("c-small", Reply.sse(sent, RESET), regenerated(api, "Another answer entirely."))
    cenv.provider.script("c-backup", Reply.sse(stream(api, "", "cont")[0], *endless, b'"}}]}\n\n', RESET))
    mark = cenv.mitm.log_mark()
    body = curl(cenv, api, prefix="c-small")
    assert body == sent + APIS[api].error_event("switchyard: upstream connection broke after output", "stream_cut")
    log = cenv.mitm.wait_for_log("switchyard.stream_cut_after_output", mark)
    failed = [line for line in log.splitlines() if "switchyard.continuation_failed" in line and "c-backup" in line
              and "strategy=prefill" in line]
    assert len(failed) == 1 and "larger than staging_limit" in failed[0]


def test_a_stalled_answer_is_closed_before_it_is_continued(cenv: Env) -> None:
    """Once a stall is called one, the stalled upstream is done with: it must not go on
    generating (and billing) while another upstream finishes the answer."""
    api = "openai-chat"
    slow: list[bytes | float] = []
    for frame in stream(api, REST, "cont"):
        slow += [0.3, frame]  # the continuation takes longer than the stalled one would to wake up
    cenv.provider.script("c-primary", cut_after(api, 3, 1.0))
    cenv.provider.script("c-backup", Reply.sse(*slow))
    assert sdk_text(cenv, api) == FULL
    deadline = time.monotonic() + 10
    while cenv.provider.cancelled + cenv.provider.finished < 2 and time.monotonic() < deadline:
        time.sleep(0.05)
    assert (cenv.provider.cancelled, cenv.provider.finished) == (1, 1)  # the stalled one cancelled, not played out


@pytest.mark.parametrize("api", ["openai-chat", "anthropic-messages"])
def test_a_continuation_to_another_origin_carries_no_client_credentials_and_nothing_of_it_is_logged(
        cenv: Env, api: str) -> None:
    cenv.provider.script("c-primary", cut_after(api, 3, RESET))
    cenv.provider.script("c-backup", continuation(api))
    mark = cenv.mitm.log_mark()
    assert sdk_text(cenv, api) == FULL
    primary, backup = cenv.provider.calls
    assert primary.port != backup.port  # another origin
    assert any(CLIENT_SECRET in value for value in primary.headers.values())
    assert not any(CLIENT_SECRET in value for value in backup.headers.values())
    log = cenv.mitm.wait_for_log("switchyard.continued_after_cut", mark)
    assert CLIENT_SECRET not in log and BODY_MARKER not in log and SENT not in log


# --- the client leaving ---------------------------------------------------------------


def test_a_client_that_leaves_during_a_continuation_cancels_it(cenv: Env) -> None:
    api = "openai-chat"
    slow = []
    for frame in stream(api, REST, "cont"):
        slow += [frame, 0.3]  # under idle_timeout_s: a slow continuation, not a stalled one
    cenv.provider.script("c-primary", cut_after(api, 3, RESET))
    cenv.provider.script("c-backup", Reply.sse(*slow))
    mark = cenv.mitm.log_mark()
    gone = cenv.curl(cenv.provider.url("c-primary", f"/v1/{PATHS[api]}"), request_body(api), max_time=1)
    assert gone.returncode == 28  # curl gave up while the continuation was streaming
    assert b": switchyard continued upstream=c-backup" in gone.body
    cenv.mitm.wait_for_log("switchyard.client_gone", mark)
    deadline = time.monotonic() + 10
    while cenv.provider.cancelled < 1 and time.monotonic() < deadline:
        time.sleep(0.05)
    assert (cenv.provider.cancelled, cenv.provider.finished) == (1, 0)
    assert upstreams(cenv) == ["c-primary", "c-backup"]
    assert events(curl(cenv, api))[-1] == "[DONE]"  # and the proxy is healthy afterwards
