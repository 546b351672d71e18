"""Wire frames in each provider's real shape, as recorded or documented.

Normal answers carry the upstream's name in their text so a test can tell,
byte for byte, whose answer the client got.
"""

from __future__ import annotations

import json
from collections.abc import Sequence
from dataclasses import dataclass
from typing import TYPE_CHECKING

from . import gemini_wire

if TYPE_CHECKING:
    from .fake_provider import Reply


def data(obj: object) -> bytes:
    return b"data: " + json.dumps(obj, separators=(",", ":")).encode() + b"\n\n"


def event(name: str, obj: object) -> bytes:
    return f"event: {name}\n".encode() + data(obj)


# --- OpenAI Chat Completions ------------------------------------------------

def chat_chunk(delta: dict, finish: str | None = None, cid: str = "chatcmpl-1") -> bytes:
    return data(
        {
            "id": cid,
            "object": "chat.completion.chunk",
            "created": 1727346168,
            "model": "gpt-4o-2024-08-06",
            "system_fingerprint": "fp_5050236cbd",
            "choices": [{"index": 0, "delta": delta, "logprobs": None, "finish_reason": finish}],
        }
    )


CHAT_ROLE = chat_chunk({"role": "assistant", "content": "", "refusal": None})
CHAT_DONE = b"data: [DONE]\n\n"


def chat_words(text: str) -> list[str]:
    words = text.split(" ")
    return [w if i == 0 else " " + w for i, w in enumerate(words)]


def chat_stream(text: str, cid: str = "chatcmpl-1", *, usage: tuple[int, int] = (14, 8)) -> list[bytes]:
    """Role frame, one content frame a word, finish frame, usage frame (`usage`: prompt
    and completion tokens), [DONE]."""
    prompt, completion = usage
    frames = [chat_chunk({"role": "assistant", "content": "", "refusal": None}, cid=cid)]
    frames += [chat_chunk({"content": w}, cid=cid) for w in chat_words(text)]
    frames.append(chat_chunk({}, "stop", cid=cid))
    frames.append(
        data({"id": cid, "object": "chat.completion.chunk", "created": 1727346168, "model": "gpt-4o-2024-08-06",
              "choices": [], "usage": {"prompt_tokens": prompt, "completion_tokens": completion,
                                       "total_tokens": prompt + completion}})
    )
    frames.append(CHAT_DONE)
    return frames


def chat_error(code: object, message: str, **extra: object) -> bytes:
    """The in-stream error Switchyard exists for: a 503 inside a 200 stream."""
    return data({"id": "c1", "object": "chat.completion.chunk", "choices": [], "error": {"code": code, "message": message, **extra}})


def chat_completion(text: str) -> dict:
    return {
        "id": "chatcmpl-2",
        "object": "chat.completion",
        "created": 1727346168,
        "model": "gpt-4o-2024-08-06",
        "choices": [{"index": 0, "message": {"role": "assistant", "content": text, "refusal": None}, "finish_reason": "stop", "logprobs": None}],
        "usage": {"prompt_tokens": 5, "completion_tokens": 5, "total_tokens": 10},
    }


# --- OpenAI Responses ------------------------------------------------------

