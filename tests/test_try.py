"""`scripts/try`, run as a user runs it: the base URLs it prints work for each client, the
log it shows is what happened, and the ports it opens can be pinned."""

from __future__ import annotations

import json
import os
import re
import signal
import socket
import subprocess
from pathlib import Path

import anthropic
import openai
import pytest
from google import genai
from google.genai import types as genai_types

from tests.support import wire
from tests.test_fake_provider import raw

ROOT = Path(__file__).resolve().parents[1]


def test_try_prints_the_base_url_for_your_client_and_the_log_as_it_comes(tmp_path: Path) -> None:
    process, text = started("--fail", "sse_503:always", "--web", cwd=tmp_path)
    try:
        assert process.stdout is not None
        base = text.split("OpenAI-style clients", 1)[1].split("http://", 1)[1].split()[0]
        assert base.endswith("/primary/v1")
        anthropic_base = text.split("Anthropic-style clients", 1)[1].split("http://", 1)[1].split()[0]
        rules = Path(text.split("Rules: ", 1)[1].split()[0])
        web = text.split("mitmweb: ", 1)[1].split()[0]
        assert "/?token=" in web and raw(web, "GET")[0] == 200
        assert "match: {path: /primary/v1/chat/completions}" in rules.read_text()
        chat = openai.OpenAI(api_key="sk-anything", base_url=f"http://{base}", max_retries=0)
        stream = chat.chat.completions.create(model="gpt-4o", messages=[{"role": "user", "content": "hi"}],
                                              stream=True)
        assert "".join(c.choices[0].delta.content or "" for c in stream if c.choices) == wire.answer_text("backup")
        claude = anthropic.Anthropic(api_key="sk-anything", base_url=f"http://{anthropic_base}", max_retries=0)
        with claude.messages.stream(model="claude-sonnet-4-5", max_tokens=50,
                                    messages=[{"role": "user", "content": "hi"}]) as answer:
            assert "".join(answer.text_stream) == wire.answer_text("backup")
        gemini_base = text.split("Gemini clients", 1)[1].split("http://", 1)[1].split()[0]
        assert gemini_base == anthropic_base
        gemini = genai.Client(api_key="anything", http_options=genai_types.HttpOptions(base_url=f"http://{gemini_base}"))
        streamed = gemini.models.generate_content_stream(model="gemini-2.5-pro", contents="hi")
        assert "".join(chunk.text or "" for chunk in streamed) == wire.answer_text("backup")
        # what to watch: the log lines, printed as they come
        seen: list[str] = []
        while sum("switchyard.fallback_answered" in line for line in seen) < 3:
            line = process.stdout.readline()
            assert line, "scripts/try ended early:\n" + "".join(seen)
            seen.append(line)
        log = "".join(seen)
        assert "switchyard.attempt_failed route=try-chat upstream=primary attempt=1" in log
        # only Switchyard's own events: not mitmproxy's lines that name the addon's file
        assert "Loading script" not in log
        assert all(re.match(r"\[[\d:.]+\] switchyard\.[a-z_]+ ", line) for line in seen if line.strip()), log
        assert [line for line in seen if line.strip()][0].split("] ", 1)[1].startswith("switchyard.rules_loaded path=")
        assert "switchyard.fallback_answered route=try-messages upstream=backup attempt=3" in log
        assert ("switchyard.attempt_failed route=try-gemini upstream=primary attempt=1 phase=staging status=503 "
                "code=UNAVAILABLE") in log
        assert "switchyard.fallback_answered route=try-gemini upstream=backup attempt=3" in log
    finally:
        process.terminate()
        process.wait(20)


