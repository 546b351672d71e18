"""`scripts/fake_provider.py`, run as a user runs it: over HTTP for every API, and over
WebSocket as a provider speaks the Responses API there (the real Codex CLI prints its answer)."""

from __future__ import annotations

import json
import socket
import subprocess
import sys
import time
import urllib.error
import urllib.request
from collections.abc import Iterator
from pathlib import Path

import anthropic
import openai
import pytest

from tests.support import wire

ROOT = Path(__file__).resolve().parents[1]


@pytest.fixture
def fake_provider() -> Iterator[str]:
    """`scripts/fake_provider.py` with the primary's first request failing; yields its first origin."""
    process = subprocess.Popen([sys.executable, str(ROOT / "scripts" / "fake_provider.py"), "--seconds", "60",
                                "--fail", "primary=sse_503:1"], stdout=subprocess.PIPE, stderr=subprocess.DEVNULL)
    try:
        assert process.stdout is not None
        origins = process.stdout.readline().decode().split()
        assert origins, "the fake provider printed no address"
        yield origins[0]
    finally:
        process.terminate()
        process.wait(10)


def post(url: str, body: dict) -> tuple[int, str, str]:
    """Status, content type and text; no proxy from the environment."""
    opener = urllib.request.build_opener(urllib.request.ProxyHandler({}))
    request = urllib.request.Request(url, data=json.dumps(body).encode(), headers={"Content-Type": "application/json"})
    with opener.open(request, timeout=10) as answer:
        return answer.status, answer.headers["Content-Type"], answer.read().decode()


def test_the_fake_provider_fails_on_demand_then_answers_streams_and_whole_answers(fake_provider: str) -> None:
    url = f"{fake_provider}/primary/v1/chat/completions"
    status, _, text = post(url, {"model": "gpt-4o", "stream": True, "messages": []})
    assert status == 200 and json.loads(text.split("data: ", 1)[1])["error"]["code"] == 503  # an error frame in a 200
    status, content_type, text = post(url, {"model": "gpt-4o", "stream": True, "messages": []})
    assert content_type.startswith("text/event-stream") and text.endswith("data: [DONE]\n\n")
    # without "stream": true, the SDKs get a whole answer in their API's shape
    chat = openai.OpenAI(api_key="sk-test", base_url=f"{fake_provider}/primary/v1", max_retries=0)
    completion = chat.chat.completions.create(model="gpt-4o", messages=[{"role": "user", "content": "hi"}])
    assert completion.choices[0].message.content == "Hello from primary, all good."
    response = chat.responses.create(model="gpt-4o", input="hi")
    assert response.output_text == "Hello from primary, all good."
    claude = anthropic.Anthropic(api_key="sk-test", base_url=f"{fake_provider}/primary", max_retries=0)
    message = claude.messages.create(model="claude-sonnet-4-5", max_tokens=50, messages=[{"role": "user", "content": "hi"}])
    assert message.content[0].text == "Hello from primary, all good."  # type: ignore[union-attr]


def plain_shell_env(tmp_path: Path) -> dict[str, str]:
    """What a new user's shell has: the system's PATH and a HOME, no venv, no PYTHONPATH."""
    return {"PATH": "/usr/local/bin:/usr/bin:/bin", "HOME": str(tmp_path)}


def test_the_fake_provider_runs_from_a_plain_shell_on_the_projects_venv(tmp_path: Path) -> None:
    done = subprocess.run([str(ROOT / "scripts" / "fake_provider.py"), "--help"], env=plain_shell_env(tmp_path),
                          cwd=tmp_path, capture_output=True, timeout=120)
    assert done.returncode == 0, done.stderr.decode()[-2000:]
    usage = done.stdout.decode()
    assert usage.startswith("usage: scripts/fake_provider.py")
    for kind in ("lifecycle_error", "lifecycle_stall", "response_failed", "http_529", "--ws"):
        assert kind in usage


@pytest.fixture
def provider_run(tmp_path: Path) -> Iterator[list[str]]:
    """`scripts/fake_provider.py` as a user starts it, with the arguments a test appends;
    yields the lines it printed (its origins, and the WebSocket address with --ws)."""
    processes: list[subprocess.Popen[bytes]] = []

    def start(*extra: str, lines: int = 1) -> list[str]:
        process = subprocess.Popen([str(ROOT / "scripts" / "fake_provider.py"), "--seconds", "60", *extra],
                                   env=plain_shell_env(tmp_path), stdout=subprocess.PIPE, stderr=subprocess.DEVNULL)
        processes.append(process)
        assert process.stdout is not None
        printed = [process.stdout.readline().decode().strip() for _ in range(lines)]
        assert all(printed), "the fake provider printed no address"
        return printed

    yield start  # type: ignore[misc]
    for process in processes:
        process.terminate()
        process.wait(10)