def responses_stream(text: str, rid: str = "resp_1", reasoning: Sequence[Reasoning] = (),
                     item_id: str = "msg_1") -> list[bytes]:
    """A Responses stream; with `reasoning`, a reasoning model's: each reasoning item
    (`added`, its summary parts and text, `done`) before the message, as OpenAI's
    reasoning models stream them (an item with no summary is `added` then `done` only;
    tests/fixtures/responses_reasoning_summary.sse is one recorded)."""
    base = {"id": rid, "object": "response", "created_at": 1761565462, "model": "gpt-4o", "output": []}
    item = {"id": item_id, "type": "message", "status": "in_progress", "content": [], "role": "assistant"}
    frames = [
        event("response.created", {"type": "response.created", "sequence_number": 0, "response": {**base, "status": "in_progress"}}),
        event("response.in_progress", {"type": "response.in_progress", "sequence_number": 1, "response": {**base, "status": "in_progress"}}),
    ]
    seq = 2
    done_reasoning = []
    for index, thought in enumerate(reasoning):
        added = {"id": thought.id, "type": "reasoning", "summary": []}
        frames.append(event("response.output_item.added", {"type": "response.output_item.added", "sequence_number": seq, "output_index": index, "item": added}))
        seq += 1
        for s_index, summary in enumerate(thought.summary):
            common = {"item_id": thought.id, "output_index": index, "summary_index": s_index}
            frames.append(event("response.reasoning_summary_part.added", {"type": "response.reasoning_summary_part.added", "sequence_number": seq, **common, "part": {"type": "summary_text", "text": ""}}))
            seq += 1
            for word in chat_words(summary):
                frames.append(event("response.reasoning_summary_text.delta", {"type": "response.reasoning_summary_text.delta", "sequence_number": seq, **common, "delta": word}))
                seq += 1
            frames.append(event("response.reasoning_summary_text.done", {"type": "response.reasoning_summary_text.done", "sequence_number": seq, **common, "text": summary}))
            frames.append(event("response.reasoning_summary_part.done", {"type": "response.reasoning_summary_part.done", "sequence_number": seq + 1, **common, "part": {"type": "summary_text", "text": summary}}))
            seq += 2
        done = thought.item()
        done_reasoning.append(done)
        frames.append(event("response.output_item.done", {"type": "response.output_item.done", "sequence_number": seq, "output_index": index, "item": done}))
        seq += 1
    at = len(reasoning)
    frames += [
        event("response.output_item.added", {"type": "response.output_item.added", "sequence_number": seq, "output_index": at, "item": item}),
        event("response.content_part.added", {"type": "response.content_part.added", "sequence_number": seq + 1, "item_id": item_id, "output_index": at, "content_index": 0, "part": {"type": "output_text", "annotations": [], "text": ""}}),
    ]
    seq += 2
    for word in chat_words(text):
        frames.append(event("response.output_text.delta", {"type": "response.output_text.delta", "sequence_number": seq, "item_id": item_id, "output_index": at, "content_index": 0, "delta": word, "logprobs": []}))
        seq += 1
    done_item = {**item, "status": "completed", "content": [{"type": "output_text", "annotations": [], "text": text}]}
    if reasoning:  # the text's own done events, as a reasoning model's stream has them
        frames.append(event("response.output_text.done", {"type": "response.output_text.done", "sequence_number": seq, "item_id": item_id, "output_index": at, "content_index": 0, "text": text, "logprobs": []}))
        frames.append(event("response.content_part.done", {"type": "response.content_part.done", "sequence_number": seq + 1, "item_id": item_id, "output_index": at, "content_index": 0, "part": done_item["content"][0]}))
        seq += 2
    frames.append(event("response.output_item.done", {"type": "response.output_item.done", "sequence_number": seq, "output_index": at, "item": done_item}))
    frames.append(event("response.completed", {"type": "response.completed", "sequence_number": seq + 1, "response": {**base, "status": "completed", "output": [*done_reasoning, done_item], "usage": {"input_tokens": 5, "output_tokens": 5, "total_tokens": 10, "input_tokens_details": {"cached_tokens": 0}, "output_tokens_details": {"reasoning_tokens": 0}}}}))
    return frames


@dataclass(frozen=True)
class Reasoning:
    """One reasoning item of a Responses stream: its summary texts, and the
    `encrypted_content` a request with `include: ["reasoning.encrypted_content"]` gets."""

    id: str
    summary: tuple[str, ...] = ()
    encrypted_content: str | None = None

    def item(self) -> dict:
        """The item as its `response.output_item.done` carries it."""
        out: dict = {"id": self.id, "type": "reasoning",
                     "summary": [{"type": "summary_text", "text": text} for text in self.summary]}
        if self.encrypted_content is not None:
            out["encrypted_content"] = self.encrypted_content
        return out


def first_text_frame(frames: list[bytes]) -> int:
    """The index of a stream's first text frame: the frames before it are what a
    client has when the answer is cut before its text."""
    return next(i for i, frame in enumerate(frames) if b'"response.output_text.delta"' in frame)


# --- Anthropic Messages ----------------------------------------------------

