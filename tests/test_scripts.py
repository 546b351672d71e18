"""The README's own tools: `scripts/fake_provider.py` and `scripts/demo`, run as a user runs them."""

from __future__ import annotations

import json
import os
import re
import shutil
import signal
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
from google import genai
from google.genai import types as genai_types

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


def test_the_demo_shows_a_fallback_end_to_end() -> None:
    done = subprocess.run([str(ROOT / "scripts" / "demo")], capture_output=True, timeout=120)
    output = done.stdout.decode()
    assert done.returncode == 0, done.stderr.decode()[-2000:]
    assert "answer text: 'Hello from backup, all good.'" in output
    assert "switchyard.fallback_answered route=demo-chat upstream=backup" in output
    # section 1 involves no Switchyard: what it shows is a provider's own error frame
    direct = output.split("1. Straight to the provider", 1)[1].split("2. Through Switchyard", 1)[0]
    assert "switchyard" not in direct.lower()
    assert '{"id":"c1","object":"chat.completion.chunk","choices":[],"error":{"code":503,' in direct
    # the provider's requests: Switchyard's three, and the direct one named as such
    assert ("requests the provider saw from Switchyard: ['primary', 'primary', 'backup'] "
            "(and 1 straight from the client, in section 1)") in output
    # the rules file its log names is still there to read
    named = output.split("switchyard.rules_loaded path=", 1)[1].split()[0]
    assert Path(named).read_text().startswith("version: 1")
    kept = Path(named).parent
    assert f"kept in {kept}/" in output and (kept / "mitmdump.log").exists()
    shutil.rmtree(kept)


def test_try_prints_the_base_url_for_your_client_and_the_log_as_it_comes(tmp_path: Path) -> None:
    process = subprocess.Popen([str(ROOT / "scripts" / "try"), "--fail", "sse_503:always", "--web"], cwd=tmp_path,
                               stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True)
    try:
        assert process.stdout is not None
        printed: list[str] = []
        while not any("Ctrl-C to stop" in line for line in printed):  # bounded by the reads' end below
            line = process.stdout.readline()
            assert line, "scripts/try ended early:\n" + "".join(printed)
            printed.append(line)
        text = "".join(printed)
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
    process = subprocess.Popen([str(ROOT / "scripts" / "try")], cwd=tmp_path, start_new_session=True,
                               stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True)
    assert process.stdout is not None
    printed: list[str] = []
    while not any("switchyard.rules_loaded" in line for line in printed):  # bounded by the reads' end
        line = process.stdout.readline()
        assert line, "scripts/try ended early:\n" + "".join(printed)
        printed.append(line)
    os.killpg(process.pid, signal.SIGINT)
    rest, _ = process.communicate(timeout=30)
    assert process.returncode == 0, rest
    assert "exited" not in rest and "Traceback" not in rest, rest


def test_try_says_so_and_fails_when_mitmdump_dies_under_it(tmp_path: Path) -> None:
    process = subprocess.Popen([str(ROOT / "scripts" / "try")], cwd=tmp_path, start_new_session=True,
                               stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True)
    assert process.stdout is not None
    printed: list[str] = []
    while not any("switchyard.rules_loaded" in line for line in printed):  # bounded by the reads' end
        line = process.stdout.readline()
        assert line, "scripts/try ended early:\n" + "".join(printed)
        printed.append(line)
    children = Path(f"/proc/{process.pid}/task/{process.pid}/children").read_text().split()
    mitmdump = [pid for pid in children if "mitm" in Path(f"/proc/{pid}/cmdline").read_text()]
    assert len(mitmdump) == 1, children
    os.kill(int(mitmdump[0]), signal.SIGKILL)
    rest, _ = process.communicate(timeout=30)
    assert process.returncode == 1, rest
    log = "".join(printed).split("Log:", 1)[1].split()[0]
    assert f"mitmdump exited (-9); its log: {log}" in rest


