"""What the benchmark's client sends and its upstream answers, built from the test suite's wire shapes.

Both sides import these: the upstream to answer, the clients to know what a whole
answer is (its exact bytes, the marks that say where content starts).
"""

from __future__ import annotations

import json

from tests.support import wire
from tests.support.ws_provider import event

CLIENT_KEY = "sk-bench-client-key"
BACKUP_KEY = "sk-bench-backup-key"


def request_body(prompt_kb: int = 0) -> bytes:
    """The client's request; `prompt_kb` grows it to about that many KiB with earlier
    turns, as an agent's request carries its whole conversation every turn: each an
    assistant's tool call and the tool's result, the shape a proxy reads (many small
    objects, not one long string)."""
    earlier: list[dict[str, object]] = []
    size = 0
    while size < prompt_kb * 1024:
        n = len(earlier) // 2
        call: dict[str, object] = {"role": "assistant", "content": None, "tool_calls": [{
            "id": f"call_{n:05d}", "type": "function",
            "function": {"name": "read_file", "arguments": json.dumps({"path": f"src/module_{n}.py", "limit": 200})}}]}
        result: dict[str, object] = {"role": "tool", "tool_call_id": f"call_{n:05d}",
                  "content": f"def handler_{n}(request):\n    return route(request, table[{n}])\n" * 8}
        earlier += [call, result]
        size += len(json.dumps(call)) + len(json.dumps(result))
    return json.dumps(
        {
            "model": "gpt-4o",
            "stream": True,
            "stream_options": {"include_usage": True},
            "messages": [
                {"role": "system", "content": "You are a helpful assistant."},
                *earlier,
                {"role": "user", "content": "Write a short paragraph about railway switchyards."},
            ],
        }
    ).encode()


REQUEST_BODY = request_body()  # unpadded: what the staging phase's requests are built on

REQUEST_HEADERS = {
    "Content-Type": "application/json",
    "Accept": "text/event-stream",
    "Authorization": f"Bearer {CLIENT_KEY}",
}
CONTENT_MARK = b'"delta":{"content":"'  # a content frame; the role frame has "role" first
ERROR_MARK = b'"error":'
ID_MARK = b'"id":"chatcmpl-bench-'  # followed by the answering upstream's name
DONE = wire.CHAT_DONE
CUT_AFTER = 3  # content frames the /cut/ answer sends before its connection is reset
HOLD_FIELD = "bench_hold_ms"  # in a request body: the staging phase's held answer
STAGING_TOKENS_MAX = 20
STAGING_HOLD_MAX_S = 10.0  # below Switchyard's default pre_answer_keepalive_s, so no keepalive interferes
WS_PATH = "/ws/v1/responses"
FAIL_FRAME = wire.chat_error(503, "provider overloaded")  # the /fail/ answer's first and only frame

WORDS = (
    "A switchyard sorts railway cars onto the right tracks so that each train leaves "
    "with the cars it needs, in the order it needs them, without anyone noticing the work"
).split()
PROMPT_TOKENS = 31


def answer_frames(upstream: str, tokens: int) -> list[bytes]:
    """Role frame, `tokens` content frames (one word each), finish frame, usage frame, [DONE]."""
    text = " ".join(WORDS[i % len(WORDS)] for i in range(tokens))
    return wire.chat_stream(text, f"chatcmpl-bench-{upstream}", usage=(PROMPT_TOKENS, tokens))


def anthropic_answer_frames(upstream: str, tokens: int) -> list[bytes]:
    """The same answer as Anthropic Messages streams it (the translated fallback's backup):
    `message_start`, the text block's start, a ping, `tokens` text deltas, the block's stop,
    `message_delta`, `message_stop`.  Translated for a Chat client, its id is
    `chatcmpl-bench-{upstream}` (ID_MARK)."""
    text = " ".join(WORDS[i % len(WORDS)] for i in range(tokens))
    return wire.anthropic_stream(text, f"msg_bench-{upstream}")


def lifecycle_frames(upstream: str) -> list[bytes]:
    """Chat Completions frames that carry no output (an Azure prompt-filter chunk, two
    chunks with empty deltas): Switchyard holds them, with the role frame, in staging."""
    cid = f"chatcmpl-bench-{upstream}"
    prompt_filter = {"prompt_index": 0, "content_filter_results": {"hate": {"filtered": False, "severity": "safe"}}}
    return [
        wire.data({"id": "", "object": "", "created": 0, "model": "", "choices": [],
                   "prompt_filter_results": [prompt_filter]}),
        wire.chat_chunk({}, cid=cid),
        wire.chat_chunk({"refusal": None}, cid=cid),
    ]


def hold_answer_frames(upstream: str, tokens: int) -> tuple[list[bytes], list[bytes]]:
    """(sent at once: role + lifecycle frames, sent after the hold: content, finish, usage, [DONE])."""
    frames = answer_frames(upstream, tokens)
    return [frames[0], *lifecycle_frames(upstream)], frames[1:]


def ws_turn_messages(rid: str, tokens: int) -> list[str]:
    """One Responses turn over WebSocket: created, `tokens` text deltas, completed."""
    response = {"id": rid, "object": "response", "status": "in_progress", "output": []}
    where = {"item_id": f"msg_{rid}", "output_index": 0, "content_index": 0}
    deltas = [event("response.output_text.delta", sequence_number=i + 1, **where, delta=f"tok{i} ")
              for i in range(tokens)]
    return [event("response.created", sequence_number=0, response=response), *deltas,
            event("response.completed", sequence_number=tokens + 1, response={**response, "status": "completed"})]