def anthropic_stream(text: str, mid: str = "msg_1") -> list[bytes]:
    frames = [
        event("message_start", {"type": "message_start", "message": {"model": "claude-sonnet-4-5", "id": mid, "type": "message", "role": "assistant", "content": [], "stop_reason": None, "stop_sequence": None, "usage": {"input_tokens": 10, "output_tokens": 1}}}),
        event("content_block_start", {"type": "content_block_start", "index": 0, "content_block": {"type": "text", "text": ""}}),
        b'event: ping\ndata: {"type": "ping"}\n\n',
    ]
    for word in chat_words(text):
        frames.append(event("content_block_delta", {"type": "content_block_delta", "index": 0, "delta": {"type": "text_delta", "text": word}}))
    frames.append(event("content_block_stop", {"type": "content_block_stop", "index": 0}))
    frames.append(event("message_delta", {"type": "message_delta", "delta": {"stop_reason": "end_turn", "stop_sequence": None}, "usage": {"output_tokens": 5}}))
    frames.append(event("message_stop", {"type": "message_stop"}))
    return frames


def anthropic_error(err_type: str, message: str) -> bytes:
    return b"event: error\n" + data({"type": "error", "error": {"type": err_type, "message": message}})


# --- a tool call with its arguments streamed in pieces, as each provider answers --------

TOOL_NAME = "get_weather"
TOOL_ARGUMENTS = '{"city": "Paris", "unit": "celsius"}'


def pieces(text: str, size: int = 5) -> list[str]:
    """`text` in pieces of `size` characters, as providers stream a call's arguments."""
    return [text[i:i + size] for i in range(0, len(text), size)] or [""]


def chat_tool_stream(name: str = TOOL_NAME, arguments: str = TOOL_ARGUMENTS, *, call_id: str = "call_JMW1whyEaYG438VE1OIflxA2",
                     cid: str = "chatcmpl-tool1", size: int = 5) -> list[bytes]:
    """provider-sse-shapes §1.3: the role chunk (`content` null), the call's header (id,
    name, empty arguments), its arguments in pieces, `finish_reason` tool_calls, the
    usage chunk, [DONE]."""
    frames = [chat_chunk({"role": "assistant", "content": None}, cid=cid),
              chat_chunk({"tool_calls": [{"index": 0, "id": call_id, "type": "function",
                                          "function": {"name": name, "arguments": ""}}]}, cid=cid)]
    frames += [chat_chunk({"tool_calls": [{"index": 0, "function": {"arguments": piece}}]}, cid=cid)
               for piece in pieces(arguments, size)]
    frames.append(chat_chunk({}, "tool_calls", cid=cid))
    frames.append(data({"id": cid, "object": "chat.completion.chunk", "created": 1727346178, "model": "gpt-4o-2024-08-06",
                        "choices": [], "usage": {"prompt_tokens": 149, "completion_tokens": 60, "total_tokens": 209}}))
    frames.append(CHAT_DONE)
    return frames


