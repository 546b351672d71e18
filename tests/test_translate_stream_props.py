"""Properties of translated streams: however the upstream's bytes are cut into reads,
and whatever the text, the client ends up with exactly the upstream's text, once.

The upstream's text goes out in the pieces drawn (one delta per piece, in that
API's shape); its bytes reach the translator in reads cut anywhere (a CRLF split
too).  The translated bytes must not depend on the cuts, and the client API's
SDK must read back exactly the text that went in: nothing lost, nothing twice.
"""

from __future__ import annotations

import json

from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from switchyard_core.sse import FrameSplitter
from switchyard_core.translate.streams import stream_translator
from tests.support import gemini_wire, wire
from tests.test_translate_stream_sdk import PAIRS, read_with_sdk, validate_frames


def upstream_frames(api: str, pieces: list[str], reasoning: list[str]) -> list[bytes]:
    """A stream of `api` whose text deltas are `pieces`, after reasoning deltas `reasoning`."""
    if api == "openai-chat":
        frames = [wire.chat_chunk({"role": "assistant", "content": None})]
        frames += [wire.chat_chunk({"reasoning_content": r}) for r in reasoning]
        frames += [wire.chat_chunk({"content": p}) for p in pieces]
        return [*frames, wire.chat_chunk({}, "stop"), wire.CHAT_DONE]
    if api == "anthropic-messages":
        start, block, ping = wire.anthropic_stream("x")[:3]
        frames = [start]
        if reasoning:
            frames.append(wire.event("content_block_start", {"type": "content_block_start", "index": 0,
                                                             "content_block": {"type": "thinking", "thinking": "", "signature": ""}}))
            frames += [wire.event("content_block_delta", {"type": "content_block_delta", "index": 0,
                                                          "delta": {"type": "thinking_delta", "thinking": r}}) for r in reasoning]
            frames.append(wire.event("content_block_stop", {"type": "content_block_stop", "index": 0}))
        at = 1 if reasoning else 0
        frames += [block.replace(b'"index":0', b'"index":%d' % at), ping]
        frames += [wire.event("content_block_delta", {"type": "content_block_delta", "index": at,
                                                      "delta": {"type": "text_delta", "text": p}}) for p in pieces]
        return [*frames, *wire.anthropic_stream("x")[-3:]]
    if api == "openai-responses":
        head = wire.responses_stream("x")[:2]
        thought = [wire.event("response.reasoning_summary_text.delta",
                              {"type": "response.reasoning_summary_text.delta", "sequence_number": 2, "item_id": "rs_1",
                               "output_index": 0, "summary_index": 0, "delta": r}) for r in reasoning]
        text = [wire.event("response.output_text.delta",
                           {"type": "response.output_text.delta", "sequence_number": 3, "item_id": "msg_1",
                            "output_index": 1, "content_index": 0, "delta": p, "logprobs": []}) for p in pieces]
        return [*head, *thought, *text, wire.responses_stream("x")[-1]]
    frames = [gemini_wire.frame({"candidates": [{"content": {"parts": [{"text": r, "thought": True}], "role": "model"}, "index": 0}],
                                 "responseId": "r1"}) for r in reasoning]
    frames += [gemini_wire.chunk(p, "r1") for p in pieces]
    return [*frames, gemini_wire.frame({"candidates": [{"content": {"parts": [{"text": ""}], "role": "model"}, "finishReason": "STOP",
                                                        "index": 0}], "usageMetadata": gemini_wire.usage(3), "responseId": "r1"})]


def translated(up: str, client: str, body: bytes, cuts: list[int]) -> bytes:
    translator = stream_translator(up, client, model="m", usage_wanted=True, created=1)
    splitter = FrameSplitter()
    out = []
    start = 0
    for cut in sorted({c % (len(body) + 1) for c in cuts}) + [len(body)]:
        for frame in splitter.feed(body[start:cut]):
            out.append(translator.feed(frame.event))
        start = cut
    for frame in splitter.finish():
        out.append(translator.feed(frame.event))
    return b"".join(out) + translator.finish()


TEXT = st.text(min_size=1, max_size=8)


@settings(max_examples=100, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(pair=st.sampled_from(PAIRS), pieces=st.lists(TEXT, min_size=1, max_size=10),
       reasoning=st.lists(TEXT, max_size=3), cuts=st.lists(st.integers(min_value=0), max_size=12))
def test_any_text_in_any_reads_reaches_the_client_once(pair: tuple[str, str], pieces: list[str], reasoning: list[str],
                                                       cuts: list[int]) -> None:
    up, client = pair
    body = b"".join(upstream_frames(up, pieces, reasoning))
    whole = translated(up, client, body, [])
    assert translated(up, client, body, cuts) == whole
    validate_frames(client, whole)
    assert read_with_sdk(client, whole).text == "".join(pieces)


@settings(max_examples=40, deadline=None)
@given(pair=st.sampled_from([(u, c) for u, c in PAIRS if u != "google-gemini"]),
       arguments=st.dictionaries(st.text(max_size=6), st.one_of(st.text(max_size=10), st.integers(), st.booleans()),
                                 max_size=4),
       size=st.integers(min_value=1, max_value=7), cuts=st.lists(st.integers(min_value=0), max_size=8))
def test_any_arguments_in_any_pieces_reach_the_client_whole(pair: tuple[str, str], arguments: dict[str, object],
                                                            size: int, cuts: list[int]) -> None:
    """A tool call's JSON arguments, streamed in pieces of any size and read in any cuts,
    are the same object at the client (Gemini's come whole: not drawn here)."""
    up, client = pair
    text = json.dumps(arguments, ensure_ascii=False)
    frames = {"openai-chat": wire.chat_tool_stream, "openai-responses": wire.responses_tool_stream,
              "anthropic-messages": wire.anthropic_tool_stream}[up](arguments=text, size=size)
    body = translated(up, client, b"".join(frames), cuts)
    validate_frames(client, body)
    seen = read_with_sdk(client, body)
    assert [(name, args) for name, args, _ in seen.calls] == [(wire.TOOL_NAME, arguments)]


def test_an_emoji_split_across_two_deltas_passes_as_it_came() -> None:
    """A delta may end inside a surrogate pair (`\\ud83d`, then `\\ude00`): no UTF-8 has
    half an emoji, so it goes on escaped, and the client joins the halves as the
    upstream's client would have."""
    frames = [b'data: {"id":"c1","object":"chat.completion.chunk","created":1,"model":"m","choices":[{"index":0,'
              b'"delta":{"content":"%s"},"finish_reason":null}]}\n\n' % half for half in (b"\\ud83d", b"\\ude00")]
    body = b"".join([wire.CHAT_ROLE, *frames, wire.chat_chunk({}, "stop"), wire.CHAT_DONE])
    for client in ("openai-responses", "anthropic-messages", "google-gemini"):
        out = translated("openai-chat", client, body, [])
        assert b"\\ud83d" in out and b"\\ude00" in out
        validate_frames(client, out)
        text = read_with_sdk(client, out).text  # some SDKs join the halves as they decode, some after
        assert text.encode("utf-16", "surrogatepass").decode("utf-16") == "\N{GRINNING FACE}"
