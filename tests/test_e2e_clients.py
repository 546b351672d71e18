"""The README's client recipes (section "Clients"), each run as written: the openai and
anthropic Python SDKs, Simon Willison's `llm` and curl, in reverse mode (a base URL at
Switchyard) and in proxy mode (HTTPS_PROXY and mitmproxy's CA), and mitmweb's URL with
its token.  Codex CLI and Claude Code have their own files (test_e2e_codex.py,
test_e2e_claude_code.py).

Each recipe's request meets a first-frame overload on the primary, which Switchyard
retries before any output: the client gets the primary's answer, and the provider
saw two requests where the client made one.
"""

from __future__ import annotations

import subprocess
import sys
import urllib.error
import urllib.request
from pathlib import Path

import pytest

from tests.support import wire
from tests.support.client_bed import ClientBed, bed, client_bed  # noqa: F401  (fixtures)
from tests.support.fake_provider import failing_reply
from tests.support.mitm import free_port

ROOT = Path(__file__).resolve().parents[1]
LLM = Path(sys.executable).with_name("llm")

OPENAI_SNIPPET = """\
from openai import OpenAI

client = OpenAI()  # OPENAI_BASE_URL and OPENAI_API_KEY from the environment
stream = client.chat.completions.create(
    model="gpt-4o", messages=[{"role": "user", "content": "Say hello"}], stream=True)
for chunk in stream:
    if chunk.choices:
        print(chunk.choices[0].delta.content or "", end="", flush=True)
print()
"""

ANTHROPIC_SNIPPET = """\
from anthropic import Anthropic

client = Anthropic()  # ANTHROPIC_BASE_URL and ANTHROPIC_API_KEY from the environment
with client.messages.stream(model="claude-sonnet-4-5", max_tokens=1024,
                            messages=[{"role": "user", "content": "Say hello"}]) as stream:
    for text in stream.text_stream:
        print(text, end="", flush=True)
print()
"""


def test_the_openai_snippet_and_the_curl_body_are_the_readmes() -> None:
    """What the recipe tests run is what the README shows, word for word."""
    readme = (ROOT / "README.md").read_text()
    assert f"```python\n{OPENAI_SNIPPET}```" in readme
    assert f"-d '{CURL_BODY}'" in readme


def proxy_env(bed: ClientBed) -> dict[str, str]:
    return {"HTTPS_PROXY": bed.mitm.proxy_url, "SSL_CERT_FILE": str(bed.ca_file)}


def retried_once(bed: ClientBed, mark: int, route: str, api_path: str) -> None:
    """Switchyard's retry, not the client's: two requests at the primary, one from the client."""
    assert len(bed.api_posts("primary")) == 2 and not bed.api_posts("backup")
    assert bed.client_requests(mark, api_path) == 1
    bed.mitm.wait_for_log(f"switchyard.retry_answered route={route} upstream=primary attempt=2", mark)


def ran(done: subprocess.CompletedProcess[str]) -> str:
    assert done.returncode == 0, done.stdout[-3000:] + done.stderr[-3000:]
    return done.stdout.strip()


@pytest.mark.parametrize("mode", ["reverse", "proxy"])
def test_the_openai_sdk_recipe(bed: ClientBed, mode: str) -> None:
    bed.provider.script("primary", failing_reply("sse_503", "openai-chat"))
    mark = bed.mitm.log_mark()
    env = {"OPENAI_API_KEY": "sk-test"}
    env |= {"OPENAI_BASE_URL": bed.through_switchyard() + "/v1"} if mode == "reverse" else proxy_env(bed)
    assert ran(bed.run([sys.executable, "-c", OPENAI_SNIPPET], env, bed.workdir / f"openai-{mode}")) == (
        wire.answer_text("primary"))
    retried_once(bed, mark, f"{mode}-chat", "/v1/chat/completions")


@pytest.mark.parametrize("mode", ["reverse", "proxy"])
def test_the_anthropic_sdk_recipe(bed: ClientBed, mode: str) -> None:
    bed.provider.script("primary", failing_reply("sse_529", "anthropic-messages"))
    mark = bed.mitm.log_mark()
    env = {"ANTHROPIC_API_KEY": "sk-ant-test"}
    env |= {"ANTHROPIC_BASE_URL": bed.through_switchyard()} if mode == "reverse" else proxy_env(bed)
    assert ran(bed.run([sys.executable, "-c", ANTHROPIC_SNIPPET], env, bed.workdir / f"anthropic-{mode}")) == (
        wire.answer_text("primary"))
    retried_once(bed, mark, f"{mode}-messages", "/v1/messages")


