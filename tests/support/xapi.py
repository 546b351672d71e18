"""What the cross-API end-to-end tests share: one mitmdump with a route per ordered pair
(client API, upstream API), and each official SDK asking through it.

Route `{c}-to-{u}` (c, u: `chat`, `responses`, `messages`, `gemini`) takes the
client's requests at `/p-{c}-{u}/…` in the client's API; its `primary` is the
request's own destination (the fake provider's upstream `p-{c}-{u}`, no retry),
its `backup` speaks the other API (`api:`), asks for its own `model:` with its
own `auth`, on the fake provider's second port (upstream `b-{c}-{u}`).  A test
scripts the primary to fail before output, as providers do, and reads what the
SDK assembled and what the backup was asked.
"""

from __future__ import annotations

import json
from dataclasses import dataclass, field
from typing import Any

import anthropic
import openai
from google import genai
from google.genai import types as gtypes

from tests.support import wire
from tests.support.fake_provider import Call, FakeProvider, Reply, failing_reply

CHAT, RESPONSES, ANTHROPIC, GEMINI = "openai-chat", "openai-responses", "anthropic-messages", "google-gemini"
APIS = (CHAT, RESPONSES, ANTHROPIC, GEMINI)
PAIRS = [(client, up) for client in APIS for up in APIS if client != up]
SHORT = {CHAT: "chat", RESPONSES: "responses", ANTHROPIC: "messages", GEMINI: "gemini"}
PATHS = {CHAT: "/v1/chat/completions", RESPONSES: "/v1/responses", ANTHROPIC: "/v1/messages"}
# what each backup asks for: the client's model means nothing there
MODELS = {CHAT: "gpt-4.1-mini", RESPONSES: "gpt-5-mini", ANTHROPIC: "claude-sonnet-4-5", GEMINI: "gemini-2.5-flash-lite"}
AUTH_HEADERS = {CHAT: "Authorization", RESPONSES: "Authorization", ANTHROPIC: "x-api-key", GEMINI: "x-goog-api-key"}
BACKUP_KEY = "sk-xapi-backup-KEY-77aa"
BACKUP_AUTH = {CHAT: f"Bearer {BACKUP_KEY}", RESPONSES: f"Bearer {BACKUP_KEY}", ANTHROPIC: BACKUP_KEY,
               GEMINI: BACKUP_KEY}
AUTH_VALUES = {api: value.replace(BACKUP_KEY, "${SWY_XAPI_BACKUP_KEY}") for api, value in BACKUP_AUTH.items()}
CLIENT_KEYS = {CHAT: "sk-client-chat-SECRET-31", RESPONSES: "sk-client-responses-SECRET-32",
               ANTHROPIC: "sk-ant-client-SECRET-33", GEMINI: "AIzaSy-client-SECRET-34"}
CLIENT_MODELS = {CHAT: "gpt-4o", RESPONSES: "gpt-4o", ANTHROPIC: "claude-opus-4-1", GEMINI: "gemini-2.5-flash"}
# how each provider says it is overloaded before any output
OVERLOAD = {CHAT: "sse_503", RESPONSES: "response_failed", ANTHROPIC: "sse_529", GEMINI: "sse_503"}
# the client API's words for a natural end and for a tool-call answer
STOP_WORDS = {CHAT: ("stop", "tool_calls"), RESPONSES: ("completed", "completed"),
              ANTHROPIC: ("end_turn", "tool_use"), GEMINI: ("STOP", "STOP")}
PROMPT = "Say hello, PRIVATE-PROMPT-xapi-51."
WEATHER_SCHEMA: dict[str, Any] = {
    "type": "object",
    "properties": {"city": {"type": "string", "description": "the city"},
                   "unit": {"type": "string", "enum": ["celsius", "fahrenheit"]}},
    "required": ["city"],
}
TOOL_DESCRIPTION = "The weather in a city now."


def primary(client: str, up: str) -> str:
    return f"p-{SHORT[client]}-{SHORT[up]}"


def backup(client: str, up: str) -> str:
    return f"b-{SHORT[client]}-{SHORT[up]}"