def test_try_names_what_went_wrong_without_a_traceback(tmp_path: Path) -> None:
    done = subprocess.run([str(ROOT / "scripts" / "try"), "--fail", "sse_503:x"], cwd=tmp_path, capture_output=True,
                          text=True, timeout=60)
    assert done.returncode == 2
    assert "scripts/try: error: --fail sse_503:x: COUNT is a number or 'always'" in done.stderr  # as typed
    with socket.socket() as taken:  # its port is in use: mitmdump stops at once, and so does try
        taken.bind(("127.0.0.1", 0))
        taken.listen()
        done = subprocess.run([str(ROOT / "scripts" / "try"), "--port", str(taken.getsockname()[1])], cwd=tmp_path,
                              capture_output=True, text=True, timeout=60)
    assert done.returncode == 1
    assert done.stderr.startswith("scripts/try: mitmdump did not start:\n"), done.stderr
    assert "address already in use" in done.stderr and "Traceback" not in done.stderr
    assert "(its log: " in done.stderr


def test_ctrl_c_stops_try_quietly(tmp_path: Path) -> None:
    """A terminal's Ctrl-C reaches the whole process group, mitmdump included: that is
    the way out, not a failure to report ("mitmdump exited (0)")."""
    process, printed = started(cwd=tmp_path, until="switchyard.rules_loaded", own_session=True)
    os.killpg(process.pid, signal.SIGINT)
    rest, _ = process.communicate(timeout=30)
    assert process.returncode == 0, rest
    assert "exited" not in rest and "Traceback" not in rest, rest


def test_try_says_so_and_fails_when_mitmdump_dies_under_it(tmp_path: Path) -> None:
    process, printed = started(cwd=tmp_path, until="switchyard.rules_loaded", own_session=True)
    children = Path(f"/proc/{process.pid}/task/{process.pid}/children").read_text().split()
    mitmdump = [pid for pid in children if "mitm" in Path(f"/proc/{pid}/cmdline").read_text()]
    assert len(mitmdump) == 1, children
    os.kill(int(mitmdump[0]), signal.SIGKILL)
    rest, _ = process.communicate(timeout=30)
    assert process.returncode == 1, rest
    log = printed.split("Log:", 1)[1].split()[0]
    assert f"mitmdump exited (-9); its log: {log}" in rest


def test_codex_over_websocket_at_trys_base_url_gets_the_backups_answer(tmp_path: Path) -> None:
    """docs/clients.md's Codex WebSocket recipe (`-c openai_base_url=...`) at `scripts/try`'s base
    URL: the fake provider speaks no WebSocket, so Switchyard asks it over HTTP, retries and
    falls back there, and Codex's one WebSocket turn gets the backup's answer (before, the
    fake answered the upgrade with a stream: Codex reconnected five times, got 502s, and
    fell back to HTTP by itself)."""
    from tests.support.agents import agent_binary

    codex = agent_binary("codex")
    process, text = started("--fail", "response_failed:always", cwd=tmp_path)
    try:
        base = "http://" + text.split("OpenAI-style clients", 1)[1].split("http://", 1)[1].split()[0]
        log = Path(text.split("Log:", 1)[1].split()[0])
        home = tmp_path / "codex-home"
        home.mkdir()
        env = {k: v for k, v in os.environ.items() if "proxy" not in k.lower() and not k.startswith("OPENAI_")}
        done = subprocess.run([str(codex), "exec", "--skip-git-repo-check", "-c", f"openai_base_url={base}",
                               "Say hello"], env={**env, "CODEX_HOME": str(home), "OPENAI_API_KEY": "sk-test"},
                              cwd=tmp_path, capture_output=True, text=True, timeout=120, stdin=subprocess.DEVNULL)
        assert done.returncode == 0, done.stdout[-3000:] + done.stderr[-3000:]
        assert done.stdout.strip() == wire.answer_text("backup")
        assert "Reconnecting" not in done.stderr and "Falling back" not in done.stderr, done.stderr[-3000:]
        logged = log.read_text()
        assert logged.count("switchyard.websocket_refused route=try-responses") == 2  # the primary, the backup
        assert "status=405" in logged and "decision=fatal" not in logged
        assert "switchyard.fallback_answered route=try-responses upstream=backup attempt=3 transport=websocket" in logged
    finally:
        process.terminate()
        process.wait(20)