def test_codex_over_websocket_at_trys_base_url_gets_the_backups_answer(tmp_path: Path) -> None:
    """The README's Codex WebSocket recipe (`-c openai_base_url=...`) at `scripts/try`'s base
    URL: the fake provider speaks no WebSocket, so Switchyard asks it over HTTP, retries and
    falls back there, and Codex's one WebSocket turn gets the backup's answer (before, the
    fake answered the upgrade with a stream: Codex reconnected five times, got 502s, and
    fell back to HTTP by itself)."""
    from tests.support.agents import agent_binary

    codex = agent_binary("codex")
    process = subprocess.Popen([str(ROOT / "scripts" / "try"), "--fail", "response_failed:always"], cwd=tmp_path,
                               stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True)
    try:
        assert process.stdout is not None
        printed: list[str] = []
        while not any("Ctrl-C to stop" in line for line in printed):  # bounded by the reads' end below
            line = process.stdout.readline()
            assert line, "scripts/try ended early:\n" + "".join(printed)
            printed.append(line)
        text = "".join(printed)
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
    process = subprocess.Popen([str(ROOT / "scripts" / "try")], cwd=tmp_path,
                               stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True)
    try:
        assert process.stdout is not None
        printed: list[str] = []
        while not any("Ctrl-C to stop" in line for line in printed):  # bounded by the reads' end below
            line = process.stdout.readline()
            assert line, "scripts/try ended early:\n" + "".join(printed)
            printed.append(line)
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


# --- the fake provider from a plain shell ---------------------------------------------------


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
    args: list[str] = []
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


def test_the_responses_api_over_websocket_fails_its_first_turns_then_answers(provider_run) -> None:
    http_origins, ws_url = provider_run("--ws", "--ws-fail", "1", lines=2)
    assert ws_url.startswith("ws://127.0.0.1:") and ws_url.endswith("/v1/responses")
    from websockets.sync.client import connect

    with connect(ws_url, open_timeout=10) as ws:
        kinds = []
        for _ in range(2):
            ws.send(json.dumps({"type": "response.create", "model": "gpt-4o", "input": "hi"}))
            turn = []
            while not turn or turn[-1] not in ("response.failed", "response.completed"):
                turn.append(json.loads(ws.recv(timeout=10))["type"])
            kinds.append(turn)
    assert kinds[0] == ["response.created", "error", "response.failed"]
    assert kinds[1][0] == "response.created" and "response.output_text.delta" in kinds[1]
    assert kinds[1][-1] == "response.completed"


# --- finding a Python >= 3.12 on a machine that may have only an older one ----------------


@pytest.fixture
def bare_machine(tmp_path: Path) -> tuple[Path, dict[str, str]]:
    """A copy of the scripts and a PATH holding only bash, dirname and a `python3`
    that is too old: a machine without pyenv or a new enough Python."""
    root = tmp_path / "checkout"
    shutil.copytree(ROOT / "scripts", root / "scripts")
    shutil.copy(ROOT / "pyproject.toml", root / "pyproject.toml")
    bin_dir = tmp_path / "bin"
    bin_dir.mkdir()
    for tool in ("bash", "dirname"):
        found = shutil.which(tool)
        assert found, f"{tool} is needed to run the scripts"
        (bin_dir / tool).symlink_to(found)
    old = bin_dir / "python3"
    old.write_text("#!/bin/sh\necho 'Python 3.11.2'\nexit 1\n")  # fails the version check, as 3.11 does
    old.chmod(0o755)
    return root, {"PATH": str(bin_dir), "HOME": str(tmp_path)}


def real_python() -> str:
    """This interpreter itself (>= 3.12, or the suite would not run), not the venv's wrapper."""
    return os.path.realpath(sys.executable)


def test_with_no_python_new_enough_the_scripts_say_so_and_install_nothing(bare_machine) -> None:
    root, env = bare_machine
    for script in ("find-python", "run", "test"):
        done = subprocess.run([str(root / "scripts" / script)], env=env, capture_output=True, timeout=30)
        assert done.returncode == 1, script
        message = done.stderr.decode()
        assert "no Python >= 3.12 found" in message and "SWITCHYARD_PYTHON" in message, message
        assert "install one" in message
    assert not (root / ".venv").exists()


def test_a_system_python3_13_is_found_beside_an_old_python3(bare_machine) -> None:
    root, env = bare_machine
    (Path(env["PATH"]) / "python3.13").symlink_to(real_python())
    done = subprocess.run([str(root / "scripts" / "find-python")], env=env, capture_output=True, timeout=30)
    assert done.returncode == 0, done.stderr.decode()
    assert done.stdout.decode().strip() == str(Path(env["PATH"]) / "python3.13")