def backup_url(up: str, name: str, port: int) -> str:
    base = f"http://127.0.0.1:{port}/{name}"
    return base if up == GEMINI else base + PATHS[up]  # a Gemini upstream's URL may be a base URL


def route_match(client: str, prefix: str) -> str:
    return f"/{prefix}/v1*/models/*" if client == GEMINI else f"/{prefix}{PATHS[client]}"


def pair_route(client: str, up: str, port: int, *, extra: str = "", backup_extra: str = "") -> str:
    name = f"{SHORT[client]}-to-{SHORT[up]}"
    return (f"  - name: {name}\n    api: {client}\n    match: {{path: \"{route_match(client, primary(client, up))}\"}}\n"
            f"{extra}    upstreams:\n      - {{name: primary, url: original, retries: 0}}\n"
            f"      - name: backup\n        api: {up}\n        url: \"{backup_url(up, backup(client, up), port)}\"\n"
            f"        model: {MODELS[up]}\n        retries: 0\n"
            f"        auth: {{header: {AUTH_HEADERS[up]}, value: \"{AUTH_VALUES[up]}\"}}\n{backup_extra}")


RULES_HEAD = """\
version: 1
defaults:
  max_skip_s: 0           # each test is about one request: no outage memory between them
  unreachable_skip_s: 0
  backoff_ms: 1
  headers_timeout_s: 10
  idle_timeout_s: 5
  pre_answer_keepalive_s: 0
routes:
"""


def pair_rules(port: int) -> str:
    return RULES_HEAD + "".join(pair_route(client, up, port) for client, up in PAIRS)


def fail_primary(provider: FakeProvider, client: str, up: str, *, stream: bool = True) -> None:
    """The primary is overloaded before any output, as its provider says it."""
    kind = OVERLOAD[client] if stream else ("http_529" if client == ANTHROPIC else "http_503")
    provider.script(primary(client, up), failing_reply(kind, client))


# --- the official SDKs, pointed at mitmdump's reverse listener --------------------------------


@dataclass
class Seen:
    """What the client SDK made of the answer."""

    text: str = ""
    calls: list[tuple[str, dict[str, Any], str]] = field(default_factory=list)  # name, arguments, id
    stop: str | None = None
    usage: tuple[int, int] | None = None  # input and output tokens
    argument_pieces: int = 0  # the tool call's arguments, in how many deltas the SDK saw them arrive


def chat_sdk(base: str) -> openai.OpenAI:
    return openai.OpenAI(api_key=CLIENT_KEYS[CHAT], base_url=f"{base}/v1", max_retries=0, timeout=60)


def responses_sdk(base: str) -> openai.OpenAI:
    return openai.OpenAI(api_key=CLIENT_KEYS[RESPONSES], base_url=f"{base}/v1", max_retries=0, timeout=60)


def anthropic_sdk(base: str) -> anthropic.Anthropic:
    return anthropic.Anthropic(api_key=CLIENT_KEYS[ANTHROPIC], base_url=base, max_retries=0, timeout=60)


def gemini_sdk(base: str) -> genai.Client:
    options = gtypes.HttpOptions(base_url=base, timeout=60_000, retry_options=gtypes.HttpRetryOptions(attempts=1))
    return genai.Client(api_key=CLIENT_KEYS[GEMINI], http_options=options)


def tools_for(client: str) -> Any:
    """The get_weather tool, in the client API's own SDK form."""
    if client == CHAT:
        return [{"type": "function", "function": {"name": wire.TOOL_NAME, "description": TOOL_DESCRIPTION,
                                                  "parameters": WEATHER_SCHEMA}}]
    if client == RESPONSES:
        return [{"type": "function", "name": wire.TOOL_NAME, "description": TOOL_DESCRIPTION,
                 "parameters": WEATHER_SCHEMA, "strict": False}]
    if client == ANTHROPIC:
        return [{"name": wire.TOOL_NAME, "description": TOOL_DESCRIPTION, "input_schema": WEATHER_SCHEMA}]
    return [gtypes.Tool(function_declarations=[gtypes.FunctionDeclaration(
        name=wire.TOOL_NAME, description=TOOL_DESCRIPTION, parameters_json_schema=WEATHER_SCHEMA)])]


