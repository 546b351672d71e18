"""The real agents finishing their work on a backup that speaks another API (issue 25),
through a real mitmdump, against loopback fakes only (tests/support/xagents.py):

- Claude Code, whose Anthropic primary is overloaded, does a tool-using task (it reads a
  file in its working directory and answers from it) on an OpenAI Chat backup;
- Gemini CLI, whose Gemini primary is overloaded, gets its answer from an OpenAI backup
  (Chat, and Responses).

Codex's turns on an Anthropic backup: test_e2e_translation_codex.py.
"""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from tests.support import wire
from tests.support.agents import agent_binary
from tests.test_translate_requests_shapes import sdk_valid
from tests.support.xagents import BACKUP_KEY, READ_CALL_ID, OverloadedPrimary, ReadingChatBackup, agent_bed, posts

CLAUDE_KEY = "sk-ant-claude-xagents-key"
SECRET = "KESTREL-4417"

CLAUDE_ROUTES = """\
  - name: claude
    match: {{path: /primary/v1/messages}}
    upstreams:
      - {{name: primary, url: original, retries: 1}}
      - name: gpt
        api: openai-chat
        url: http://127.0.0.1:{p2}/gpt/v1/chat/completions
        model: gpt-5.1
        auth: {{header: Authorization, value: "Bearer ${{SWY_XAGENTS_KEY}}"}}
"""


def test_claude_code_reads_a_file_and_answers_from_it_on_an_openai_chat_backup(tmp_path: Path) -> None:
    home = tmp_path / "claude-home"
    work = home / "project"
    work.mkdir(parents=True)
    note = work / "NOTES.md"
    note.write_text(f"# Notes\n\nThe code word for the launch is {SECRET}.\n")
    provider = ReadingChatBackup(note, SECRET)
    with agent_bed(tmp_path, provider, CLAUDE_ROUTES) as bed:
        mark = bed.mitm.log_mark()
        env = {"ANTHROPIC_API_KEY": CLAUDE_KEY, "ANTHROPIC_BASE_URL": bed.through_switchyard(),
               "CLAUDE_CODE_DISABLE_NONESSENTIAL_TRAFFIC": "1", "DISABLE_TELEMETRY": "1"}
        done = bed.run([agent_binary("claude"), "-p", "What is the code word in NOTES.md? Read the file."], env, home)
        # Claude Code's cwd is `home`: the file is given by its absolute path in the tool call
        assert done.returncode == 0, done.stdout[-3000:] + done.stderr[-3000:]
        assert done.stdout.strip() == provider.answer_text(True)
        gpt = posts(bed, "gpt")
        assert len(gpt) == 2, [c.body[:300] for c in gpt]  # the tool call, then the answer from its result
        first, second = (json.loads(call.body) for call in gpt)
        for call in gpt:
            assert call.headers["Authorization"] == f"Bearer {BACKUP_KEY}"
            assert CLAUDE_KEY not in json.dumps(call.headers) + call.query
        assert first["model"] == second["model"] == "gpt-5.1"
        sdk_valid("openai-chat", first)
        sdk_valid("openai-chat", second)
        read = next(t["function"] for t in first["tools"] if t["function"]["name"] == "Read")
        assert "file_path" in read["parameters"]["properties"]  # Claude Code's own schema, as Chat takes it
        # the second request carries the call and its result, linked by the call's id
        call_turn = next(m for m in second["messages"] if m.get("tool_calls"))
        assert call_turn["tool_calls"][0]["id"] == READ_CALL_ID
        assert json.loads(call_turn["tool_calls"][0]["function"]["arguments"]) == {"file_path": str(note)}
        result = next(m for m in second["messages"] if m.get("role") == "tool")
        assert result["tool_call_id"] == READ_CALL_ID and SECRET in json.dumps(result["content"])
        # each of Claude Code's two requests: the primary twice (overloaded), then the backup
        assert len(posts(bed, "primary")) == 4
        # mitmdump shows each client flow at the upstream that answered it
        assert bed.client_requests(mark, "/gpt/v1/chat/completions") == 2
        log = bed.mitm.wait_for_log("switchyard.fallback_answered route=claude upstream=gpt", mark, count=2)
        assert log.count("decision=retry") == 2


GEMINI_KEY = "AIzaSy-gemini-cli-xagents-key"



def gemini_routes(api: str, path: str) -> str:
    return f"""\
  - name: gemini-cli
    match: {{{{path: "/primary/v1*/models/*"}}}}
    upstreams:
      - {{{{name: primary, url: original, retries: 0}}}}
      - name: openai
        api: {api}
        url: http://127.0.0.1:{{p2}}/openai{path}
        model: gpt-4.1-mini
        auth: {{{{header: Authorization, value: "Bearer ${{{{SWY_XAGENTS_KEY}}}}"}}}}
"""


@pytest.mark.parametrize(("api", "path"), [("openai-chat", "/v1/chat/completions"), ("openai-responses", "/v1/responses")])
def test_gemini_cli_gets_its_answer_from_an_openai_backup(tmp_path: Path, api: str, path: str) -> None:
    provider = OverloadedPrimary("sse_503")
    with agent_bed(tmp_path, provider, gemini_routes(api, path)) as bed:
        home = tmp_path / "gemini-home"
        (home / ".gemini").mkdir(parents=True)
        (home / ".gemini" / "settings.json").write_text(
            json.dumps({"security": {"auth": {"selectedType": "gemini-api-key"}}}))
        mark = bed.mitm.log_mark()
        done = bed.run([agent_binary("gemini"), "-p", "say hello"],
                       {"GEMINI_API_KEY": GEMINI_KEY, "GOOGLE_GEMINI_BASE_URL": bed.through_switchyard(),
                        "GEMINI_CLI_TRUST_WORKSPACE": "true"}, home)
        assert done.returncode == 0, done.stdout[-3000:] + done.stderr[-3000:]
        assert done.stdout.strip() == wire.answer_text("openai")
        # its router's call answered by the primary, its stream overloaded there, then the backup
        asked = [(c.upstream, c.path.rsplit(":", 1)[-1] if ":" in c.path else c.path) for c in bed.provider.calls
                 if c.method == "POST"]
        assert asked == [("primary", "generateContent"), ("primary", "streamGenerateContent"), ("openai", path)]
        [call] = posts(bed, "openai")
        assert call.headers["Authorization"] == f"Bearer {BACKUP_KEY}"
        assert GEMINI_KEY not in json.dumps(call.headers) + call.query
        body = json.loads(call.body)
        assert body["model"] == "gpt-4.1-mini" and body["stream"] is True
        sdk_valid(api, body)  # the OpenAI SDK's own request type takes it
        names = [t["function"]["name"] if api == "openai-chat" else t["name"] for t in body["tools"]]
        assert "read_file" in names  # Gemini CLI's tools, declared in OpenAI's terms
        bed.mitm.wait_for_log("switchyard.fallback_answered route=gemini-cli upstream=openai", mark)