def raw(url: str, method: str = "POST", body: dict | None = None, headers: dict[str, str] | None = None,
        ) -> tuple[int, dict[str, str], bytes]:
    opener = urllib.request.build_opener(urllib.request.ProxyHandler({}))
    data = json.dumps(body).encode() if body is not None else None
    request = urllib.request.Request(url, data=data, method=method,
                                     headers={"Content-Type": "application/json", **(headers or {})})
    try:
        with opener.open(request, timeout=10) as answer:
            return answer.status, dict(answer.headers), answer.read()
    except urllib.error.HTTPError as error:
        return error.code, dict(error.headers), error.read()


STREAM = {"model": "m", "stream": True, "messages": []}


def test_side_requests_get_their_own_shapes_and_never_use_up_a_failure(provider_run) -> None:
    origin = provider_run("--fail", "primary=sse_529:1")[0].split()[0]
    base = f"{origin}/primary"
    # Claude Code's preflight: headers, no body, nothing spent
    status, headers, body = raw(base, "HEAD")
    assert (status, headers.get("Content-Length"), body) == (200, "0", b"")
    claude = anthropic.Anthropic(api_key="sk-test", base_url=base, max_retries=0)
    assert [m.id for m in claude.models.list()] == ["claude-sonnet-4-5"]
    assert claude.messages.count_tokens(model="claude-sonnet-4-5", messages=[{"role": "user", "content": "hi"}]
                                        ).input_tokens == 12
    chat = openai.OpenAI(api_key="sk-test", base_url=f"{base}/v1", max_retries=0)
    assert [m.id for m in chat.models.list()] == ["gpt-4o"]
    # not the method a failure is for: a GET there (a WebSocket upgrade too) is refused, as a provider does
    status, headers, body = raw(f"{base}/v1/messages", "GET")
    assert (status, headers.get("Allow"), json.loads(body)["error"]["type"]) == (405, "POST", "invalid_request_error")
    # the failure is still there for the request it is for, in Anthropic's shape
    status, _, body = raw(f"{base}/v1/messages", body=STREAM)
    assert status == 200 and body == wire.anthropic_error("overloaded_error", "provider overloaded")
    status, _, body = raw(f"{base}/v1/messages", body=STREAM)
    assert body == b"".join(wire.anthropic_stream(wire.answer_text("primary")))


@pytest.mark.parametrize("path", ["/v1/chat/completions", "/v1/responses", "/v1/messages",
                                  "/v1beta/models/gemini-2.5-flash:streamGenerateContent"])
def test_lifecycle_then_error_for_every_api(provider_run, path: str) -> None:
    origin = provider_run("--fail", "primary=lifecycle_error:always")[0].split()[0]
    api = wire.api_of(path)
    for _ in range(2):  # always
        status, _, body = raw(f"{origin}/primary{path}", body=STREAM)
        assert status == 200
        assert body == b"".join([*wire.lifecycle_frames(api), wire.stream_error(api, 503, "provider overloaded")])


@pytest.mark.parametrize("path", ["/v1/chat/completions", "/v1/responses", "/v1/messages"])
def test_lifecycle_then_stall_for_every_api(provider_run, path: str) -> None:
    """The lifecycle frames arrive, then nothing: the read times out, the connection stays open."""
    origin = provider_run("--fail", "primary=lifecycle_stall:1")[0].split()[0]
    port = int(origin.rsplit(":", 1)[1])
    lifecycle = wire.lifecycle_frames(wire.api_of(path))  # each in a chunk of its own
    request = (f"POST /primary{path} HTTP/1.1\r\nHost: x\r\nContent-Type: application/json\r\n"
               f"Content-Length: {len(json.dumps(STREAM))}\r\n\r\n{json.dumps(STREAM)}").encode()
    with socket.create_connection(("127.0.0.1", port), timeout=10) as sock:
        sock.sendall(request)
        got = b""
        while not all(frame in got for frame in lifecycle):
            piece = sock.recv(65536)
            assert piece, f"closed before the lifecycle frames: {got!r}"
            got += piece
        sock.settimeout(0.5)
        with pytest.raises(TimeoutError):
            sock.recv(65536)  # silence after them


def test_responses_failed_is_codex_s_capacity_failure(provider_run) -> None:
    origin = provider_run("--fail", "primary=response_failed:1")[0].split()[0]
    status, _, body = raw(f"{origin}/primary/v1/responses", body=STREAM)
    assert status == 200
    failed = json.loads(body.split(b"event: response.failed\ndata: ", 1)[1])
    assert failed["response"]["error"]["code"] == "server_is_overloaded"