def responses_tool_stream(name: str = TOOL_NAME, arguments: str = TOOL_ARGUMENTS, *,
                          call_id: str = "call_DhtkoVLdnlohlERqrxpUjb25", rid: str = "resp_tool1",
                          item_id: str = "fc_tool1", size: int = 5) -> list[bytes]:
    """provider-sse-shapes §2.3: `response.created`, `in_progress`, an empty reasoning item
    (`added`, `done`), the function call item `added` (name, call_id, empty arguments),
    its argument deltas, `function_call_arguments.done`, the item `done`, and
    `response.completed` with the finished items and the usage."""
    base = {"id": rid, "object": "response", "created_at": 1758101358, "model": "gpt-5", "output": [],
            "parallel_tool_calls": True, "tool_choice": "auto", "tools": []}
    reasoning = {"id": "rs_tool1", "type": "reasoning", "summary": []}
    call = {"id": item_id, "type": "function_call", "status": "in_progress", "arguments": "", "call_id": call_id,
            "name": name}
    frames = [
        event("response.created", {"type": "response.created", "sequence_number": 0, "response": {**base, "status": "in_progress"}}),
        event("response.in_progress", {"type": "response.in_progress", "sequence_number": 1, "response": {**base, "status": "in_progress"}}),
        event("response.output_item.added", {"type": "response.output_item.added", "sequence_number": 2, "output_index": 0, "item": reasoning}),
        event("response.output_item.done", {"type": "response.output_item.done", "sequence_number": 3, "output_index": 0, "item": reasoning}),
        event("response.output_item.added", {"type": "response.output_item.added", "sequence_number": 4, "output_index": 1, "item": call}),
    ]
    seq = 5
    for piece in pieces(arguments, size):
        frames.append(event("response.function_call_arguments.delta", {"type": "response.function_call_arguments.delta", "sequence_number": seq,
                                                                        "item_id": item_id, "output_index": 1, "delta": piece}))
        seq += 1
    done = {**call, "status": "completed", "arguments": arguments}
    frames.append(event("response.function_call_arguments.done", {"type": "response.function_call_arguments.done", "sequence_number": seq,
                                                                   "item_id": item_id, "output_index": 1, "name": name, "arguments": arguments}))
    frames.append(event("response.output_item.done", {"type": "response.output_item.done", "sequence_number": seq + 1, "output_index": 1, "item": done}))
    usage = {"input_tokens": 60, "input_tokens_details": {"cached_tokens": 0}, "output_tokens": 24,
             "output_tokens_details": {"reasoning_tokens": 0}, "total_tokens": 84}
    frames.append(event("response.completed", {"type": "response.completed", "sequence_number": seq + 2,
                                               "response": {**base, "status": "completed", "output": [reasoning, done], "usage": usage}}))
    return frames


def anthropic_tool_stream(name: str = TOOL_NAME, arguments: str = TOOL_ARGUMENTS, *,
                          tool_id: str = "toolu_018acGYLtfR52q9yDbWaEdQZ", mid: str = "msg_tool1", size: int = 5) -> list[bytes]:
    """provider-sse-shapes §3.2: `message_start`, the `tool_use` block's start (id, name,
    empty input), a ping, an empty `input_json_delta` first and then the pieces, the
    block's stop, `message_delta` (stop reason tool_use, usage), `message_stop`."""
    frames = [
        event("message_start", {"type": "message_start", "message": {"model": "claude-haiku-4-5-20251001", "id": mid, "type": "message", "role": "assistant",
                                                                     "content": [], "stop_reason": None, "stop_sequence": None,
                                                                     "usage": {"input_tokens": 656, "cache_creation_input_tokens": 0, "cache_read_input_tokens": 0, "output_tokens": 1}}}),
        event("content_block_start", {"type": "content_block_start", "index": 0,
                                      "content_block": {"type": "tool_use", "id": tool_id, "name": name, "input": {}, "caller": {"type": "direct"}}}),
        b'event: ping\ndata: {"type": "ping"}\n\n',
        event("content_block_delta", {"type": "content_block_delta", "index": 0, "delta": {"type": "input_json_delta", "partial_json": ""}}),
    ]
    frames += [event("content_block_delta", {"type": "content_block_delta", "index": 0, "delta": {"type": "input_json_delta", "partial_json": piece}})
               for piece in pieces(arguments, size)]
    frames.append(event("content_block_stop", {"type": "content_block_stop", "index": 0}))
    frames.append(event("message_delta", {"type": "message_delta", "delta": {"stop_reason": "tool_use", "stop_sequence": None},
                                          "usage": {"input_tokens": 656, "cache_creation_input_tokens": 0, "cache_read_input_tokens": 0, "output_tokens": 74}}))
    frames.append(event("message_stop", {"type": "message_stop"}))
    return frames


def tool_frames(api: str, name: str = TOOL_NAME, arguments: str = TOOL_ARGUMENTS) -> list[bytes]:
    """A streamed answer that calls `name` with `arguments` (JSON text), in the shape
    `api`'s provider sends one."""
    if api == GEMINI:
        return gemini_wire.tool_call_stream(name, json.loads(arguments))
    if api == "openai-responses":
        return responses_tool_stream(name, arguments)
    if api == "anthropic-messages":
        return anthropic_tool_stream(name, arguments)
    return chat_tool_stream(name, arguments)