def test_the_agent_commands_trys_banner_prints_work_as_printed(tmp_path: Path) -> None:
    """Claude Code and Gemini CLI run with exactly the variables and arguments the banner
    gives (Gemini CLI with the settings it says), from a folder nobody trusted."""
    import shlex

    from tests.support.agents import agent_binary

    agents = {"claude": agent_binary("claude"), "gemini": agent_binary("gemini")}
    process, text = started(cwd=tmp_path)
    try:
        printed = text.splitlines()
        examples = [shlex.split(line.replace("e.g.", "")) for line in printed if "_BASE_URL=" in line]
        commands = {next(word for word in words if word in agents): words for words in examples
                    if any(word in agents for word in words)}
        assert set(commands) == {"claude", "gemini"}, printed
        home = tmp_path / "home"
        (home / ".gemini").mkdir(parents=True)
        for line in printed:  # the settings it says Gemini CLI needs
            if "settings.json" in line:
                (home / ".gemini" / "settings.json").write_text(line.split("with ", 1)[1].rsplit(" in ", 1)[0])
        base_env = {"PATH": os.environ["PATH"], "HOME": str(home), "CLAUDE_CODE_DISABLE_NONESSENTIAL_TRAFFIC": "1",
                    "DISABLE_TELEMETRY": "1"}
        for name, words in commands.items():
            at = words.index(name)
            env = dict(word.split("=", 1) for word in words[:at])
            done = subprocess.run([str(agents[name]), *words[at + 1:]], env={**base_env, **env}, cwd=home,
                                  capture_output=True, text=True, timeout=120, stdin=subprocess.DEVNULL)
            assert done.returncode == 0, (name, done.stdout[-2000:], done.stderr[-2000:])
            assert done.stdout.strip() == wire.answer_text("backup"), name
    finally:
        process.terminate()
        process.wait(20)


def started(*args: str, cwd: Path, until: str = "Ctrl-C to stop",
            own_session: bool = False) -> tuple[subprocess.Popen[str], str]:
    """`scripts/try` with `args`, and what it printed up to the line holding `until`
    (by default: before the log). `own_session`: its own process group, as a terminal's."""
    process = subprocess.Popen([str(ROOT / "scripts" / "try"), *args], cwd=cwd, stdout=subprocess.PIPE,
                               stderr=subprocess.STDOUT, text=True, start_new_session=own_session)
    assert process.stdout is not None
    printed: list[str] = []
    while not any(until in line for line in printed):  # bounded by the reads' end
        line = process.stdout.readline()
        if not line:
            process.wait(20)
            raise AssertionError("scripts/try ended early:\n" + "".join(printed))
        printed.append(line)
    return process, "".join(printed)


def test_every_port_try_opens_can_be_pinned_and_its_proxy_listener_works_as_it_says(tmp_path: Path) -> None:
    import shlex

    from tests.support.mitm import child_env, free_port

    port, proxy, primary, backup, web = (free_port() for _ in range(5))
    process, text = started("--port", str(port), "--proxy-port", str(proxy), "--provider-port", str(primary),
                            "--provider-port", str(backup), "--web-port", str(web), "--web", cwd=tmp_path)
    try:
        assert f"OpenAI-style clients (openai SDK, llm, Codex CLI's provider base_url):  http://127.0.0.1:{port}/primary/v1" in text
        assert f"Switchyard also listens at http://127.0.0.1:{proxy} as an HTTP proxy" in text
        assert f"Without Switchyard (to see what your client does on its own): http://127.0.0.1:{primary}/primary" in text
        assert f"mitmweb: http://127.0.0.1:{web}/?token=" in text
        rules = Path(text.split("Rules: ", 1)[1].split()[0]).read_text()
        assert f"http://127.0.0.1:{backup}/backup/v1/chat/completions" in rules
        # the proxy listener's example, run as printed
        example = text.split("Proxy mode too:", 1)[1].split("\n\n", 1)[0]
        command = example[example.index("curl"):].replace("\\\n", " ")
        done = subprocess.run(shlex.split(command), env=child_env(), capture_output=True, text=True, timeout=60)
        assert done.returncode == 0, done.stderr
        chunks = [json.loads(line[6:]) for line in done.stdout.splitlines() if line.startswith("data: {")]
        answer = "".join(c["choices"][0]["delta"].get("content") or "" for c in chunks if c["choices"])
        assert answer == wire.answer_text("backup")
    finally:
        process.terminate()
        process.wait(20)


