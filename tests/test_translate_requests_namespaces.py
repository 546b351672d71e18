"""Tools a Responses client declares in an `additional_tools` input item, grouped in
namespaces, as Codex CLI (0.171) sends all of its own: carried to the other APIs as
plain tools (found by tests/test_e2e_translation_codex.py, where an Anthropic backup
got none of Codex's tools)."""

from __future__ import annotations

from typing import Any

import pytest

from switchyard_core.translate.request import translate_request
from tests.test_translate_requests_shapes import sdk_valid

SCHEMA = {"type": "object", "properties": {"duration_ms": {"type": "number"}}, "required": ["duration_ms"],
          "additionalProperties": False}
CODEX_LIKE: dict[str, Any] = {
    "model": "gpt-5", "stream": True,
    "tools": [{"type": "function", "name": "top", "description": "a top-level tool", "parameters": SCHEMA}],
    "input": [
        {"type": "additional_tools", "id": "at_1", "role": "developer", "tools": [
            {"type": "namespace", "name": "functions", "description": "", "tools": [
                {"type": "custom", "name": "exec", "description": "Run code",
                 "format": {"type": "grammar", "syntax": "lark", "definition": "start: /.+/"}},
                {"type": "function", "name": "wait", "description": "Wait", "parameters": SCHEMA, "strict": False}]},
            {"type": "namespace", "name": "clock", "description": "time", "tools": [
                {"type": "function", "name": "sleep", "description": "Sleep", "parameters": SCHEMA, "strict": False},
                {"type": "function", "name": "wait", "description": "another wait", "parameters": SCHEMA}]},
            {"type": "web_search"}]},
        {"type": "message", "role": "user", "content": [{"type": "input_text", "text": "hi"}]}],
}


def names(api: str, body: dict[str, Any]) -> list[str]:
    if api == "openai-chat":
        return [t["function"]["name"] for t in body["tools"]]
    if api == "google-gemini":
        return [d["name"] for t in body["tools"] for d in t["functionDeclarations"]]
    return [t["name"] for t in body["tools"]]


@pytest.mark.parametrize("upstream", ["openai-chat", "anthropic-messages", "google-gemini"])
def test_tools_declared_in_the_input_reach_the_other_apis_flattened(upstream: str) -> None:
    translated = translate_request("openai-responses", upstream, CODEX_LIKE, model="m", stream=True)
    sdk_valid(upstream, translated.body)
    assert names(upstream, translated.body) == ["top", "exec", "wait", "sleep"]
    reasons = " ".join(translated.left_out)
    assert "a second tool named `wait`" in reasons and "`web_search`" in reasons
    assert "additional_tools" not in reasons
