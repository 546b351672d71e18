"""What the decoders and encoders share: data URLs, tool-call arguments, option
names in reasons, turn merging (docs/translation.md, "Requests")."""

from __future__ import annotations

import hashlib
import json
import mimetypes
import re
from dataclasses import replace
from typing import Any, Iterable, Mapping
from urllib.parse import urlsplit

from .ir import Media, Message, OutputFormat, Part, Text, ToolCall, ToolResult, Untranslatable

_DATA_URL = re.compile(r"^data:(?P<type>[\w.+-]+/[\w.+-]+)?(?:;[^,;]*?)*?;base64,(?P<data>.*)$", re.S)
_OPTION = re.compile(r"^[A-Za-z_][A-Za-z0-9_.]{0,63}$")


def parse_data_url(url: str) -> tuple[str, str] | None:
    """`(media_type, base64 data)` of a base64 data URL; None for any other URL."""
    found = _DATA_URL.match(url) if url.startswith("data:") else None
    return (found["type"] or "", found["data"]) if found else None


def data_url(media_type: str, data: str) -> str:
    return f"data:{media_type or 'application/octet-stream'};base64,{data}"


def guess_media_type(url: str, default: str) -> str:
    """The MIME type a URL's file name says, for the APIs that want one with a URL."""
    guessed, _ = mimetypes.guess_type(urlsplit(url).path)
    return guessed or default


def is_web_url(url: str) -> bool:
    return url.startswith(("https://", "http://"))


def option(key: str) -> str:
    """An option's name as a reason may quote it: a client's own name, never content."""
    return f"`{key}`" if _OPTION.match(key) else "an option"


def unknown_options(body: Mapping[str, Any], known: Iterable[str], api: str) -> list[str]:
    """A reason for each top-level option the decoder of `api` does not carry."""
    known = set(known)
    return [f"{option(key)}: an option of {api} with no counterpart in the other APIs"
            for key in body if key not in known]


def arguments_object(call: ToolCall, upstream: str) -> dict[str, Any]:
    """A tool call's arguments as the object Anthropic and Gemini take."""
    try:
        value = json.loads(call.arguments) if call.arguments.strip() else {}
    except ValueError:
        value = None
    if not isinstance(value, dict):
        raise Untranslatable(f"a tool call in the conversation has arguments that are not a JSON object, "
                             f"and {upstream} takes only objects")
    return value


def arguments_text(value: Any) -> str:
    return json.dumps(value if value is not None else {}, ensure_ascii=False, separators=(",", ":"))


def fit_id(call_id: str, *, pattern: re.Pattern[str] | None = None, limit: int | None = None) -> str:
    """A tool-call id the upstream takes: the same id for the call and its result
    (a function of the id alone), unchanged where it already fits."""
    fits = (pattern is None or pattern.fullmatch(call_id)) and (limit is None or len(call_id) <= limit)
    if fits and call_id:
        return call_id
    digest = hashlib.sha256(call_id.encode()).hexdigest()[:24]
    return f"call_{digest}"


def text_of(parts: Iterable[Part]) -> str:
    return "".join(part.text for part in parts if isinstance(part, Text))


def merged_turns(messages: Iterable[Message]) -> list[Message]:
    """Consecutive turns of one role as one, and no empty turns: Anthropic and Gemini
    want the roles to alternate, and a tool call's results together."""
    out: list[Message] = []
    for message in messages:
        if not message.parts:
            continue
        if out and out[-1].role == message.role:
            out[-1] = replace(out[-1], parts=out[-1].parts + message.parts)
        else:
            out.append(message)
    return out


def results_first(parts: tuple[Part, ...]) -> tuple[Part, ...]:
    """A user turn's tool results before the rest of it, as Anthropic wants them."""
    results = tuple(p for p in parts if isinstance(p, ToolResult))
    return results + tuple(p for p in parts if not isinstance(p, ToolResult))


def call_names(messages: Iterable[Message]) -> dict[str, str]:
    """Each tool call's name by its id, to name the results that carry only the id."""
    return {p.id: p.name for m in messages for p in m.parts if isinstance(p, ToolCall)}


def refuse_media(media: Media, upstream: str, why: str) -> Untranslatable:
    what = {"image": "an image", "file": "a file", "audio": "an audio part"}[media.kind]
    return Untranslatable(f"{what} in the conversation cannot be carried to {upstream}: {why}")


def obj(value: Any) -> dict[str, Any]:
    """`value` where it is a JSON object, else an empty one."""
    return value if isinstance(value, dict) else {}


def bool_or_none(value: Any) -> bool | None:
    return value if isinstance(value, bool) else None


def float_or_none(value: Any) -> float | None:
    return float(value) if isinstance(value, (int, float)) and not isinstance(value, bool) else None


def int_or_none(value: Any) -> int | None:
    return value if isinstance(value, int) and not isinstance(value, bool) else None


def stop_list(value: Any) -> tuple[str, ...]:
    if isinstance(value, str):
        return (value,)
    if isinstance(value, list):
        return tuple(s for s in value if isinstance(s, str))
    return ()


def json_output_format(kind: Any, spec: Any) -> OutputFormat | None:
    """OpenAI's structured output, as both its APIs say it: `json_object`, or
    `json_schema` with the schema, its name and strictness in `spec` (Chat nests
    them in `json_schema`, Responses puts them beside the type)."""
    if kind == "json_object":
        return OutputFormat()
    if kind != "json_schema" or not isinstance(spec, dict):
        return None
    schema, strict = spec.get("schema"), spec.get("strict")
    return OutputFormat(schema if isinstance(schema, dict) else None, str(spec.get("name") or ""),
                        strict if isinstance(strict, bool) else None)