@pytest.mark.parametrize("fail, said, not_said, answered_by", [
    ("stall:always", ["decision=next_upstream", "switchyard.fallback_answered upstream=backup"], "decision=retry",
     "backup"),
    ("sse_503:1", ["decision=retry", "switchyard.retry_answered upstream=primary"], "decision=next_upstream",
     "primary"),
    ("http_529:always", ["decision=retry", "decision=next_upstream", "switchyard.fallback_answered upstream=backup"],
     None, "backup"),
])
def test_what_try_says_will_happen_is_what_happens(tmp_path: Path, fail: str, said: list[str],
                                                    not_said: str | None, answered_by: str) -> None:
    process, text = started("--fail", fail, cwd=tmp_path)
    try:
        story = " ".join(text.split("Log:", 1)[1].split("\n", 2)[2].split())  # the paragraph after the paths
        for words in said:
            assert words in story, story
        if not_said:
            assert not_said not in story, story
        base = text.split("OpenAI-style clients", 1)[1].split("http://", 1)[1].split()[0]
        chat = openai.OpenAI(api_key="sk-anything", base_url=f"http://{base}", max_retries=0)
        stream = chat.chat.completions.create(model="gpt-4o", messages=[{"role": "user", "content": "hi"}],
                                              stream=True)
        assert "".join(c.choices[0].delta.content or "" for c in stream if c.choices) == wire.answer_text(answered_by)
        log = Path(text.split("Log:", 1)[1].split()[0]).read_text()
        decisions = re.findall(r"decision=(\w+)", log) + re.findall(r"switchyard\.(\w+_answered) route=try-chat "
                                                                   r"upstream=(\w+)", log)
        for words in said:
            key = words.split("=", 1)[1] if words.startswith("decision=") else None
            if key:
                assert key in decisions, log
            else:
                event, upstream = words.split()[0].removeprefix("switchyard."), words.split("=")[1]
                assert (event, upstream) in decisions, log
        if not_said:
            assert not_said.split("=", 1)[1] not in decisions, log
    finally:
        process.terminate()
        process.wait(20)


def test_the_readmes_try_command_shows_what_the_readme_says(tmp_path: Path) -> None:
    """The README's "Try it" block, run as written: a stall moves on to the backup at once
    (no retry of the primary), as its text and its sample log say."""
    import shlex

    from tests.support.recipes import recipe

    words = shlex.split(recipe("README.md", "try-stall").text)
    assert words[0] == "scripts/try"
    process, text = started(*words[1:], cwd=tmp_path)
    try:
        assert "A timeout moves on at once" in text and "decision=retry" not in text.split("Log:", 1)[1]
        base = text.split("OpenAI-style clients", 1)[1].split("http://", 1)[1].split()[0]
        chat = openai.OpenAI(api_key="sk-anything", base_url=f"http://{base}", max_retries=0)
        stream = chat.chat.completions.create(model="gpt-4o", messages=[{"role": "user", "content": "hi"}],
                                              stream=True)
        assert "".join(c.choices[0].delta.content or "" for c in stream if c.choices) == wire.answer_text("backup")
        log = Path(text.split("Log:", 1)[1].split()[0]).read_text()
        readme = (ROOT / "README.md").read_text()
        for shown in ("switchyard.attempt_failed route=try-chat upstream=primary attempt=1 phase=staging status=504 "
                      "event=timeout decision=next_upstream message=\"no output within 5s\"",
                      "switchyard.fallback_answered route=try-chat upstream=backup attempt=2 first_event=chunk"):
            assert shown in readme and shown in log, shown
        assert "decision=retry" not in log
        assert "a timeout moves on to the backup at once" in " ".join(readme.split())
    finally:
        process.terminate()
        process.wait(20)