def stream_with_sdk(client: str, base: str, *, tools: bool = False, prompt: str = PROMPT) -> Seen:
    """One streamed request with the client API's official SDK, read with its own accumulator."""
    seen = Seen()
    if client == CHAT:
        extra: dict[str, Any] = {"tools": tools_for(CHAT)} if tools else {}
        with chat_sdk(base).chat.completions.stream(model=CLIENT_MODELS[CHAT], messages=[{"role": "user", "content": prompt}],
                                                    stream_options={"include_usage": True}, **extra) as stream:
            for event in stream:
                if event.type == "tool_calls.function.arguments.delta" and event.arguments_delta:
                    seen.argument_pieces += 1  # (not the call's header, whose arguments are "")
            final = stream.get_final_completion()
        read_chat(final, seen)
    elif client == RESPONSES:
        extra = {"tools": tools_for(RESPONSES)} if tools else {}
        with responses_sdk(base).responses.stream(model=CLIENT_MODELS[RESPONSES], input=prompt, **extra) as stream:
            for r_event in stream:
                seen.argument_pieces += r_event.type == "response.function_call_arguments.delta"
            response = stream.get_final_response()
        read_responses(response, seen)
    elif client == ANTHROPIC:
        extra = {"tools": tools_for(ANTHROPIC)} if tools else {}
        with anthropic_sdk(base).messages.stream(model=CLIENT_MODELS[ANTHROPIC], max_tokens=1024,
                                                 messages=[{"role": "user", "content": prompt}], **extra) as stream:
            for a_event in stream:
                seen.argument_pieces += a_event.type == "input_json" and a_event.partial_json != ""
            message = stream.get_final_message()
        read_anthropic(message, seen)
    else:
        config = gtypes.GenerateContentConfig(tools=tools_for(GEMINI)) if tools else None
        sdk = gemini_sdk(base)  # held: a client collected mid-stream closes its connection
        for chunk in sdk.models.generate_content_stream(model=CLIENT_MODELS[GEMINI], contents=prompt, config=config):
            read_gemini(chunk, seen)
    return seen


def read_chat(final: Any, seen: Seen) -> None:
    """A Chat Completions answer as the openai SDK accumulated it."""
    choice = final.choices[0]
    seen.text = choice.message.content or ""
    seen.calls = [(call.function.name, json.loads(call.function.arguments), call.id)
                  for call in choice.message.tool_calls or [] if call.type == "function"]
    seen.stop = choice.finish_reason
    if final.usage is not None:
        seen.usage = (final.usage.prompt_tokens, final.usage.completion_tokens)


def read_responses(response: Any, seen: Seen) -> None:
    """A Responses answer as the openai SDK accumulated it."""
    seen.text = response.output_text
    seen.calls = [(item.name, json.loads(item.arguments), item.call_id)
                  for item in response.output if item.type == "function_call"]
    seen.stop = response.status
    if response.usage is not None:
        seen.usage = (response.usage.input_tokens, response.usage.output_tokens)


def read_anthropic(message: Any, seen: Seen) -> None:
    """A Messages answer as the anthropic SDK accumulated it; input tokens as OpenAI counts them."""
    seen.text = "".join(block.text for block in message.content if block.type == "text")
    seen.calls = [(block.name, dict(block.input), block.id) for block in message.content if block.type == "tool_use"]
    seen.stop = message.stop_reason
    usage = message.usage
    seen.usage = (usage.input_tokens + (usage.cache_read_input_tokens or 0)
                  + (usage.cache_creation_input_tokens or 0), usage.output_tokens)


def read_gemini(chunk: gtypes.GenerateContentResponse, seen: Seen) -> None:
    candidate = chunk.candidates[0] if chunk.candidates else None
    if candidate is not None:
        for part in (candidate.content.parts if candidate.content else None) or []:
            if part.function_call is not None:
                seen.calls.append((part.function_call.name or "", dict(part.function_call.args or {}),
                                   part.function_call.id or ""))
            elif part.text and not part.thought:
                seen.text += part.text
        if candidate.finish_reason is not None:
            seen.stop = candidate.finish_reason.value
    meta = chunk.usage_metadata
    if meta is not None and meta.total_token_count:
        seen.usage = (meta.prompt_token_count or 0, (meta.candidates_token_count or 0) + (meta.thoughts_token_count or 0))