@pytest.mark.parametrize("mode", ["reverse", "proxy"])
def test_the_llm_recipe(bed: ClientBed, mode: str) -> None:
    """`llm` uses the openai SDK on Chat Completions: OPENAI_BASE_URL, or HTTPS_PROXY."""
    bed.provider.script("primary", failing_reply("sse_503", "openai-chat"))
    mark = bed.mitm.log_mark()
    home = bed.workdir / f"llm-{mode}"
    env = {"OPENAI_API_KEY": "sk-test", "LLM_USER_PATH": str(home / "llm")}
    env |= {"OPENAI_BASE_URL": bed.through_switchyard() + "/v1"} if mode == "reverse" else proxy_env(bed)
    assert ran(bed.run([LLM, "-m", "gpt-4o", "Say hello"], env, home)) == wire.answer_text("primary")
    retried_once(bed, mark, f"{mode}-chat", "/v1/chat/completions")


def test_without_switchyard_llm_fails_on_the_same_overload(bed: ClientBed) -> None:
    bed.provider.script("primary", failing_reply("sse_503", "openai-chat"))
    home = bed.workdir / "llm-direct"
    done = bed.run([LLM, "-m", "gpt-4o", "Say hello"],
                   {"OPENAI_API_KEY": "sk-test", "OPENAI_BASE_URL": bed.straight() + "/v1",
                    "LLM_USER_PATH": str(home / "llm")}, home)
    assert done.returncode == 1 and "provider overloaded" in done.stderr
    assert len(bed.api_posts("primary")) == 1


CURL_BODY = '{"model": "gpt-4o", "stream": true, "messages": [{"role": "user", "content": "Say hello"}]}'


@pytest.mark.parametrize("mode", ["reverse", "proxy", "proxy-env"])
def test_the_curl_recipe(bed: ClientBed, mode: str) -> None:
    bed.provider.script("primary", failing_reply("sse_503", "openai-chat"))
    mark = bed.mitm.log_mark()
    args: list[str | Path] = ["curl", "-sS", "-N", "--max-time", "30", "-H", "Authorization: Bearer sk-test",
                              "-H", "Content-Type: application/json", "-d", CURL_BODY]
    env: dict[str, str] = {}
    if mode == "reverse":
        args.append(bed.through_switchyard() + "/v1/chat/completions")
    elif mode == "proxy":
        args += ["--cacert", bed.ca_file, "-x", bed.mitm.proxy_url, "https://api.openai.com/v1/chat/completions"]
    else:  # curl honours HTTPS_PROXY too
        env = {"HTTPS_PROXY": bed.mitm.proxy_url}
        args += ["--cacert", bed.ca_file, "https://api.openai.com/v1/chat/completions"]
    body = ran(bed.run(args, env, bed.workdir / f"curl-{mode}"))
    assert body.encode() + b"\n\n" == b"".join(wire.chat_stream(wire.answer_text("primary")))
    retried_once(bed, mark, f"{'reverse' if mode == 'reverse' else 'proxy'}-chat", "/v1/chat/completions")


# --- mitmweb's address, with its token ----------------------------------------------------


def get_status(url: str) -> int:
    opener = urllib.request.build_opener(urllib.request.ProxyHandler({}))
    try:
        with opener.open(url, timeout=10) as answer:
            return answer.status
    except urllib.error.HTTPError as error:
        return error.code


def run_web(tmp_path: Path, *extra: str) -> tuple[subprocess.Popen[str], int, str]:
    """`scripts/run --web` as the README gives it; returns the process, mitmweb's port and the
    address it printed."""
    web_port = free_port()
    process = subprocess.Popen([str(ROOT / "scripts" / "run"), "--web", "-p", str(free_port()),
                                "--set", f"web_port={web_port}", "--set", "web_open_browser=false",
                                "--set", f"confdir={tmp_path / 'conf'}", *extra],
                               cwd=tmp_path, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True)
    assert process.stdout is not None
    for _ in range(200):  # bounded: mitmweb prints its address within a few lines
        line = process.stdout.readline()
        if "Web server listening at" in line:
            return process, web_port, line.split("listening at", 1)[1].strip()
        if not line and process.poll() is not None:
            break
    process.kill()
    raise AssertionError("mitmweb printed no address")


def stop(process: subprocess.Popen[str]) -> None:
    process.terminate()
    try:
        process.wait(10)
    except subprocess.TimeoutExpired:
        process.kill()
        process.wait(10)


def test_mitmweb_is_opened_with_the_token_it_prints_or_a_password_you_set(tmp_path: Path) -> None:
    process, port, printed = run_web(tmp_path)
    try:
        assert printed.startswith(f"http://127.0.0.1:{port}/?token=")
        assert get_status(printed) == 200
        assert get_status(f"http://127.0.0.1:{port}/") == 403  # "Authentication Required" without it
    finally:
        stop(process)
    process, port, printed = run_web(tmp_path, "--set", "web_password=letmein-42")
    try:
        assert printed == f"http://127.0.0.1:{port}/"  # a password you set is not printed
        assert get_status(f"http://127.0.0.1:{port}/?token=letmein-42") == 200
        assert get_status(f"http://127.0.0.1:{port}/?token=wrong") == 403
    finally:
        stop(process)