def test_switchyard_python_comes_first(bare_machine) -> None:
    root, env = bare_machine
    (Path(env["PATH"]) / "python3.13").symlink_to(real_python())
    chosen = real_python()
    done = subprocess.run([str(root / "scripts" / "find-python")], env={**env, "SWITCHYARD_PYTHON": chosen},
                          capture_output=True, timeout=30)
    assert done.returncode == 0, done.stderr.decode()
    assert done.stdout.decode().strip() == chosen


def test_the_benchmark_runs_every_path_and_every_stream_arrives_whole(tmp_path: Path) -> None:
    """Not a measurement (no figure is asserted): the README's speed figures come from
    this script, so it must keep working; it checks every stream's bytes itself."""
    raw = tmp_path / "bench.json"
    done = subprocess.run([sys.executable, str(ROOT / "scripts" / "bench.py"), "--quick", "--concurrency", "1", "4",
                           "--burst", "4", "--staging-streams", "40", "--json", str(raw)], capture_output=True, timeout=240)
    assert done.returncode == 0, done.stdout.decode()[-3000:] + done.stderr.decode()[-3000:]
    summary = json.loads(raw.read_text())["summary"]
    for kind in ("happy", "fallback"):
        for c in (1, 4):
            for path in ("direct", "plain", "switchyard"):
                cell = summary[f"{kind}/c{c}/{path}"]
                assert cell["streams"] >= c and cell["failed"] == 0, (kind, c, path, cell["errors"])
    for path in ("direct", "plain", "switchyard"):  # bursts: every stream timed from its burst's start, whole
        cell = summary[f"burst/c4/{path}"]
        assert cell["streams"] >= 4 and cell["failed"] == 0 and cell["ttft"]["n"] == cell["streams"], cell["errors"]
    for c in (1, 4):  # a stream cut after output, continued by the prefill backup, whole
        cell = summary[f"continue/c{c}/switchyard"]
        assert cell["streams"] >= c and cell["failed"] == 0 and cell["cut_gap"]["n"] == cell["streams"], cell["errors"]
    report = done.stdout.decode()
    assert "| 4 | proxy CPU per stream (ms) |" in report
    assert "| time to first content, 4 requests started together, p90 |" in report
    assert "| 1 | continue after cut: cut to first continued content, median (ms) |" in report
    assert "switchyard's peak − before at most 300 MB beyond plain mitmdump's" in report


def _gone(pid: int) -> bool:
    """No such process, or only its exit status left (a zombie nobody has reaped yet)."""
    try:
        state = Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()[0]
    except (FileNotFoundError, ProcessLookupError):
        return True
    return state in ("Z", "X")


def test_a_killed_benchmark_leaves_no_upstream_or_mitmdump_behind() -> None:
    """SIGKILL gives the benchmark no chance to stop its children; the kernel does (they die with it)."""
    bench = subprocess.Popen([sys.executable, str(ROOT / "scripts" / "bench.py"), "--quick", "--staging-streams", "0",
                              "--ws-turns", "0", "--max-lifetime", "120"],
                             stdout=subprocess.DEVNULL, stderr=subprocess.PIPE, stdin=subprocess.DEVNULL)
    pids: list[int] = []
    try:
        assert bench.stderr is not None
        for _ in range(20):  # progress lines, bounded; the pids come in the first few
            line = bench.stderr.readline().decode()
            if "upstream pid" in line:
                pids.append(int(line.split("upstream pid", 1)[1].split()[0]))
            if "switchyard mitmdump pid" in line:
                pids.append(int(line.split("plain mitmdump pid", 1)[1].split()[0]))
                pids.append(int(line.split("switchyard mitmdump pid", 1)[1].split()[0]))
                break
        assert len(pids) == 3, f"the benchmark did not report its upstream and both mitmdumps: {pids}"
        assert not any(_gone(pid) for pid in pids)
        cmdline = Path(f"/proc/{pids[-1]}/cmdline").read_bytes().decode().split("\0")
        rules = next(arg.split("=", 1)[1] for arg in cmdline if arg.startswith("switchyard_rules="))
        workdir = Path(rules).parent  # the killed run cannot remove it itself
    finally:
        bench.kill()
        bench.wait(10)
    deadline = time.monotonic() + 30
    while not all(_gone(pid) for pid in pids) and time.monotonic() < deadline:
        time.sleep(0.1)
    shutil.rmtree(workdir, ignore_errors=True)
    assert [pid for pid in pids if not _gone(pid)] == []