def test_pacing_spaces_the_frames_of_a_normal_answer(provider_run) -> None:
    origin = provider_run("--pace-ms", "40")[0].split()[0]
    started = time.monotonic()
    status, _, body = raw(f"{origin}/primary/v1/chat/completions", body=STREAM)
    frames = wire.chat_stream(wire.answer_text("primary"))
    assert body == b"".join(frames)
    assert time.monotonic() - started >= 0.04 * (len(frames) - 1)  # a lower bound: the pauses were made


def ws_turn(ws, **fields: object) -> list[dict]:  # noqa: ANN001 (a websockets connection)
    """One `response.create` and the messages that answer it, up to its end."""
    ws.send(json.dumps({"type": "response.create", "model": "gpt-4o", "input": "hi", **fields}))
    turn: list[dict] = []
    while not turn or turn[-1]["type"] not in ("response.failed", "response.completed"):
        turn.append(json.loads(ws.recv(timeout=10)))
    return turn


def test_the_responses_api_over_websocket_answers_as_a_provider_and_fails_the_turns_a_user_means(
        provider_run) -> None:
    http_origins, ws_url = provider_run("--ws", "--ws-fail", "1", lines=2)
    assert ws_url.startswith("ws://127.0.0.1:") and ws_url.endswith("/v1/responses")
    from websockets.sync.client import connect

    with connect(ws_url, open_timeout=10) as ws:
        warm_up = ws_turn(ws, generate=False)  # Codex's first message on each connection: no turn a user means
        failed = ws_turn(ws, previous_response_id=warm_up[0]["response"]["id"])
        answered = ws_turn(ws)
    assert [m["type"] for m in warm_up] == ["response.created", "response.completed"]
    assert warm_up[-1]["response"]["output"] == []
    assert [m["type"] for m in failed] == ["response.created", "error", "response.failed"]
    assert [m["type"] for m in answered] == [
        "response.created", "response.output_item.added", "response.content_part.added",
        "response.output_text.delta", "response.output_text.done", "response.content_part.done",
        "response.output_item.done", "response.completed"]
    text = wire.answer_text("websocket")
    assert answered[-2]["item"]["content"][0]["text"] == text
    assert answered[-1]["response"]["output"][0]["content"][0]["text"] == text
    assert answered[-1]["response"]["usage"]["total_tokens"] > 0


def codex(tmp_path: Path, base_url: str) -> subprocess.CompletedProcess[str]:
    """The real Codex CLI's built-in provider (the Responses API over WebSocket) at `base_url`."""
    from tests.support.agents import agent_binary
    from tests.support.mitm import child_env

    home = tmp_path / "codex-home"
    home.mkdir(exist_ok=True)
    env = {k: v for k, v in child_env().items() if not k.startswith("OPENAI_")}
    return subprocess.run([str(agent_binary("codex")), "exec", "--skip-git-repo-check", "-c",
                           f"openai_base_url={base_url}", "Say hello"],
                          env={**env, "CODEX_HOME": str(home), "OPENAI_API_KEY": "sk-test"}, cwd=tmp_path,
                          capture_output=True, text=True, timeout=120, stdin=subprocess.DEVNULL)


def test_codex_pointed_at_the_fake_providers_websocket_prints_its_answer(provider_run, tmp_path: Path) -> None:
    _, ws_url = provider_run("--ws", lines=2)
    done = codex(tmp_path, ws_url.replace("ws://", "http://").removesuffix("/responses"))
    assert done.returncode == 0, done.stdout[-2000:] + done.stderr[-2000:]
    assert done.stdout.strip() == wire.answer_text("websocket")


def test_codex_through_switchyard_gets_the_answer_after_the_turn_it_meant_failed(provider_run,
                                                                                tmp_path: Path) -> None:
    """--ws-fail 1 fails Codex's real turn (not its warm-up): Switchyard sends that turn
    again, and Codex prints the answer."""
    from tests.support.mitm import mitmdump_on

    _, ws_url = provider_run("--ws", "--ws-fail", "1", lines=2)
    origin = ws_url.replace("ws://", "http://").removesuffix("/v1/responses")
    rules = ("version: 1\ndefaults: {backoff_ms: 10}\nroutes:\n  - name: codex\n    match: {path: /v1/responses}\n"
             "    upstreams: [{name: fake, url: original}]\n")
    with mitmdump_on(tmp_path, rules, reverse_target=origin) as dump:
        done = codex(tmp_path, f"{dump.reverse_url}/v1")
        log = dump.log()
    assert done.returncode == 0, done.stdout[-2000:] + done.stderr[-2000:]
    assert done.stdout.strip() == wire.answer_text("websocket")
    assert "switchyard.attempt_failed route=codex upstream=fake attempt=1" in log and "decision=retry" in log
    assert "switchyard.retry_answered route=codex upstream=fake attempt=2 transport=websocket" in log
