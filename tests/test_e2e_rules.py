"""rules.yaml as a running mitmdump sees it: start-up errors and edits while running."""

from __future__ import annotations

import subprocess
import time
from pathlib import Path

from tests.conftest import CLIENT_SECRET
from tests.support import wire
from tests.support.fake_provider import FakeProvider, Reply
from tests.support.mitm import ADDON, MITMDUMP, Mitmdump, start_mitmdump

GOOD = """\
version: 1
routes:
  - name: chat
    match: {{path: /primary/v1/chat/completions}}
    upstreams:
      - {{name: primary, url: original, retries: 0}}
      - {{name: {backup_name}, url: "http://127.0.0.1:{port}/{backup_name}/v1/chat/completions"}}
"""


def test_broken_rules_stop_start_up_naming_file_line_and_field(tmp_path: Path) -> None:
    rules = tmp_path / "rules.yaml"
    rules.write_text("version: 1\nroutes:\n  - name: chat\n    match: {path: /v1/chat/completions}\n    upstreams:\n      - {name: a, url: original, retries: -1}\n")
    done = subprocess.run(
        [str(MITMDUMP), "-s", str(ADDON), "--listen-host", "127.0.0.1", "-p", "0", "--set", f"switchyard_rules={rules}",
         "--set", f"confdir={tmp_path / 'conf'}"],
        capture_output=True, timeout=60, cwd=tmp_path,
    )
    output = (done.stdout + done.stderr).decode()
    assert done.returncode != 0
    assert f"{rules}:6: routes[0].upstreams[0].retries: Input should be greater than or equal to 0" in output
    assert "Traceback" not in output


def curl_through(proxy_url: str, url: str) -> bytes:
    done = subprocess.run(
        ["curl", "-sS", "-N", "--max-time", "10", "-x", proxy_url, "--noproxy", "", "-H", f"Authorization: Bearer {CLIENT_SECRET}",
         "--data-binary", '{"model":"gpt-4o","stream":true,"messages":[]}', url],
        capture_output=True, timeout=20,
    )
    return done.stdout


def answered_by_after_a_primary_failure(dump: Mitmdump, provider: FakeProvider) -> bytes:
    """The primary fails before output; what the client got through the proxy."""
    provider.script("primary", Reply.sse(wire.chat_error(503, "overloaded")))
    return curl_through(dump.proxy_url, provider.url("primary", "/v1/chat/completions"))


def backup_answer(name: str) -> bytes:
    return b"".join(wire.chat_stream(wire.answer_text(name)))


def edit(path: Path, text: str) -> None:
    time.sleep(1.1)  # a different mtime second for coarse file systems
    path.write_text(text)


def test_editing_rules_while_running_applies_and_a_broken_edit_keeps_the_last_good(tmp_path: Path) -> None:
    provider = FakeProvider().start()
    rules = tmp_path / "rules.yaml"
    rules.write_text(GOOD.format(port=provider.ports[1], backup_name="backup"))
    dump = start_mitmdump(rules, tmp_path / "mitmdump.log")
    try:
        assert answered_by_after_a_primary_failure(dump, provider) == backup_answer("backup")

        mark = dump.log_mark()
        edit(rules, GOOD.format(port=provider.ports[1], backup_name="standby"))
        dump.wait_for_log("switchyard.rules_reloaded", mark)
        assert answered_by_after_a_primary_failure(dump, provider) == backup_answer("standby")

        mark = dump.log_mark()
        edit(rules, "version: 1\nroutes:\n  - name: chat\n    upstreams: nope\n")
        log = dump.wait_for_log("switchyard.rules_invalid", mark)
        assert f"{rules}:4: routes[0].upstreams: Input should be a valid list" in log
        assert "last good rules" in log
        assert answered_by_after_a_primary_failure(dump, provider) == backup_answer("standby")
        assert dump.process.poll() is None
    finally:
        dump.stop()
        provider.stop()


def test_the_script_reloaded_after_an_edit_goes_on_routing(tmp_path: Path) -> None:
    """mitmproxy reloads a script whose file changes, calling its `done` and
    `running` hooks synchronously: Switchyard must come back, not vanish."""
    provider = FakeProvider().start()
    rules = tmp_path / "rules.yaml"
    rules.write_text(GOOD.format(port=provider.ports[1], backup_name="backup"))
    script = tmp_path / "switchyard.py"  # a copy: editing the repo's own would reload every test's mitmdump
    script.write_text(ADDON.read_text())
    dump = start_mitmdump(rules, tmp_path / "mitmdump.log", bare=True,
                          extra_args=["-s", str(script), "--set", f"switchyard_rules={rules}"])
    try:
        assert answered_by_after_a_primary_failure(dump, provider) == backup_answer("backup")

        mark = dump.log_mark()
        edit(script, ADDON.read_text() + "\n# edited\n")
        dump.wait_for_log("switchyard.rules_loaded", mark)
        assert answered_by_after_a_primary_failure(dump, provider) == backup_answer("backup")
        log = dump.log_since(mark)
        assert "Loading script" in log
        assert "cannot be called from sync context" not in log and "Traceback" not in log
        assert dump.process.poll() is None
    finally:
        dump.stop()
        provider.stop()


def test_streams_in_flight_when_the_script_is_reloaded_finish_whole(tmp_path: Path) -> None:
    """A reload of the script (its file changed) makes a new relay for new flows; a
    client mid-answer keeps its stream to the end, and its flow its story."""
    import threading

    from mitmproxy import io

    provider = FakeProvider().start()
    rules = tmp_path / "rules.yaml"
    rules.write_text(GOOD.format(port=provider.ports[1], backup_name="backup"))
    script = tmp_path / "switchyard.py"
    script.write_text(ADDON.read_text())
    saved = tmp_path / "flows"
    dump = start_mitmdump(rules, tmp_path / "mitmdump.log", bare=True,
                          extra_args=["-s", str(script), "--set", f"switchyard_rules={rules}", "-w", str(saved)])
    frames = wire.chat_stream("one two three four five six seven eight")
    try:
        provider.script("primary", Reply.sse(*[piece for frame in frames for piece in (frame, 0.25)]))
        got: list[bytes] = []
        client = threading.Thread(target=lambda: got.append(
            curl_through(dump.proxy_url, provider.url("primary", "/v1/chat/completions"))))
        client.start()
        mark = dump.log_mark()
        edit(script, ADDON.read_text() + "\n# edited\n")  # about a second into a three-second answer
        dump.wait_for_log("switchyard.rules_loaded", mark)
        assert client.is_alive()  # the script was reloaded while the answer was still streaming
        client.join(20)
        assert got == [b"".join(frames)]
        assert answered_by_after_a_primary_failure(dump, provider) == backup_answer("backup")  # the new relay
        assert "Traceback" not in dump.log()
    finally:
        dump.stop()
        provider.stop()
    with saved.open("rb") as file:
        stories = [flow.metadata.get("switchyard", {}) for flow in io.FlowReader(file).stream()]
    assert [(s.get("outcome"), s.get("answered_by")) for s in stories] == [("committed", "primary"),
                                                                          ("committed", "backup")]