def ask_whole_with_sdk(client: str, base: str, *, tools: bool = False) -> Seen:
    """One request without streaming, with the client API's official SDK."""
    seen = Seen()
    if client == CHAT:
        extra: dict[str, Any] = {"tools": tools_for(CHAT)} if tools else {}
        completion = chat_sdk(base).chat.completions.create(
            model=CLIENT_MODELS[CHAT], messages=[{"role": "user", "content": PROMPT}], **extra)
        read_chat(completion, seen)
    elif client == RESPONSES:
        extra = {"tools": tools_for(RESPONSES)} if tools else {}
        read_responses(responses_sdk(base).responses.create(model=CLIENT_MODELS[RESPONSES], input=PROMPT, **extra), seen)
    elif client == ANTHROPIC:
        extra = {"tools": tools_for(ANTHROPIC)} if tools else {}
        message = anthropic_sdk(base).messages.create(model=CLIENT_MODELS[ANTHROPIC], max_tokens=1024,
                                                      messages=[{"role": "user", "content": PROMPT}], **extra)
        seen.text = "".join(block.text for block in message.content if block.type == "text")
        seen.calls = [(block.name, dict(block.input), block.id) for block in message.content
                      if block.type == "tool_use"]
        seen.stop = message.stop_reason
        seen.usage = (message.usage.input_tokens, message.usage.output_tokens)
    else:
        config = gtypes.GenerateContentConfig(tools=tools_for(GEMINI)) if tools else None
        sdk = gemini_sdk(base)  # held: a client collected mid-request closes its connection
        read_gemini(sdk.models.generate_content(model=CLIENT_MODELS[GEMINI], contents=PROMPT, config=config), seen)
    return seen


# --- what the fake backup answers, and what it was asked ---------------------------------------


def backup_path(up: str, name: str, *, stream: bool = True) -> str:
    if up == GEMINI:
        method = "streamGenerateContent" if stream else "generateContent"
        return f"/v1beta/models/{MODELS[GEMINI]}:{method}"
    return PATHS[up]


def tool_answer(up: str, *, stream: bool = True) -> Reply:
    """The backup's answer that calls get_weather, its arguments streamed in pieces."""
    return wire.tool_reply(backup_path(up, "", stream=stream), stream=stream)


def tools_sent(up: str, body: dict[str, Any]) -> list[tuple[str, str | None, Any]]:
    """The tool definitions a request carries, read in its own API: name, description, schema."""
    if up == CHAT:
        return [(t["function"]["name"], t["function"].get("description"), t["function"].get("parameters"))
                for t in body.get("tools", [])]
    if up == RESPONSES:
        return [(t["name"], t.get("description"), t.get("parameters")) for t in body.get("tools", [])]
    if up == ANTHROPIC:
        return [(t["name"], t.get("description"), t.get("input_schema")) for t in body.get("tools", [])]
    return [(d["name"], d.get("description"), d.get("parametersJsonSchema", d.get("parameters")))
            for tool in body.get("tools", []) for d in tool.get("functionDeclarations", [])]


def prompt_sent(up: str, body: dict[str, Any]) -> str:
    """The text of the request's last user turn, read in its own API."""
    if up == GEMINI:
        turn = body["contents"][-1]
        assert turn["role"] == "user"
        return "".join(part.get("text", "") for part in turn["parts"])
    if up == RESPONSES:
        turns = body["input"] if isinstance(body["input"], list) else [{"role": "user", "content": body["input"]}]
    else:
        turns = body["messages"]
    turn = turns[-1]
    assert turn["role"] == "user"
    content = turn["content"]
    if isinstance(content, str):
        return content
    return "".join(part.get("text", "") for part in content)


def credentials_seen(call: Call) -> str:
    """Everything of a request where a credential could travel: its headers and its query."""
    return json.dumps(call.headers) + call.query