def tool_body(api: str, name: str = TOOL_NAME, arguments: str = TOOL_ARGUMENTS) -> dict:
    """The same answer to a request without `"stream": true`."""
    if api == GEMINI:
        return gemini_wire.tool_call_response(name, json.loads(arguments))
    if api == "openai-responses":
        item = {"id": "fc_tool2", "type": "function_call", "status": "completed", "arguments": arguments,
                "call_id": "call_tool2", "name": name}
        return {"id": "resp_tool2", "object": "response", "created_at": 1758101358, "model": "gpt-5", "status": "completed",
                "output": [item], "parallel_tool_calls": True, "tool_choice": "auto", "tools": [],
                "usage": {"input_tokens": 60, "input_tokens_details": {"cached_tokens": 0}, "output_tokens": 24,
                          "output_tokens_details": {"reasoning_tokens": 0}, "total_tokens": 84}}
    if api == "anthropic-messages":
        return {"id": "msg_tool2", "type": "message", "role": "assistant", "model": "claude-haiku-4-5-20251001",
                "content": [{"type": "tool_use", "id": "toolu_tool2", "name": name, "input": json.loads(arguments)}],
                "stop_reason": "tool_use", "stop_sequence": None, "usage": {"input_tokens": 656, "output_tokens": 74}}
    return {"id": "chatcmpl-tool2", "object": "chat.completion", "created": 1727346178, "model": "gpt-4o-2024-08-06",
            "choices": [{"index": 0, "message": {"role": "assistant", "content": None, "refusal": None,
                                                 "tool_calls": [{"id": "call_tool2", "type": "function",
                                                                 "function": {"name": name, "arguments": arguments}}]},
                         "finish_reason": "tool_calls", "logprobs": None}],
            "usage": {"prompt_tokens": 149, "completion_tokens": 60, "total_tokens": 209}}


def tool_reply(path: str, name: str = TOOL_NAME, arguments: str = TOOL_ARGUMENTS, *, stream: bool = True) -> "Reply":
    """A fake provider's answer to a request on `path` that calls `name`, streamed or whole
    (a Gemini model call says in its path whether it streams)."""
    from .fake_provider import Reply

    api = api_of(path)
    if api == GEMINI:
        stream = gemini_wire.MODEL_CALL.search(path.split("?", 1)[0]).group("method") == "streamGenerateContent"  # type: ignore[union-attr]
    return Reply.sse(*tool_frames(api, name, arguments)) if stream else Reply.json(200, tool_body(api, name, arguments))


# --- failures in each API's own shape, and the side requests --------------------------

OVERLOADED = "Our servers are currently overloaded. Please try again later."


GEMINI = "google-gemini"


def api_of(path: str) -> str:
    """The API a request path names (Chat Completions when it names none)."""
    if gemini_wire.MODEL_CALL.search(path.split("?", 1)[0]):
        return GEMINI
    if path.endswith("/responses"):
        return "openai-responses"
    if path.endswith("/messages"):
        return "anthropic-messages"
    return "openai-chat"


def lifecycle_frames(api: str) -> list[bytes]:
    """What a provider sends before the first output: the role chunk, `response.created`
    and `in_progress`, `message_start` and a ping."""
    if api == "openai-responses":
        return responses_stream("x")[:2]
    if api == "anthropic-messages":
        return [anthropic_stream("x")[0], b'event: ping\ndata: {"type": "ping"}\n\n']
    if api == GEMINI:
        return [gemini_wire.chunk("")]  # an empty text: no answer yet
    return [CHAT_ROLE]


def responses_failed(code: str, message: str, rid: str = "resp_1", seq: int = 2) -> bytes:
    response = {"id": rid, "object": "response", "created_at": 1761565462, "status": "failed", "model": "gpt-4o",
                "error": {"code": code, "message": message}, "usage": None, "output": []}
    return event("response.failed", {"type": "response.failed", "sequence_number": seq, "response": response})


def stream_error(api: str, status: int, message: str) -> bytes:
    """An in-stream error frame as that API's providers send one for `status`."""
    if api == GEMINI:
        return gemini_wire.error_frame(*gemini_wire.status_of(status), message)
    if api == "anthropic-messages":
        return anthropic_error("rate_limit_error" if status == 429 else "overloaded_error", message)
    if api == "openai-responses":
        code = "rate_limit_exceeded" if status == 429 else "server_is_overloaded"
        return event("error", {"type": "error", "sequence_number": 2,
                               "error": {"type": "server_error", "code": code, "message": message, "param": None}})
    return chat_error(status, message)


def error_body(api: str, status: int, message: str) -> dict:
    """The JSON body of an HTTP error answer in that API's shape."""
    if api == GEMINI:
        return gemini_wire.error(*gemini_wire.status_of(status), message)
    if api == "anthropic-messages":
        kind = "rate_limit_error" if status == 429 else "overloaded_error" if status in (503, 529) else "api_error"
        return {"type": "error", "error": {"type": kind, "message": message}}
    code = "rate_limit_exceeded" if status == 429 else "server_is_overloaded" if status == 503 else "server_error"
    return {"error": {"message": message, "type": "server_error" if status != 429 else "requests", "param": None, "code": code}}


def method_not_allowed(api: str, method: str, path: str) -> dict:
    """The JSON body of a 405 for a method the API's path does not take, in its shape."""
    message = f"Invalid method for URL ({method} {path})"
    if api == "anthropic-messages":
        return {"type": "error", "error": {"type": "invalid_request_error", "message": message}}
    return {"error": {"message": message, "type": "invalid_request_error", "param": None, "code": None}}


def models_list(anthropic: bool) -> dict:
    """`GET /v1/models` in the shape of the API the client speaks."""
    if anthropic:
        model = {"type": "model", "id": "claude-sonnet-4-5", "display_name": "Claude Sonnet 4.5",
                 "created_at": "2025-09-29T00:00:00Z"}
        return {"data": [model], "has_more": False, "first_id": model["id"], "last_id": model["id"]}
    return {"object": "list", "data": [{"id": "gpt-4o", "object": "model", "created": 1715367049, "owned_by": "system"}]}


def answer_text(upstream: str, nonce: str | None = None) -> str:
    """The normal answer's text; with a nonce (the request's `metadata.nonce`) it
    also echoes the request, so concurrent clients can tell answers apart."""
    return f"Hello from {upstream}, all good." + (f" {nonce}" if nonce else "")


def normal_frames(path: str, upstream: str, nonce: str | None = None) -> list[bytes]:
    text = answer_text(upstream, nonce)
    if path.endswith("/responses"):
        return responses_stream(text)
    if path.endswith("/messages"):
        return anthropic_stream(text)
    return chat_stream(text)


def normal_body(path: str, upstream: str, nonce: str | None = None) -> dict:
    """The normal answer to a request without `"stream": true`, in the API's shape."""
    text = answer_text(upstream, nonce)
    if path.endswith("/responses"):
        item = {"id": "msg_1", "type": "message", "status": "completed", "role": "assistant",
                "content": [{"type": "output_text", "annotations": [], "text": text}]}
        return {"id": "resp_1", "object": "response", "created_at": 1761565462, "model": "gpt-4o", "status": "completed",
                "output": [item], "usage": {"input_tokens": 5, "output_tokens": 5, "total_tokens": 10}}
    if path.endswith("/messages"):
        return {"id": "msg_1", "type": "message", "role": "assistant", "model": "claude-sonnet-4-5",
                "content": [{"type": "text", "text": text}], "stop_reason": "end_turn", "stop_sequence": None,
                "usage": {"input_tokens": 10, "output_tokens": 5}}
    return chat_completion(text)


def normal_reply(path: str, upstream: str, nonce: str | None = None, *, stream: bool = True,
                 request: bytes = b"") -> "Reply":
    from .fake_provider import Reply

    gemini = gemini_wire.normal_reply(path, answer_text(upstream, nonce), request)
    if gemini is not None:  # a Gemini model call says in its path whether it streams
        return gemini

    if not stream:
        return Reply.json(200, normal_body(path, upstream, nonce))
    return Reply.sse(*normal_frames(path, upstream, nonce))
